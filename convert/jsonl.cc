#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <string_view>

#include "convert/json_events.h"
#include "convert/ring.h"
#include "convert/sources.h"
#include "records/csv_reader.h"
#include "records/input_stream.h"
#include "records/json_excerpt.h"
#include "records/wire_format.h"

namespace recflow::convert {
namespace {

using records::DType;

// --- JSON Lines ---------------------------------------------------------

// An integer literal past int64 and uint64 (below -2^63 or above
// 2^64 - 1): the JSON parser keeps it as a double, and it would pass for a
// float written as one.  Its text, and the double the parser made of it.
struct BigInteger {
  std::string text;
  double value;
};

// Whether `v` may be one: a double with no fraction, at or past the ends
// of int64 (-2^63 itself is also where -2^63 - 1 rounds to).
bool MayBeBigInteger(const nlohmann::json& v) {
  if (!v.is_number_float()) return false;
  const double d = v.get<double>();
  return (d >= 0x1p63 || d <= -0x1p63) && std::trunc(d) == d;
}

// The big integer literals of one line of JSON, in order (a lexical scan:
// numbers outside strings, without a fraction or an exponent).
std::vector<BigInteger> BigIntegerLiterals(std::string_view line) {
  std::vector<BigInteger> out;
  bool in_string = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
      continue;
    }
    if (c != '-' && (c < '0' || c > '9')) continue;
    size_t end = i + (c == '-' ? 1 : 0);
    const size_t digits_at = end;
    while (end < line.size() && line[end] >= '0' && line[end] <= '9') ++end;
    const bool integer =
        end == line.size() ||
        (line[end] != '.' && line[end] != 'e' && line[end] != 'E');
    const std::string_view digits = line.substr(digits_at, end - digits_at);
    // Past the largest magnitude in range: 2^63 below zero, 2^64 - 1 above.
    const std::string_view limit =
        c == '-' ? "9223372036854775808" : "18446744073709551615";
    if (integer && (digits.size() > limit.size() ||
                    (digits.size() == limit.size() && digits > limit))) {
      std::string text(line.substr(i, end - i));
      out.push_back({text, std::strtod(text.c_str(), nullptr)});
    }
    // Past the rest of the number: a fraction, an exponent.
    while (end < line.size() &&
           std::string_view("0123456789+-.eE").find(line[end]) !=
               std::string_view::npos) {
      ++end;
    }
    i = end - 1;
  }
  return out;
}

// The big integer literal of `line` that `v` was parsed from, if any.
// `literals` is scanned from `line` when first needed.
const BigInteger* BigIntegerOf(
    const nlohmann::json& v, std::string_view line,
    std::optional<std::vector<BigInteger>>* literals) {
  if (!MayBeBigInteger(v)) return nullptr;
  if (!*literals) *literals = BigIntegerLiterals(line);
  for (const BigInteger& b : **literals) {
    if (b.value == v.get<double>()) return &b;
  }
  return nullptr;
}

// The float32 a big integer becomes when it is not that integer.
std::optional<float> BigIntegerRounded(const BigInteger& big) {
  const auto f = static_cast<float>(big.value);
  // Printed in full, a float32 past 2^63 is an integer's exact digits.
  const std::string exact = fmt::format("{:.0f}", static_cast<double>(f));
  if (exact == big.text) return std::nullopt;
  return f;
}

// Each key's type, looked up by a line's keys as they are read.
using KeyTypeMap = std::map<std::string, CellType, std::less<>>;

// The typing pass's reading of one line, through JsonEventReader's events
// (no document is built): each
// top-level key's type, an array's widened over its elements, and the
// integers a float feature would round.  Kept until the line has parsed
// whole: a line that does not is a bad row (the second pass reports it)
// and types nothing.
class LineTypes {
 public:
  struct Member {
    std::string key;
    CellType type = CellType::kNone;
    RoundedRun rounded;  // integers that a float32 would round (no line)
  };

  // Parses `line`; false when it is not one JSON object (nothing typed).
  bool Parse(const std::string& line) {
    used_ = 0;
    depth_ = 0;
    object_ = false;
    return reader_.Read(line, *this) && object_;
  }
  // The last line's members, in order (a key named twice: twice).
  std::span<const Member> members() const { return {members_.data(), used_}; }

  // JsonEventReader's handler.
  bool Null() { return Value(CellType::kNone); }
  bool Bool(bool) { return Value(CellType::kInt64); }
  bool Int(int64_t v) {
    return Value(CellType::kInt64, InexactIntegers::Rounded(v),
                 [v] { return fmt::format("{}", v); });
  }
  bool Uint(uint64_t v) {
    return Value(CellType::kInt64, InexactIntegers::Rounded(v),
                 [v] { return fmt::format("{}", v); });
  }
  bool Double(double v, std::string_view text) {
    // An integer literal read as a double is one past int64 and uint64:
    // an integer, for its key's type (an int64 key refuses it as past
    // int64); a float key rounds it unless float32 holds it exactly.
    if (text.find_first_of(".eE") != std::string_view::npos) {
      return Value(CellType::kFloat);
    }
    return Value(CellType::kInt64, BigIntegerRounded({std::string(text), v}),
                 [text] { return std::string(text); });
  }
  bool String(std::string_view) { return Value(CellType::kBytes); }
  bool StartObject() {
    if (depth_ == 0) {
      object_ = true;
    } else {
      Value(CellType::kNone);  // a value no feature holds
    }
    ++depth_;
    return true;
  }
  bool Key(std::string_view key) {
    if (depth_ == 1 && object_) {
      if (used_ == members_.size()) members_.emplace_back();
      Member& m = members_[used_++];
      m.key.assign(key);
      m.type = CellType::kNone;
      m.rounded.Clear();
      in_array_ = false;
    }
    return true;
  }
  bool EndObject() {
    --depth_;
    return true;
  }
  bool StartArray() {
    if (depth_ == 1) {
      in_array_ = true;
    } else {
      Value(CellType::kNone);  // a list in a list: no feature's value
    }
    ++depth_;
    return true;
  }
  bool EndArray() {
    --depth_;
    return true;
  }

 private:
  static std::string NoText() { return {}; }
  // A value at `depth_`: a member's (depth 1), or an element of a member's
  // array (depth 2); deeper values and those of nested objects are no
  // feature's.
  template <typename Text = std::string (*)()>
  bool Value(CellType type, std::optional<float> rounded = std::nullopt,
             Text text = NoText) {
    if (!object_ || used_ == 0) return true;
    Member& m = members_[used_ - 1];
    if (depth_ == 1) {
      m.type = type;
    } else if (depth_ == 2 && in_array_) {
      m.type = Widen(m.type, type);
    } else {
      return true;
    }
    if (rounded) m.rounded.Note(*rounded, text, 0);
    return true;
  }

  JsonEventReader reader_;
  std::vector<Member> members_;  // [0, used_): this line's
  size_t used_ = 0;
  int depth_ = 0;
  bool object_ = false;    // the line is an object
  bool in_array_ = false;  // the last member's value is an array
};

// The members of `text`, one JSON object, a key named twice counted twice
// (the parsed object holds it once): its commas outside strings and nested
// values, plus one, or 0 for {}.  A scan of the bytes, a small part of the
// parse (a parser callback made the parse about a quarter slower).
size_t MembersOf(std::string_view text) {
  int depth = 0;
  bool in_string = false, any = false;
  size_t commas = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped byte
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        any |= depth == 1;  // a key
        break;
      case '{':
      case '[':
        ++depth;
        break;
      case '}':
      case ']':
        --depth;
        break;
      case ',':
        commas += depth == 1;
        break;
      default:
        break;
    }
  }
  return any ? commas + 1 : 0;
}

// The first top-level key that `text`, a JSON object, names twice ("" if
// none does).
std::string RepeatedKey(const std::string& text) {
  std::set<std::string> seen;
  std::string repeated;
  const auto parse = [&](int depth, nlohmann::json::parse_event_t event,
                         nlohmann::json& parsed) {
    if (depth == 1 && event == nlohmann::json::parse_event_t::key &&
        repeated.empty() && !seen.insert(parsed.get<std::string>()).second) {
      repeated = parsed.get<std::string>();
    }
    return true;
  };
  const nlohmann::json row = nlohmann::json::parse(text, parse);
  return repeated;
}

// The conversion pass's reading of a line, through JsonEventReader's
// events straight into feature values, with no document built.  Only a good
// line reads here: at the first thing that would make the row bad (not JSON,
// not an object, a nested value, a value its key's type cannot hold, an integer
// past int64, a float past float32, a key not UTF-8 or named twice) Parse stops
// and returns false, and Build parses the line into a document to say what is
// wrong.  One per thread: not thread-safe.
class LineValues {
 public:
  // Parses `line`, its keys typed by `types` (a key it lacks: no values),
  // which `types_id` names: no two maps, alive or not, share one.
  bool Parse(const std::string& line, const KeyTypeMap& types,
             uint64_t types_id) {
    if (types_id != types_id_) {  // what the slots know is another map's
      types_ = &types;
      types_id_ = types_id;
      known_slots_ = 0;
      sorted_ = false;
    }
    used_ = 0;
    depth_ = 0;
    ints_.clear();
    floats_.clear();
    strings_used_ = 0;
    if (!reader_.Read(line, *this)) return false;
    // In the order of the keys, as the document's std::map held them (and
    // so the shards' bytes); a key named twice is next to itself there.
    // Lines mostly name the keys the last line did, in its order: then
    // the order and the check are the last line's.
    if (sorted_ && order_.size() == used_) return true;
    order_.resize(used_);
    for (size_t i = 0; i < used_; ++i) order_[i] = &members_[i];
    std::sort(order_.begin(), order_.end(),
              [](const Member* a, const Member* b) { return a->key < b->key; });
    for (size_t i = 1; i < used_; ++i) {
      if (order_[i - 1]->key == order_[i]->key) return false;
    }
    sorted_ = true;
    return true;
  }

  // The features of the line last parsed; a null member is absent.
  void AddTo(records::ExampleBuilder* b) const {
    for (const Member* m : order_) {
      if (!m->present) continue;
      const size_t n = m->end - m->begin;
      switch (m->type) {
        case CellType::kInt64:
          b->AddInt64List(m->key, {ints_.data() + m->begin, n});
          break;
        case CellType::kFloat:
          b->AddFloatList(m->key, {floats_.data() + m->begin, n});
          break;
        case CellType::kBytes:
          b->AddBytesList(m->key, {strings_.data() + m->begin, n});
          break;
        case CellType::kNone:  // [] only: a value would have failed
          break;
      }
    }
  }

  // JsonEventReader's handler.
  bool Null() { return depth_ == 1; }  // absent; in a list: bad
  bool Bool(bool v) {
    switch (Type()) {
      case CellType::kInt64:
        return Push(&ints_, int64_t{v});
      case CellType::kFloat:
        return Push(&floats_, v ? 1.0f : 0.0f);
      default:
        return false;
    }
  }
  bool Int(int64_t v) {
    switch (Type()) {
      case CellType::kInt64:
        return Push(&ints_, v);
      case CellType::kFloat:
        return Push(&floats_, static_cast<float>(v));
      default:
        return false;
    }
  }
  bool Uint(uint64_t v) {
    switch (Type()) {
      case CellType::kInt64:
        return v <= static_cast<uint64_t>(INT64_MAX) &&
               Push(&ints_, static_cast<int64_t>(v));
      case CellType::kFloat:
        return Push(&floats_, static_cast<float>(v));
      default:
        return false;
    }
  }
  bool Double(double v, std::string_view) {
    return Type() == CellType::kFloat && records::FitsFloat32(v) &&
           Push(&floats_, static_cast<float>(v));
  }
  bool String(std::string_view v) {
    if (Type() != CellType::kBytes || !Present()) return false;
    if (strings_used_ == strings_.size()) strings_.emplace_back();
    strings_[strings_used_++].assign(v);
    members_[used_ - 1].end = strings_used_;
    return true;
  }
  bool StartObject() {
    if (depth_ != 0) return false;  // a nested object
    depth_ = 1;
    return true;
  }
  bool Key(std::string_view key) {
    if (used_ == members_.size()) members_.emplace_back();
    Member& m = members_[used_++];
    // A slot keeps the last key read into it, and its type: most lines
    // name the same keys in the same places.
    if (used_ > known_slots_ || m.key != key) {
      m.key.assign(key);
      const auto known = types_->find(key);
      m.type = known == types_->end() ? CellType::kNone : known->second;
      known_slots_ = std::max(known_slots_, used_);
      sorted_ = false;
    }
    m.present = false;
    m.begin = m.end = m.type == CellType::kInt64   ? ints_.size()
                      : m.type == CellType::kFloat ? floats_.size()
                                                   : strings_used_;
    return true;
  }
  bool EndObject() {
    depth_ = 0;
    return true;
  }
  bool StartArray() {
    if (depth_ != 1 || !Present()) return false;  // a list in a list
    depth_ = 2;
    return true;
  }
  bool EndArray() {
    depth_ = 1;
    return true;
  }

 private:
  struct Member {
    std::string key;
    CellType type = CellType::kNone;
    bool present = false;       // its value is not null
    size_t begin = 0, end = 0;  // its values, in the vector of its type
  };
  // The type of the member a value belongs to; at the top (a line that is
  // no object), kNone: no value fits.
  CellType Type() const {
    return depth_ == 0 ? CellType::kNone : members_[used_ - 1].type;
  }
  // Marks the member present; false when its key is not UTF-8.
  bool Present() {
    Member& m = members_[used_ - 1];
    if (!m.present && !records::wire::IsValidUtf8(m.key)) return false;
    m.present = true;
    return true;
  }
  template <typename T>
  bool Push(std::vector<T>* values, T v) {
    if (!Present()) return false;
    values->push_back(v);
    members_[used_ - 1].end = values->size();
    return true;
  }

  JsonEventReader reader_;
  const KeyTypeMap* types_ = nullptr;
  uint64_t types_id_ = 0;        // none is 0
  std::vector<Member> members_;  // [0, used_): this line's
  size_t used_ = 0;
  // members_[0, known_slots_) hold a key of types_ and its type.
  size_t known_slots_ = 0;
  // order_ is members_[0, order_.size()) sorted by key, and their keys
  // differ (until a slot takes another key).
  bool sorted_ = false;
  int depth_ = 0;  // 1: in the object; 2: in a member's list
  std::vector<const Member*> order_;
  std::vector<int64_t> ints_;
  std::vector<float> floats_;
  std::vector<std::string> strings_;  // [0, strings_used_): this line's
  size_t strings_used_ = 0;
};

// The types one chunk of lines gives a key, kept so that chunks merged in
// input order type it as the lines one by one would: the first value that
// is not null or [] says string or number, and numbers widen int64 ->
// float (strings and numbers under one key are an error, in the second
// pass, for the rows that disagree with the first).
class KeyTypes {
 public:
  // A line's value of the key, in line order.
  void Add(CellType t) {
    if (first_ == CellType::kNone ||
        (first_ != CellType::kBytes && t != CellType::kBytes)) {
      first_ = Widen(first_, t);
    }
    if (t != CellType::kBytes) numbers_ = Widen(numbers_, t);
  }
  // Into `known`, the type of the lines before this chunk's.
  void MergeInto(CellType& known) const {
    if (known == CellType::kNone) {
      known = first_;
    } else if (known != CellType::kBytes) {
      known = Widen(known, numbers_);
    }
  }

 private:
  CellType first_ = CellType::kNone;    // as the chunk alone types it
  CellType numbers_ = CellType::kNone;  // the widest number in the chunk
};

// Lines of one file in the typing pass, and what typing them found.
struct TypingChunk {
  // [0, used): the chunk's lines (none blank) and their line numbers.
  std::vector<std::string> lines;
  std::vector<uint64_t> line_numbers;
  size_t used = 0;
  size_t file = 0;          // files_[file]
  uint64_t bytes_read = 0;  // of all files, once these lines were read
  std::map<std::string, KeyTypes, std::less<>> keys;
  // Integers a float32 would round, a member's at a time, in line order.
  struct Rounded {
    std::string key;
    RoundedRun run;
  };
  std::vector<Rounded> rounded;
};

std::atomic<uint64_t> next_types_id{0};

class JsonlSource final : public ExampleSource {
 public:
  JsonlSource(std::vector<std::string> files, const records::FeatureSpec* spec,
              uint64_t max_row_bytes,
              const std::function<void(const ConvertProgress&)>& typing)
      : files_(std::move(files)),
        max_row_bytes_(static_cast<size_t>(max_row_bytes)) {
    for (const auto& f : files_) total_bytes_ += FileSize(f);
    // First pass: the type of every key (numbers widen int64 -> float;
    // strings and numbers under one key are an error in the rows that
    // disagree with the first seen) and the row count.
    InexactIntegers inexact;
    std::map<std::string, size_t> slots;  // of keys with such integers
    TypingReports reports(typing, total_bytes_);
    // Lines are read on one thread, typed on every core, and merged in
    // input order, so that the type a key first has and the first inexact
    // integer are the input's first.  A chunk holds one file's lines.
    // A chunk's slot keeps its lines' storage.
    std::unique_ptr<records::ByteReader> file;
    size_t file_index = 0;
    uint64_t line_number = 0;
    uint64_t files_bytes = 0;  // of the files read before `file`
    if (!files_.empty()) file = OpenText(files_[0]);
    auto read = [&](TypingChunk& c) {
      c.used = 0;
      c.keys.clear();
      c.rounded.clear();
      size_t bytes = 0;
      while (c.used < kTypingRows && bytes < kTypingBytes) {
        if (file == nullptr) break;  // every file read
        if (c.used == c.lines.size()) {
          c.lines.emplace_back();
          c.line_numbers.emplace_back();
        }
        std::string& line = c.lines[c.used];
        if (!ReadLine(*file, line_number + 1, &line)) {
          files_bytes += file->file_position();
          file.reset();
          line_number = 0;
          if (++file_index < files_.size()) file = OpenText(files_[file_index]);
          if (c.used > 0) break;
          continue;
        }
        ++line_number;
        if (IsBlank(line)) continue;
        c.file = file_index;
        c.line_numbers[c.used++] = line_number;
        bytes += line.size();
      }
      if (c.used == 0) return false;
      c.bytes_read = files_bytes + (file ? file->file_position() : 0);
      return true;
    };
    auto type = [](TypingChunk& c) {
      thread_local LineTypes line_types;
      for (size_t i = 0; i < c.used; ++i) {
        // A line that is no object is reported in the second pass.
        if (!line_types.Parse(c.lines[i])) continue;
        for (const LineTypes::Member& m : line_types.members()) {
          c.keys.try_emplace(m.key).first->second.Add(m.type);
          if (m.rounded.count > 0) {
            c.rounded.push_back({.key = m.key, .run = m.rounded});
            c.rounded.back().run.line = c.line_numbers[i];
          }
        }
      }
    };
    auto merge = [&](TypingChunk& c) {
      rows_ += c.used;
      reports.Rows(c.used, [&c] { return c.bytes_read; });
      const std::string& path = files_[c.file];
      for (const TypingChunk::Rounded& r : c.rounded) {
        const size_t slot = slots.emplace(r.key, slots.size()).first->second;
        r.run.AddTo(&inexact, slot, path);
      }
      for (const auto& [key, types] : c.keys) types.MergeInto(types_[key]);
    };
    RunRing<TypingChunk>(kTypingChunks, read, type, merge);
    // The spec types keys by name: one no row has is a misspelt or wrong
    // key, not a feature to leave out silently (as for CSV's header).
    if (spec != nullptr) {
      for (const auto& [name, config] : spec->features) {
        if (types_.count(name) == 0) {
          std::vector<std::string> keys;
          for (const auto& [key, type] : types_) {
            if (keys.size() == kKeysNamed) {
              keys.push_back("...");
              break;
            }
            keys.push_back(key);
          }
          InputError(fmt::format(
              "{}: --spec names key '{}', which no row of the input has "
              "(its keys: {})",
              files_.size() == 1
                  ? files_[0]
                  : fmt::format("{} and {} more", files_[0], files_.size() - 1),
              name, fmt::join(keys, ", ")));
        }
      }
    }
    for (auto& [key, type] : types_) {
      type = FromSpec(spec, key, type);
      if (type == CellType::kNone) {
        warnings_.push_back(
            UntypedWarning("key", key, "null or [] in every row that has it"));
      }
      const auto slot = slots.find(key);
      if (slot == slots.end()) continue;
      if (auto w = inexact.Warning(slot->second, key, "key", type)) {
        warnings_.push_back(std::move(*w));
      }
    }
    Open(0);
  }

  bool NextRow(Row* r) override {
    r->built = false;
    r->error.clear();
    while (true) {
      if (file_ == nullptr) return false;
      if (ReadLine(*file_, line_number_ + 1, &r->text)) {
        ++line_number_;
        if (!IsBlank(r->text)) break;
        continue;
      }
      bytes_done_ += FileSize(file_->path());
      Open(file_index_ + 1);
    }
    r->path = file_->path();
    r->line = line_number_;
    return true;
  }

  void Build(const Row& r, records::ExampleBuilder* b) const override {
    thread_local LineValues values;
    if (values.Parse(r.text, types_, types_id_)) {
      values.AddTo(b);
      return;
    }
    BuildOrSayWhy(r, b);
  }

  std::optional<uint64_t> rows() const override { return rows_; }
  uint64_t bytes_read() const override {
    return bytes_done_ + (file_ ? file_->file_position() : 0);
  }
  uint64_t total_bytes() const override { return total_bytes_; }
  std::vector<std::string> warnings() const override { return warnings_; }

 private:
  // What a bad line that shows the file is a JSON document (an array of
  // objects, or one written over many lines) adds to its error.
  static std::string DocumentHint(char opens) {
    return fmt::format(
        " (the file looks like a JSON document, not JSON Lines, which holds "
        "one object per line: `jq -c {} FILE` writes {} so)",
        opens == '[' ? "'.[]'" : ".",
        opens == '[' ? "an array's objects" : "an object on one line");
  }

  // A line LineValues stopped at, parsed into a document to say what makes
  // it a bad row (JsonlTest.BadLinesSayWhatWasFoundWhere has each kind).
  // Every such line is bad; were one not, it would build here the Example
  // LineValues would, as every line did before LineValues.
  void BuildOrSayWhy(const Row& r, records::ExampleBuilder* b) const {
    // A UTF-16 file: every line is bad, the first says why.
    if (r.line == 1 && r.text.size() >= 2) {
      std::string utf16 = records::Utf16FileError(
          r.path, "JSON Lines", static_cast<unsigned char>(r.text[0]),
          static_cast<unsigned char>(r.text[1]));
      if (!utf16.empty()) RowError(utf16);
    }
    // Before nlohmann, which reads one as the end of the line.
    if (const size_t nul = r.text.find('\0'); nul != std::string::npos) {
      RowError(fmt::format(
          "{}:{}: not JSON: a NUL byte at column {} (JSON has none; in a "
          "string it is written \\u0000)",
          r.path, r.line, nul + 1));
    }
    nlohmann::json row;
    try {
      row = nlohmann::json::parse(r.text);
    } catch (const nlohmann::json::exception& e) {
      // "[json.exception.parse_error.101] parse error at line 1, column 9:
      // ..." (or out_of_range.406: "number overflow parsing '1e400'")
      // without the library's tag and the line within the line.
      std::string what = e.what();
      if (const size_t tag = what.find("] "); tag != std::string::npos) {
        what.erase(0, tag + 2);
      }
      if (const size_t at = what.find("at line 1, column ");
          at != std::string::npos) {
        what.replace(at, 18, "at column ");
      }
      // A line that only opens an array or an object: a JSON document
      // written over many lines, the commonest file given for JSON Lines.
      constexpr std::string_view kSpace = " \t\n\v\f\r";
      const size_t first = r.text.find_first_not_of(kSpace);
      const char opens = first != std::string::npos &&
                                 r.text.find_first_not_of(kSpace, first + 1) ==
                                     std::string::npos
                             ? r.text[first]
                             : '\0';
      RowError(
          fmt::format("{}:{}: not JSON: {}{}", r.path, r.line, what,
                      opens == '[' || opens == '{' ? DocumentHint(opens) : ""));
    }
    if (!row.is_object()) {
      const bool objects =
          row.is_array() && !row.empty() &&
          std::all_of(row.begin(), row.end(),
                      [](const nlohmann::json& e) { return e.is_object(); });
      RowError(fmt::format(
          "{}:{}: expected one JSON object per line, found "
          "{}{}",
          r.path, r.line, objects ? "an array of objects" : row.type_name(),
          objects ? DocumentHint('[') : ""));
    }
    // The parser keeps the last value of a key the line names twice;
    // each key is a feature, and the first value would be lost.
    if (MembersOf(r.text) != row.size()) {
      RowError(fmt::format("{}:{}: key \"{}\" appears twice; keys must differ",
                           r.path, r.line, RepeatedKey(r.text)));
    }
    std::vector<int64_t> ints;
    std::vector<float> floats;
    std::vector<std::string> strings;
    std::optional<std::vector<BigInteger>> literals;
    for (const auto& [key, value] : row.items()) {
      if (value.is_null()) continue;  // absent
      const auto known = types_.find(key);
      const CellType type =
          known == types_.end() ? CellType::kNone : known->second;
      // The values, viewed in place (a list's, or the one value).
      const std::span<const nlohmann::json> values =
          value.is_array()
              ? std::span<const nlohmann::json>(
                    value.get_ref<const nlohmann::json::array_t&>())
              : std::span<const nlohmann::json>(&value, 1);
      if (!records::wire::IsValidUtf8(key)) {
        RowError(fmt::format("{}:{}: key is not UTF-8", r.path, r.line));
      }
      try {
        switch (type) {
          case CellType::kInt64: {
            ints.clear();
            for (const auto& e : values) {
              // An integer past int64, not to wrap: one past uint64 (a
              // double to the parser), or between 2^63 and 2^64 - 1.
              const BigInteger* big = BigIntegerOf(e, r.text, &literals);
              if (big != nullptr ||
                  (e.is_number_unsigned() &&
                   e.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
                RowError(
                    fmt::format("{}:{}: key '{}': {} does not fit in "
                                "int64",
                                r.path, r.line, key,
                                big != nullptr ? big->text : e.dump()));
              }
              if (!e.is_number_integer() && !e.is_boolean()) throw 0;
              ints.push_back(e.is_boolean() ? e.get<bool>() : e.get<int64_t>());
            }
            b->AddInt64List(key, ints);
            break;
          }
          case CellType::kFloat: {
            floats.clear();
            for (const auto& e : values) {
              if (!e.is_number() && !e.is_boolean()) throw 0;
              if (e.is_number_float() &&
                  !records::FitsFloat32(e.get<double>())) {
                RowError(fmt::format(
                    "{}:{}: key '{}': {} is outside float32's range (a float "
                    "feature would hold inf)",
                    r.path, r.line, key, e.dump()));
              }
              floats.push_back(e.is_boolean() ? e.get<bool>() : e.get<float>());
            }
            b->AddFloatList(key, floats);
            break;
          }
          case CellType::kBytes: {
            strings.clear();
            for (const auto& e : values) {
              if (!e.is_string()) throw 0;
              strings.push_back(e.get<std::string>());
            }
            b->AddBytesList(key, strings);
            break;
          }
          case CellType::kNone:
            if (!values.empty()) throw 0;
            break;
        }
      } catch (int) {
        RowError(fmt::format(
            "{}:{}: key '{}': expected {} (numbers, strings, booleans, or "
            "lists of one of them), found {}",
            r.path, r.line, key,
            type == CellType::kBytes   ? "string values"
            : type == CellType::kFloat ? "numeric values"
            : type == CellType::kInt64 ? "integer values"
                                       : "feature values",
            records::JsonExcerpt(value)));
      }
    }
  }

  // A file plain or compressed (by its name's suffix: .gz, .zz or .zlib,
  // .zst or .zstd), as the CSV reader's.
  static std::unique_ptr<records::ByteReader> OpenText(
      const std::string& path) {
    try {
      return std::make_unique<records::ByteReader>(path);
    } catch (const records::IoError& e) {
      InputError(e.what());
    }
  }
  // A file that cannot be read or decoded is an error naming it after the
  // lines before, never an early end; so is a line (numbered `number`)
  // longer than max_row_bytes_, read no further.
  bool ReadLine(records::ByteReader& in, uint64_t number,
                std::string* line) const {
    bool read = false;
    try {
      read = in.GetLine(line, max_row_bytes_);
    } catch (const records::IoError& e) {  // read or decoding; names it
      InputError(e.what());
    }
    if (line->size() > max_row_bytes_) {
      const size_t first = line->find_first_not_of(" \t\r");
      InputError(fmt::format(
          "{}:{}: the line is longer than {} bytes, the most a row may hold "
          "(max_row_bytes){}",
          in.path(), number, max_row_bytes_,
          first != std::string::npos && (*line)[first] == '['
              ? DocumentHint('[')
              : ""));
    }
    return read;
  }
  static bool IsBlank(const std::string& s) {
    return s.find_first_not_of(" \t\r") == std::string::npos;
  }
  void Open(size_t index) {
    file_index_ = index;
    file_.reset();
    line_number_ = 0;
    if (index < files_.size()) file_ = OpenText(files_[index]);
  }

  static constexpr size_t kKeysNamed = 20;  // in an error, at most

  std::vector<std::string> files_;
  size_t max_row_bytes_;
  KeyTypeMap types_;
  // Names types_ to LineValues, which is one per thread, not per source.
  const uint64_t types_id_ = ++next_types_id;
  std::vector<std::string> warnings_;
  std::unique_ptr<records::ByteReader> file_;
  size_t file_index_ = 0;
  uint64_t line_number_ = 0;
  uint64_t rows_ = 0;
  uint64_t total_bytes_ = 0;
  uint64_t bytes_done_ = 0;
};

}  // namespace

std::unique_ptr<ExampleSource> OpenJsonl(
    std::vector<std::string> files, const records::FeatureSpec* spec,
    uint64_t max_row_bytes,
    const std::function<void(const ConvertProgress&)>& typing) {
  return std::make_unique<JsonlSource>(std::move(files), spec, max_row_bytes,
                                       typing);
}

}  // namespace recflow::convert
