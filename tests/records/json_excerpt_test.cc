// records/json_excerpt.cc: JSON values written for error messages, as
// nlohmann's dump() writes them, cut short, and without recursion.
#include "records/json_excerpt.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>

namespace recflow::records {
namespace {

// Whatever fits is written as dump() writes it: scalars, escapes, UTF-8,
// empty and nested containers, and objects' keys in their order.
TEST(JsonExcerptTest, WhatFitsIsWrittenAsDumpWritesIt) {
  for (const char* text :
       {"null", "true", "false", "0", "-7", "18446744073709551615", "1.5",
        "-1e-300", R"("")", R"("a\"b\\c\n\u0001")", R"("é€😀")", "[]", "{}",
        "[[]]", R"({"":{}})", "[1,[2,[3,[]]],{}]",
        R"({"b": [true, null], "a": {"x": "y", "\t": 2.25}})",
        R"([{"a":[{"b":[]}]},"z"])"}) {
    const nlohmann::json value = nlohmann::json::parse(text);
    EXPECT_EQ(JsonExcerpt(value, 1000), value.dump()) << text;
    // Exactly as long as the cut: not cut.
    EXPECT_EQ(JsonExcerpt(value, value.dump().size()), value.dump()) << text;
  }
}

// Longer than the cut: its first bytes and "...", never half a character.
TEST(JsonExcerptTest, WhatIsLongerIsCutAtACharacter) {
  const nlohmann::json list = nlohmann::json::parse("[1, 22, 333, [4444]]");
  EXPECT_EQ(list.dump(), "[1,22,333,[4444]]");
  for (size_t n = 0; n < list.dump().size(); ++n) {
    EXPECT_EQ(JsonExcerpt(list, n), list.dump().substr(0, n) + "...") << n;
  }
  EXPECT_EQ(JsonExcerpt(nlohmann::json(std::string(200, 'x'))),
            "\"" + std::string(79, 'x') + "...");
  // "é" is 2 bytes, "€" 3, "😀" 4: a cut inside one drops all of it.
  const nlohmann::json text = "é€😀";
  EXPECT_EQ(JsonExcerpt(text, 1), "\"...");
  EXPECT_EQ(JsonExcerpt(text, 2), "\"...");
  EXPECT_EQ(JsonExcerpt(text, 3), "\"é...");
  EXPECT_EQ(JsonExcerpt(text, 4), "\"é...");
  EXPECT_EQ(JsonExcerpt(text, 5), "\"é...");
  EXPECT_EQ(JsonExcerpt(text, 6), "\"é€...");
  EXPECT_EQ(JsonExcerpt(text, 9), "\"é€...");
  EXPECT_EQ(JsonExcerpt(text, 10), "\"é€😀...");
  EXPECT_EQ(JsonExcerpt(text, 11), "\"é€😀\"");
}

// A long string is written from its first bytes only, yet as dump()
// begins: random strings of every kind of byte (escapes, UTF-8, bytes
// that are not) cut at every length, the excerpt dump()'s first bytes,
// cut at a character.
TEST(JsonExcerptTest, ALongStringIsWrittenAsDumpBeginsIt) {
  std::mt19937 rng(7);
  const std::string bytes = std::string("ab\"\\\n\x01\x7f", 7) +
                            "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\x80\xff";
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text(rng() % 40, ' ');
    for (char& c : text) c = bytes[rng() % bytes.size()];
    const nlohmann::json value(text);
    const std::string full =
        value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    for (size_t n = 0; n <= full.size(); ++n) {
      const std::string got = JsonExcerpt(value, n);
      if (full.size() <= n) {
        EXPECT_EQ(got, full);
        continue;
      }
      ASSERT_GE(got.size(), 3u);
      ASSERT_EQ(got.substr(got.size() - 3), "...");
      const std::string kept = got.substr(0, got.size() - 3);
      EXPECT_EQ(full.compare(0, kept.size(), kept), 0) << full << " " << n;
      EXPECT_LE(kept.size(), n);
      EXPECT_GE(kept.size() + 3, n);  // at most a character dropped
      // ... and that at a character's start.
      EXPECT_NE(static_cast<unsigned char>(full[kept.size()]) & 0xC0, 0x80)
          << full << " " << n;
    }
  }
  // A string of a hundred million bytes: its excerpt from its first bytes.
  const nlohmann::json huge(std::string(100'000'000, 'x'));
  EXPECT_EQ(JsonExcerpt(huge, 5), "\"xxxx...");
}

// A string that is not UTF-8 (nlohmann's dump() would throw) is written
// with U+FFFD for its bad bytes.
TEST(JsonExcerptTest, BytesThatAreNotUtf8AreWrittenAsReplacements) {
  EXPECT_EQ(JsonExcerpt(nlohmann::json(std::string("a\xff"
                                                   "b"))),
            "\"a\xEF\xBF\xBD"
            "b\"");
  EXPECT_EQ(JsonExcerpt(nlohmann::json::object({{std::string("\xc0"), 1}})),
            "{\"\xEF\xBF\xBD\":1}");
}

// Nested a million deep, or a million wide: the first bytes, in bounded
// stack (dump() recursing this deep overflows the stack).
TEST(JsonExcerptTest, ValuesAMillionDeepOrWideAreWrittenInBoundedStack) {
  constexpr int kDepth = 1000000;
  const nlohmann::json deep = nlohmann::json::parse(std::string(kDepth, '[') +
                                                    std::string(kDepth, ']'));
  EXPECT_EQ(JsonExcerpt(deep), std::string(80, '[') + "...");
  nlohmann::json objects = 1;
  for (int i = 0; i < kDepth; ++i) {
    nlohmann::json outer = nlohmann::json::object();
    outer["k"] = std::move(objects);
    objects = std::move(outer);
  }
  EXPECT_EQ(JsonExcerpt(objects, 12), R"({"k":{"k":{"...)");
  const nlohmann::json wide(std::vector<int>(kDepth, 7));
  EXPECT_EQ(JsonExcerpt(wide, 8), "[7,7,7,7...");
}

}  // namespace
}  // namespace recflow::records
