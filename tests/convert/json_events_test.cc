// convert/json_events.h: JsonEventReader reads every text as nlohmann's
// SAX parser does (which texts are JSON, and their events; but a text with
// a NUL byte is none), on hand-picked edges and on seeded random texts and
// their mutations.
#include "convert/json_events.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "json_event_log.h"
#include "records/wire_format.h"

namespace recflow::convert {
namespace {

using testing::ExpectedJsonEvents;
using testing::JsonEventLog;
using testing::NlohmannJsonEvents;
using testing::OurJsonEvents;

// A readable form of a text for failure messages: bytes outside ASCII's
// printable range as \xNN.
std::string Shown(std::string_view text) {
  std::string out;
  for (const char c : text) {
    const auto b = static_cast<unsigned char>(c);
    out +=
        b >= 0x20 && b < 0x7f ? std::string(1, c) : fmt::format("\\x{:02x}", b);
  }
  return out;
}

void ExpectAsNlohmann(std::string_view text) {
  const JsonEventLog ours = OurJsonEvents(text);
  const JsonEventLog theirs = ExpectedJsonEvents(text);
  EXPECT_EQ(ours.json, theirs.json) << "text: " << Shown(text);
  EXPECT_EQ(ours.events, theirs.events) << "text: " << Shown(text);
}

TEST(JsonEventReaderTest, ReportsALineAsItsEvents) {
  const JsonEventLog log = OurJsonEvents(
      "{\"a\": [1, -2, 0.5], \"s\": \"x\\ty\", \"n\": null, \"b\": true}");
  ASSERT_TRUE(log.json);
  EXPECT_EQ(log.events,
            (std::vector<std::string>{"{", "key a", "[", "uint 1", "int -2",
                                      testing::DoubleEvent(0.5, "0.5"), "]",
                                      "key s", "string x\ty", "key n", "null",
                                      "key b", "true", "}"}));
  ExpectAsNlohmann(
      "{\"a\": [1, -2, 0.5], \"s\": \"x\\ty\", \"n\": null, \"b\": true}");
}

TEST(JsonEventReaderTest, StopsWhereTheHandlerSaysSo) {
  struct StopAtSecondKey {
    int keys = 0;
    bool Null() { return true; }
    bool Bool(bool) { return true; }
    bool Int(int64_t) { return true; }
    bool Uint(uint64_t) { return true; }
    bool Double(double, std::string_view) { return true; }
    bool String(std::string_view) { return true; }
    bool Key(std::string_view) { return ++keys < 2; }
    bool StartObject() { return true; }
    bool EndObject() { return true; }
    bool StartArray() { return true; }
    bool EndArray() { return true; }
  } handler;
  JsonEventReader reader;
  EXPECT_FALSE(reader.Read("{\"a\": 1, \"b\": 2, \"c\": 3}", handler));
  EXPECT_EQ(handler.keys, 2);
}

// nlohmann reads a NUL byte outside a string as the text's end and drops
// what follows; to the reader a text with one is no JSON.
TEST(JsonEventReaderTest, TakesNoTextWithANulByteForJson) {
  for (const std::string& text :
       {std::string("{}\0{\"a\": 1}", 12), std::string("[1]\0", 4),
        std::string("1\0", 2)}) {
    EXPECT_TRUE(NlohmannJsonEvents(text).json) << Shown(text);
    EXPECT_FALSE(OurJsonEvents(text).json) << Shown(text);
  }
  EXPECT_FALSE(OurJsonEvents(std::string("\"a\0b\"", 5)).json);
  EXPECT_FALSE(NlohmannJsonEvents(std::string("\"a\0b\"", 5)).json);
}

// Each edge of the grammar and of the values, read as nlohmann reads it.
TEST(JsonEventReaderTest, ReadsEdgesAsNlohmann) {
  const std::vector<std::string> texts = {
      // Values at the top, and whitespace around them.
      "",
      " ",
      "{}",
      "[]",
      " {} ",
      "\t\r\n[ ]\n",
      "1",
      "\"s\"",
      "null",
      "true",
      "false",
      "nul",
      "tru",
      "falsey",
      "nulll",
      "{} x",
      "{}{}",
      std::string("{}\0", 3),
      std::string("\"a\0b\"", 5),
      // A byte order mark opens the text only.
      "\xEF\xBB\xBF{}",
      "\xEF\xBB{}",
      "\xEF{}",
      " \xEF\xBB\xBF{}",
      "\xEF\xBB\xBF",
      "{\"\xEF\xBB\xBF\": 1}",
      // Containers: commas, colons, nesting.
      "{\"a\":1,}",
      "[1,]",
      "[,1]",
      "{,}",
      "{\"a\" 1}",
      "{\"a\":}",
      "{1: 2}",
      "{\"a\": 1 \"b\": 2}",
      "[1 2]",
      "[[[[[[[[]]]]]]]]",
      "[[[[[[[[]]]]]]]",
      "{\"a\": {\"b\": {\"c\": [1, {\"d\": []}]}}}",
      "[1}",
      "{\"a\": 1]",
      "]",
      "}",
      "{\"a\":1}}",
      "[[]]]",
      // Numbers.
      "0",
      "-0",
      "-",
      "01",
      "-01",
      "1.",
      ".5",
      "1.5",
      "-1.5e3",
      "1e",
      "1e+",
      "1E-2",
      "1e+2",
      "+1",
      "0x10",
      "1.0",
      "1.5.5",
      "1e5e5",
      "00",
      "9223372036854775807",
      "9223372036854775808",
      "-9223372036854775808",
      "-9223372036854775809",
      "18446744073709551615",
      "18446744073709551616",
      "123456789012345678901234567890",
      "-123456789012345678901234567890",
      "1e400",
      "-1e400",
      "1e-400",
      "-1e-400",
      "2.4e-324",
      "4.9e-324",
      "2.5e-324",
      "1.7976931348623157e308",
      "1.7976931348623159e308",
      "0.1",
      "0.30000000000000004",
      "5e-324",
      "1e308",
      "-0.0",
      "0e0",
      "100000000000000000000000000000000000000000000000000e-50",
      "[1,-1,1.5,-1.5e-3,18446744073709551616]",
      "1 ",
      "1\n",
      "1x",
      "[1x]",
      // Strings: escapes, \u, surrogates, UTF-8, control bytes.
      "\"\"",
      "\"abc\"",
      "\"a\\\"b\"",
      "\"\\\\\"",
      "\"\\/\"",
      "\"\\b\\f\\n\\r\\t\"",
      "\"\\a\"",
      "\"\\\"",
      "\"\\",
      "\"abc",
      "\"\\u0041\"",
      "\"\\u00e9\\u00E9\"",
      "\"\\u20ac\"",
      "\"\\u0000\"",
      "\"\\ud83d\\ude00\"",
      "\"\\uD83D\\uDE00\"",
      "\"\\ud83d\"",
      "\"\\ud83dx\"",
      "\"\\ud83d\\u0041\"",
      "\"\\ude00\"",
      "\"\\ud83d\\ud83d\"",
      "\"\\u12\"",
      "\"\\u12g4\"",
      "\"\\u\"",
      "\"\\ud83d\\",
      "\"\\ud83d\\u",
      "\"\xC3\xA9\"",
      "\"\xE2\x82\xAC\"",
      "\"\xF0\x9F\x98\x80\"",
      "\"\xC3\"",
      "\"\xC3\x28\"",
      "\"\xC0\xAF\"",
      "\"\xC1\xBF\"",
      "\"\xE0\x80\xAF\"",
      "\"\xE0\xA0\x80\"",
      "\"\xED\xA0\x80\"",
      "\"\xED\x9F\xBF\"",
      "\"\xF0\x80\x80\x80\"",
      "\"\xF0\x90\x80\x80\"",
      "\"\xF4\x8F\xBF\xBF\"",
      "\"\xF4\x90\x80\x80\"",
      "\"\xF5\x80\x80\x80\"",
      "\"\xFF\"",
      "\"\x80\"",
      "\"\xBF\"",
      "\"a\x01\"",
      "\"a\x1F\"",
      "\"a\x7F\"",
      "\"a\tb\"",
      "\"a\nb\"",
      "\"\xC3\\n\xA9\"",
      "\"\\n\xC3\xA9\"",
      "\"\xC3\xA9\\n\"",
      "{\"k\\u00e9\": \"v\\\"\"}",
      "{\"\": \"\"}",
      "{\"a\": 1, \"a\": 2}",
  };
  for (const std::string& text : texts) ExpectAsNlohmann(text);
}

// Random JSON texts, from a seed, with every kind of value and byte, and
// each mutated: read as nlohmann reads them.
class RandomJson {
 public:
  explicit RandomJson(uint32_t seed) : rng_(seed) {}

  std::string Text() {
    std::string out;
    if (Pick(10) == 0) out += "\xEF\xBB\xBF";
    Space(&out);
    Value(&out, 0);
    Space(&out);
    return out;
  }

  // `text` with one change: a byte replaced, removed, or added, the end
  // cut, or a piece repeated.
  std::string Mutated(std::string text) {
    static constexpr char kByteList[] =
        "{}[]\",:\\ -+.eE0123456789tfnulru\x00\x01\x1f\x7f\x80\xbf\xc0\xc2"
        "\xdf\xe0\xed\xef\xf0\xf4\xf5\xff";
    // The list without the literal's terminating NUL (it has its own).
    static const std::string kBytes(kByteList, sizeof(kByteList) - 1);
    const auto byte = [&] {
      return Pick(4) == 0 ? static_cast<char>(Pick(256))
                          : kBytes[Pick(kBytes.size())];
    };
    const size_t at = Pick(text.size() + 1);
    switch (Pick(5)) {
      case 0:
        if (at < text.size()) text[at] = byte();
        break;
      case 1:
        if (at < text.size()) text.erase(at, 1);
        break;
      case 2:
        text.insert(at, 1, byte());
        break;
      case 3:
        text.resize(at);
        break;
      default: {
        const size_t n = Pick(text.size() - at + 1);
        text.insert(at, text.substr(at, n));
        break;
      }
    }
    return text;
  }

 private:
  size_t Pick(size_t n) {
    return std::uniform_int_distribution<size_t>(0, n - 1)(rng_);
  }
  void Space(std::string* out) {
    static const char kSpace[] = {' ', '\t', '\n', '\r'};
    for (size_t i = Pick(4); i > 1; --i) out->push_back(kSpace[Pick(4)]);
  }
  std::string Digits(size_t max) {
    std::string d;
    for (size_t i = 1 + Pick(max); i > 0; --i) d.push_back('0' + Pick(10));
    return d;
  }
  void Number(std::string* out) {
    static const char* const kEdges[] = {"9223372036854775807",
                                         "9223372036854775808",
                                         "-9223372036854775808",
                                         "-9223372036854775809",
                                         "18446744073709551615",
                                         "18446744073709551616",
                                         "1e400",
                                         "1e-400",
                                         "2.4e-324",
                                         "4.9e-324",
                                         "1.7976931348623159e308",
                                         "-0"};
    if (Pick(6) == 0) {
      *out += kEdges[Pick(std::size(kEdges))];
      return;
    }
    if (Pick(2) == 0) out->push_back('-');
    *out += Pick(4) == 0 ? "0" : std::string(1, '1' + Pick(9)) + Digits(22);
    if (Pick(3) == 0) *out += "." + Digits(20);
    if (Pick(3) == 0) {
      out->push_back("eE"[Pick(2)]);
      if (Pick(2) == 0) out->push_back("+-"[Pick(2)]);
      *out += Digits(3);
    }
  }
  void String(std::string* out) {
    static const std::string kEscapes = "\\\"\\\\\\/\\b\\f\\n\\r\\t";
    static const uint32_t kUtf8Ends[] = {0x80, 0x800, 0x10000, 0x110000};
    out->push_back('"');
    for (size_t i = Pick(8); i > 0; --i) {
      switch (Pick(16)) {
        case 0:  // any byte
          out->push_back(static_cast<char>(Pick(256)));
          break;
        case 1:  // any code point, surrogates and controls too
          records::wire::AppendUtf8(Pick(kUtf8Ends[Pick(4)]), out);
          break;
        case 2:  // any \u code unit
          *out += fmt::format("\\u{:04x}", Pick(0x10000));
          break;
        case 3:
        case 4: {  // a surrogate pair, in either case of hex
          *out += fmt::format("\\u{:04x}\\u{:04X}", 0xD800 + Pick(0x400),
                              0xDC00 + Pick(0x400));
          break;
        }
        case 5:
        case 6:
          *out += kEscapes.substr(2 * Pick(9), 2);
          break;
        case 7:
        case 8: {  // a character past ASCII, not a surrogate
          uint32_t cp;
          do {
            cp = 0x80 + Pick(kUtf8Ends[1 + Pick(3)] - 0x80);
          } while (cp >= 0xD800 && cp < 0xE000);
          records::wire::AppendUtf8(cp, out);
          break;
        }
        default: {  // printable ASCII, not a quote or backslash
          const char c = static_cast<char>(' ' + Pick(95));
          out->push_back(c == '"' || c == '\\' ? 'x' : c);
          break;
        }
      }
    }
    out->push_back('"');
  }
  void Value(std::string* out, int depth) {
    switch (Pick(depth < 4 ? 9 : 7)) {
      case 0:
        *out += std::vector<std::string>{"null", "true", "false"}[Pick(3)];
        break;
      case 1:
      case 2:
      case 3:
        Number(out);
        break;
      case 4:
      case 5:
      case 6:
        String(out);
        break;
      case 7: {
        out->push_back('[');
        for (size_t i = Pick(4); i > 0; --i) {
          Space(out);
          Value(out, depth + 1);
          Space(out);
          if (i > 1) out->push_back(',');
        }
        out->push_back(']');
        break;
      }
      default: {
        out->push_back('{');
        for (size_t i = Pick(5); i > 0; --i) {
          Space(out);
          String(out);
          Space(out);
          out->push_back(':');
          Space(out);
          Value(out, depth + 1);
          Space(out);
          if (i > 1) out->push_back(',');
        }
        out->push_back('}');
        break;
      }
    }
  }

  std::mt19937 rng_;
};

TEST(JsonEventReaderTest, ReadsRandomTextsAndTheirMutationsAsNlohmann) {
  RandomJson random(20261202);
  size_t json = 0, not_json = 0;
  std::set<std::string> kinds;  // of events in texts that are JSON
  for (int i = 0; i < 20000; ++i) {
    std::string text = random.Text();
    for (int m = 0; m < 5; ++m) {
      const JsonEventLog ours = OurJsonEvents(text);
      const JsonEventLog theirs = ExpectedJsonEvents(text);
      ASSERT_EQ(ours, theirs)
          << "text: " << Shown(text) << "\nours: " << ours.json << " "
          << fmt::format("{}", fmt::join(ours.events, " | "))
          << "\nnlohmann: " << theirs.json << " "
          << fmt::format("{}", fmt::join(theirs.events, " | "));
      (ours.json ? json : not_json) += 1;
      for (const std::string& e : ours.events) {
        kinds.insert(e.substr(0, e.find(' ')));
      }
      text = random.Mutated(std::move(text));
    }
  }
  // Both sides of the line, and every kind of event, were compared.
  EXPECT_GT(json, 20000u);
  EXPECT_GT(not_json, 20000u);
  EXPECT_EQ(kinds, (std::set<std::string>{"null", "true", "false", "int",
                                          "uint", "double", "string", "key",
                                          "{", "}", "[", "]"}));
}

}  // namespace
}  // namespace recflow::convert
