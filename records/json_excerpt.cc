#include "records/json_excerpt.h"

#include <vector>

namespace recflow::records {
namespace {

// A scalar or a key as dump() writes it (no recursion: not a container).
void AppendScalar(const nlohmann::json& v, std::string* out) {
  *out += v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
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
        AppendScalar(*v, &out);
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
      AppendScalar(nlohmann::json(top.next.key()), &out);
      out += ':';
    }
    v = &*top.next;
    ++top.next;
  }
  if (out.size() <= max_chars) return out;
  // Cut at `max_chars`, back to the start of a character the cut splits.
  size_t cut = max_chars;
  size_t lead = cut;
  while (lead > 0 && (static_cast<unsigned char>(out[lead - 1]) & 0xC0) == 0x80)
    --lead;
  if (lead > 0 && static_cast<unsigned char>(out[lead - 1]) >= 0xC0) {
    const unsigned char c = static_cast<unsigned char>(out[lead - 1]);
    const size_t length = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    if (cut - (lead - 1) < length) cut = lead - 1;
  }
  out.resize(cut);
  out += "...";
  return out;
}

}  // namespace recflow::records
