// Internal to convert/: one JSON text (RFC 8259) read as a stream of
// events, JSON Lines' hot path.  It reports what nlohmann::json::sax_parse
// reports for the same text — which texts are JSON, and for those the same
// events with the same values (but for a NUL byte, below) — as
// tests/convert/json_events_test.cc and fuzz/json_events_fuzzer.cc check
// against nlohmann itself.  Ours because
// nlohmann's lexer was more than half of a JSON Lines conversion's CPU
// (docs/PERFORMANCE.md, "JSON Lines read by our own scanner"): it takes a
// byte at a time through an input adapter into a token buffer and reads
// numbers with strtod.  Here strings without escapes are views of the text,
// numbers are read by std::from_chars, and the handler is called directly.
// nlohmann stays for error messages and whole documents.
//
// JSON as nlohmann reads it: a UTF-8 byte order mark may open the text;
// whitespace is space, tab, LF and CR; strings are UTF-8 (no overlong form,
// no surrogate, nothing past U+10FFFF), with no control byte, and \u
// escapes pair their surrogates; a number too large for a double (1e400)
// is no JSON (nlohmann's "number overflow"); one too small becomes 0 or a
// subnormal, as strtod rounds it.  Nothing but whitespace may follow the
// value.  One difference: a text with a NUL byte is no JSON here (the
// grammar has no place for one: not in a string, a number, a literal or
// whitespace), where nlohmann reads one outside a string as the text's end
// (a C string's) and would drop what follows it.
#ifndef RECFLOW_CONVERT_JSON_EVENTS_H_
#define RECFLOW_CONVERT_JSON_EVENTS_H_

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "records/wire_format.h"

namespace recflow::convert {

// Reads JSON texts into a handler's calls.  One object reads one text at a
// time (it keeps scratch storage between texts): not thread-safe.
//
// The handler has, each returning false to stop the reading:
//   bool Null();  bool Bool(bool);
//   bool Int(int64_t);    // an integer literal below 0, within int64
//   bool Uint(uint64_t);  // an integer literal from 0, within uint64
//   // a number with a fraction or an exponent, or an integer literal past
//   // int64 and uint64 (nlohmann's number_float), with its text
//   bool Double(double, std::string_view text);
//   bool String(std::string_view);  bool Key(std::string_view);
//   bool StartObject();  bool EndObject();
//   bool StartArray();  bool EndArray();
// Views are valid during the call only (they may be of the text or of
// scratch storage).
class JsonEventReader {
 public:
  // Reads `text`, calling `handler` in the text's order.  False when the
  // text is not JSON (after the events up to where that shows) or a
  // handler call returned false.
  template <typename Handler>
  bool Read(std::string_view text, Handler& handler);

 private:
  bool AtSpaceEnd() {
    SkipSpace();
    return p_ == end_;
  }
  void SkipSpace() {
    while (p_ != end_ &&
           (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) {
      ++p_;
    }
  }
  // At the byte after `word`'s first: the rest of it.
  bool Word(std::string_view rest) {
    if (static_cast<size_t>(end_ - p_) < rest.size() ||
        std::string_view(p_, rest.size()) != rest) {
      return false;
    }
    p_ += rest.size();
    return true;
  }
  // At an opening quote: the string, unescaped, into *out.
  bool ReadString(std::string_view* out);
  bool ReadEscape();
  bool ReadHex4(uint32_t* cp);
  // At a number's first byte ('-' or a digit; anything else is no JSON).
  template <typename Handler>
  bool ReadNumber(Handler& handler);
  // At a key's opening quote (after whitespace): the key and its colon.
  template <typename Handler>
  bool ReadKey(Handler& handler) {
    SkipSpace();
    std::string_view key;
    if (p_ == end_ || *p_ != '"' || !ReadString(&key) || !handler.Key(key)) {
      return false;
    }
    SkipSpace();
    if (p_ == end_ || *p_ != ':') return false;
    ++p_;
    return true;
  }

  const char* p_ = nullptr;
  const char* end_ = nullptr;
  std::string scratch_;     // an escaped string, unescaped
  std::vector<char> open_;  // '{' or '[' for each container open
};

template <typename Handler>
bool JsonEventReader::Read(std::string_view text, Handler& handler) {
  p_ = text.data();
  end_ = p_ + text.size();
  open_.clear();
  if (p_ != end_ && static_cast<unsigned char>(*p_) == 0xEF) {
    if (!Word("\xEF\xBB\xBF")) return false;  // a byte order mark, whole
  }
  while (true) {
    // A value.
    SkipSpace();
    if (p_ == end_) return false;
    switch (*p_) {
      case '{':
        ++p_;
        if (!handler.StartObject()) return false;
        SkipSpace();
        if (p_ != end_ && *p_ == '}') {
          ++p_;
          if (!handler.EndObject()) return false;
          break;
        }
        open_.push_back('{');
        if (!ReadKey(handler)) return false;
        continue;  // to the member's value
      case '[':
        ++p_;
        if (!handler.StartArray()) return false;
        SkipSpace();
        if (p_ != end_ && *p_ == ']') {
          ++p_;
          if (!handler.EndArray()) return false;
          break;
        }
        open_.push_back('[');
        continue;  // to the first element
      case '"': {
        std::string_view s;
        if (!ReadString(&s) || !handler.String(s)) return false;
        break;
      }
      case 't':
        ++p_;
        if (!Word("rue") || !handler.Bool(true)) return false;
        break;
      case 'f':
        ++p_;
        if (!Word("alse") || !handler.Bool(false)) return false;
        break;
      case 'n':
        ++p_;
        if (!Word("ull") || !handler.Null()) return false;
        break;
      default:
        if (!ReadNumber(handler)) return false;
        break;
    }
    // After a value: the containers it closes, then a comma or the end.
    while (true) {
      if (open_.empty()) return AtSpaceEnd();
      SkipSpace();
      if (p_ == end_) return false;
      const char c = *p_++;
      const bool object = open_.back() == '{';
      if (c == ',') {
        if (object && !ReadKey(handler)) return false;
        break;  // to the next value
      }
      if (c != (object ? '}' : ']')) return false;
      open_.pop_back();
      if (!(object ? handler.EndObject() : handler.EndArray())) return false;
    }
  }
}

inline bool JsonEventReader::ReadString(std::string_view* out) {
  ++p_;  // the opening quote
  const char* begin = p_;
  bool ascii = true;
  // Most strings: no escape, so a view of the text.
  while (true) {
    if (p_ == end_) return false;
    const auto c = static_cast<unsigned char>(*p_);
    if (c == '"' || c == '\\') break;
    if (c < 0x20) return false;
    ascii &= c < 0x80;
    ++p_;
  }
  if (*p_ == '"') {
    *out = std::string_view(begin, p_ - begin);
    ++p_;
    // Escapes are ASCII, so the bytes between the quotes are UTF-8 when
    // the string's unescaped bytes are.
    return ascii || records::wire::IsValidUtf8(*out);
  }
  const char* raw = begin;  // for the UTF-8 check of the whole
  scratch_.assign(begin, p_);
  while (true) {
    if (p_ == end_) return false;
    const auto c = static_cast<unsigned char>(*p_);
    if (c == '"') break;
    if (c < 0x20) return false;
    ascii &= c < 0x80;
    if (c == '\\') {
      ++p_;
      if (!ReadEscape()) return false;
    } else {
      scratch_.push_back(static_cast<char>(c));
      ++p_;
    }
  }
  const std::string_view between(raw, p_ - raw);
  ++p_;
  *out = scratch_;
  return ascii || records::wire::IsValidUtf8(between);
}

inline bool JsonEventReader::ReadHex4(uint32_t* cp) {
  if (end_ - p_ < 4) return false;
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) {
    const char c = *p_++;
    v <<= 4;
    if (c >= '0' && c <= '9') {
      v |= c - '0';
    } else if (c >= 'a' && c <= 'f') {
      v |= c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      v |= c - 'A' + 10;
    } else {
      return false;
    }
  }
  *cp = v;
  return true;
}

// After a backslash: the escape, its bytes appended to scratch_.
inline bool JsonEventReader::ReadEscape() {
  if (p_ == end_) return false;
  switch (*p_++) {
    case '"':
      scratch_.push_back('"');
      return true;
    case '\\':
      scratch_.push_back('\\');
      return true;
    case '/':
      scratch_.push_back('/');
      return true;
    case 'b':
      scratch_.push_back('\b');
      return true;
    case 'f':
      scratch_.push_back('\f');
      return true;
    case 'n':
      scratch_.push_back('\n');
      return true;
    case 'r':
      scratch_.push_back('\r');
      return true;
    case 't':
      scratch_.push_back('\t');
      return true;
    case 'u':
      break;
    default:
      return false;
  }
  uint32_t cp;
  if (!ReadHex4(&cp)) return false;
  if (cp >= 0xD800 && cp <= 0xDBFF) {
    // A high surrogate: a low one must follow, escaped.
    uint32_t low;
    if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') return false;
    p_ += 2;
    if (!ReadHex4(&low) || low < 0xDC00 || low > 0xDFFF) return false;
    cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
  } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
    return false;  // a low surrogate alone
  }
  records::wire::AppendUtf8(cp, &scratch_);
  return true;
}

template <typename Handler>
bool JsonEventReader::ReadNumber(Handler& handler) {
  const char* begin = p_;
  auto digit = [this] { return p_ != end_ && *p_ >= '0' && *p_ <= '9'; };
  if (*p_ == '-') ++p_;
  // An integer part: 0, or digits not starting with 0.
  if (!digit()) return false;
  if (*p_++ != '0') {
    while (digit()) ++p_;
  }
  bool integer = true;
  if (p_ != end_ && *p_ == '.') {
    ++p_;
    if (!digit()) return false;
    while (digit()) ++p_;
    integer = false;
  }
  if (p_ != end_ && (*p_ == 'e' || *p_ == 'E')) {
    ++p_;
    if (p_ != end_ && (*p_ == '+' || *p_ == '-')) ++p_;
    if (!digit()) return false;
    while (digit()) ++p_;
    integer = false;
  }
  const std::string_view text(begin, p_ - begin);
  if (integer) {
    // As nlohmann reads integers: int64 below 0, uint64 from 0, and a
    // double past them.
    if (*begin == '-') {
      int64_t v;
      const auto r = std::from_chars(begin, p_, v);
      if (r.ec == std::errc() && r.ptr == p_) return handler.Int(v);
    } else {
      uint64_t v;
      const auto r = std::from_chars(begin, p_, v);
      if (r.ec == std::errc() && r.ptr == p_) return handler.Uint(v);
    }
  }
  double v;
  const auto r = std::from_chars(begin, p_, v);
  if (r.ec != std::errc() || r.ptr != p_) {
    // Out of range: strtod says how far (inf, or 0 or a subnormal).
    v = std::strtod(std::string(text).c_str(), nullptr);
  }
  if (!std::isfinite(v)) return false;
  return handler.Double(v, text);
}

}  // namespace recflow::convert

#endif  // RECFLOW_CONVERT_JSON_EVENTS_H_
