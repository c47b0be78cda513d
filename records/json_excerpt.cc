#include "records/json_excerpt.h"

#include <vector>

namespace recflow::records {
namespace {

// A scalar or a key as dump() writes it (no recursion: not a container),
// of which at least the first `keep` bytes are wanted.  A longer string is
// written from its first keep + 4 bytes only: escaping never shortens a
// character, so those give dump()'s first `keep` bytes and more, and a
// character they cut (written as U+FFFD) lies past them.
void AppendScalar(const nlohmann::json& v, size_t keep, std::string* out) {
  constexpr auto kReplace = nlohmann::json::error_handler_t::replace;
  if (v.is_string()) {
    const auto& s = v.get_ref<const nlohmann::json::string_t&>();
    if (s.size() > keep + 4) {
      *out +=
          nlohmann::json(s.substr(0, keep + 4)).dump(-1, ' ', false, kReplace);
      return;
    }
  }
  *out += v.dump(-1, ' ', false, kReplace);
}

}  // namespace

std::string JsonExcerpt(const nlohmann::json& value, size_t max_chars) {
  struct Open {
    const nlohmann::json* container;
    nlohmann::json::const_iterator next;
  };
  std::vector<Open> open;
  std::string out;
  const nlohmann::json* v = &value;  // the value to write next, if any
  while (out.size() <= max_chars) {
    if (v != nullptr) {
      if (v->is_structured()) {
        out += v->is_array() ? '[' : '{';
        open.push_back({v, v->cbegin()});
      } else {
        AppendScalar(*v, max_chars + 1 - out.size(), &out);
      }
      v = nullptr;
    }
    if (open.empty()) break;
    Open& top = open.back();
    if (top.next == top.container->cend()) {
      out += top.container->is_array() ? ']' : '}';
      open.pop_back();
      continue;
    }
    if (top.next != top.container->cbegin()) out += ',';
    if (top.container->is_object()) {
      AppendScalar(nlohmann::json(top.next.key()), max_chars + 1 - out.size(),
                   &out);
      out += ':';
    }
    v = &*top.next;
    ++top.next;
  }
  if (out.size() <= max_chars) return out;
  // Cut at `max_chars`, back to the start of a character the cut splits:
  // `out` is UTF-8 (dump()'s replacement makes it so), so the first byte
  // left out is a continuation byte exactly when the cut splits one.
  size_t cut = max_chars;
  while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80) {
    --cut;
  }
  out.resize(cut);
  out += "...";
  return out;
}

}  // namespace recflow::records
