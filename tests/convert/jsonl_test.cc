// convert/jsonl.cc: one object per line, lists, nulls and widening.
#include <gtest/gtest.h>

#include "convert_test_util.h"

namespace recflow::convert {
namespace {

using testing::ConvertErrorOf;
using testing::Get;
using testing::SourceExamples;

TEST(JsonlTest, ListsNullsBooleansAndWidening) {
  testing::TempDir dir;
  testing::WriteFileBytes(
      dir.File("in.jsonl"),
      "{\"x\": 1, \"v\": [1, 2], \"s\": \"a\", \"b\": true}\n"
      "{\"x\": 2.5, \"v\": [3.5], \"s\": [\"b\", \"c\"], "
      "\"b\": null}\n");
  const auto ex = SourceExamples("jsonl", {.files = {dir.File("in.jsonl")}});
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_FLOAT_EQ(Get(ex[0], "x")->float_list().value(0), 1.0f);
  EXPECT_EQ(Get(ex[0], "v")->float_list().value_size(), 2);
  EXPECT_EQ(Get(ex[1], "s")->bytes_list().value(1), "c");
  EXPECT_EQ(Get(ex[0], "b")->int64_list().value(0), 1);
  EXPECT_EQ(Get(ex[1], "b"), nullptr);
}

TEST(JsonlTest, ALineThatIsNotAnObjectNamesTheFileAndLine) {
  testing::TempDir dir;
  testing::WriteFileBytes(dir.File("bad.jsonl"), "{\"x\": 1}\n[1, 2]\n");
  EXPECT_NE(ConvertErrorOf([&] {
              SourceExamples("jsonl", {.files = {dir.File("bad.jsonl")}});
            }).find(dir.File("bad.jsonl") + ":2: expected one JSON "),
            std::string::npos);
}

// Each bad line is one row's error, naming the file, line and key and what
// was there; none is converted as something else (an integer past int64
// wrapped to a negative number before).
TEST(JsonlTest, BadLinesSayWhatWasFoundWhere) {
  testing::TempDir dir;
  const std::string f = dir.File("in.jsonl");
  const auto error = [&](const std::string& lines) {
    testing::WriteFileBytes(f, lines);
    return ConvertErrorOf([&] { SourceExamples("jsonl", {.files = {f}}); });
  };
  EXPECT_EQ(error("{\"a\": 1}\n{\"a\": 9223372036854775807}\n"), "");
  EXPECT_EQ(error("{\"a\": 1}\n{\"a\": 18446744073709551615}\n"),
            f + ":2: key 'a': 18446744073709551615 does not fit in int64");
  EXPECT_EQ(error("{\"a\": [1, 9223372036854775808]}\n"),
            f + ":1: key 'a': 9223372036854775808 does not fit in int64");
  EXPECT_EQ(error("{\"a\": 1}\n[1, 2]\n"),
            f + ":2: expected one JSON object per line, found array");
  EXPECT_EQ(error("{\"a\": tru}\n"),
            f + ":1: not JSON: parse error at column 10: syntax error while "
                "parsing value - invalid literal; last read: '\"a\": tru}'");
  EXPECT_EQ(error("{\"a\": 1e400}\n"),
            f + ":1: not JSON: number overflow parsing '1e400'");
  EXPECT_EQ(error("{\"a\": {\"b\": 1}}\n"),
            f + ":1: key 'a': expected feature values (numbers, strings, "
                "booleans, or lists of one of them), found {\"b\":1}");
  EXPECT_EQ(error("{\"a\": [1, \"x\"]}\n"),
            f + ":1: key 'a': expected string values (numbers, strings, "
                "booleans, or lists of one of them), found [1,\"x\"]");
}

}  // namespace
}  // namespace recflow::convert
