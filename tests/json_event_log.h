// What convert/json_events.h's reader and nlohmann::json::sax_parse each
// report for a text, in one form to compare: whether it is JSON, and the
// events, one string each; and what the reader is to report.  For
// tests/convert/json_events_test.cc and fuzz/json_events_fuzzer.cc.
#ifndef RECFLOW_TESTS_JSON_EVENT_LOG_H_
#define RECFLOW_TESTS_JSON_EVENT_LOG_H_

#include <fmt/format.h>

#include <bit>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "convert/json_events.h"

namespace recflow::testing {

// For a text that is no JSON, no events: where each reader stops is its own.
struct JsonEventLog {
  bool json = false;  // the text is JSON: the reading returned true
  std::vector<std::string> events;
  bool operator==(const JsonEventLog&) const = default;
};

// A double by its bits (-0.0 is not 0.0), and the text it was read from.
inline std::string DoubleEvent(double v, std::string_view text) {
  return fmt::format("double {:016x} {}", std::bit_cast<uint64_t>(v), text);
}

inline JsonEventLog OurJsonEvents(std::string_view text) {
  struct Log {
    std::vector<std::string>& e;
    bool Null() { return Add("null"); }
    bool Bool(bool v) { return Add(v ? "true" : "false"); }
    bool Int(int64_t v) { return Add(fmt::format("int {}", v)); }
    bool Uint(uint64_t v) { return Add(fmt::format("uint {}", v)); }
    bool Double(double v, std::string_view t) { return Add(DoubleEvent(v, t)); }
    bool String(std::string_view s) { return Add("string " + std::string(s)); }
    bool Key(std::string_view s) { return Add("key " + std::string(s)); }
    bool StartObject() { return Add("{"); }
    bool EndObject() { return Add("}"); }
    bool StartArray() { return Add("["); }
    bool EndArray() { return Add("]"); }
    bool Add(std::string s) {
      e.push_back(std::move(s));
      return true;
    }
  };
  JsonEventLog out;
  Log log{out.events};
  convert::JsonEventReader reader;
  out.json = reader.Read(text, log);
  if (!out.json) out.events.clear();
  return out;
}

inline JsonEventLog NlohmannJsonEvents(std::string_view text) {
  using json = nlohmann::json;
  struct Log final : nlohmann::json_sax<json> {
    explicit Log(std::vector<std::string>& events) : e(events) {}
    std::vector<std::string>& e;
    bool null() override { return Add("null"); }
    bool boolean(bool v) override { return Add(v ? "true" : "false"); }
    bool number_integer(number_integer_t v) override {
      return Add(fmt::format("int {}", v));
    }
    bool number_unsigned(number_unsigned_t v) override {
      return Add(fmt::format("uint {}", v));
    }
    bool number_float(number_float_t v, const string_t& t) override {
      return Add(DoubleEvent(v, t));
    }
    bool string(string_t& s) override { return Add("string " + s); }
    bool binary(binary_t&) override { return Add("binary"); }
    bool key(string_t& s) override { return Add("key " + s); }
    bool start_object(std::size_t) override { return Add("{"); }
    bool end_object() override { return Add("}"); }
    bool start_array(std::size_t) override { return Add("["); }
    bool end_array() override { return Add("]"); }
    bool parse_error(std::size_t, const std::string&,
                     const nlohmann::detail::exception&) override {
      return false;
    }
    bool Add(std::string s) {
      e.push_back(std::move(s));
      return true;
    }
  };
  JsonEventLog out;
  Log log(out.events);
  out.json = json::sax_parse(text, &log);
  if (!out.json) out.events.clear();
  return out;
}

// What JsonEventReader is to report for `text`: nlohmann's reading, but
// for a text with a NUL byte, which is no JSON to it (nlohmann reads one
// outside a string as the end of the text).
inline JsonEventLog ExpectedJsonEvents(std::string_view text) {
  if (text.find('\0') != std::string_view::npos) return {};
  return NlohmannJsonEvents(text);
}

}  // namespace recflow::testing

#endif  // RECFLOW_TESTS_JSON_EVENT_LOG_H_
