// convert/csv.cc: RFC 4180 rows, typed columns, and row errors.
#include <gtest/gtest.h>

#include "convert_test_util.h"

namespace recflow::convert {
namespace {

using testing::ConvertErrorOf;
using testing::Get;
using testing::SourceExamples;

TEST(CsvTest, ColumnsAreTypedFromEveryCellOrTheSpec) {
  testing::TempDir dir;
  testing::WriteFileBytes(dir.File("in.csv"),
                          "id,score,name,code\r\n"
                          "1,2,\"Smith, Jane\",7\r\n"
                          "2,2.5,\"two\nlines\",8\r\n"
                          "3,,bob,9\n");
  const auto spec = records::FeatureSpec::FromJsonText(
      R"({"features": {"code": {"kind": "fixed", "dtype": "bytes", "shape": []}}})");
  const auto ex =
      SourceExamples("csv", {.files = {dir.File("in.csv")}, .spec = &spec});
  ASSERT_EQ(ex.size(), 3u);
  EXPECT_EQ(Get(ex[0], "id")->int64_list().value(0), 1);
  // 2 then 2.5: the column widens to float, the 2 with it.
  EXPECT_FLOAT_EQ(Get(ex[0], "score")->float_list().value(0), 2.0f);
  EXPECT_EQ(Get(ex[1], "name")->bytes_list().value(0), "two\nlines");
  EXPECT_EQ(Get(ex[2], "code")->bytes_list().value(0), "9");  // the spec's
  EXPECT_EQ(Get(ex[2], "score"), nullptr);                    // empty cell
  // A spec naming a column the header lacks (a typo) is refused.
  const auto typo = records::FeatureSpec::FromJsonText(
      R"({"features": {"cdoe": {"dtype": "bytes"}}})");
  EXPECT_EQ(ConvertErrorOf([&] {
              SourceExamples("csv",
                             {.files = {dir.File("in.csv")}, .spec = &typo});
            }),
            dir.File("in.csv") +
                ":1: --spec names column 'cdoe', which the "
                "header (id, score, name, code) does not "
                "have");
}

// A column every row leaves empty, and integers that a float column's
// float32 rounds, are said (as JSON Lines' keys): they write no feature,
// or change a value, with nothing else to show it.
TEST(CsvTest, EmptyColumnsAndIntegersAFloatRoundsAreWarnedOf) {
  testing::TempDir dir;
  const std::string f = dir.File("in.csv");
  testing::WriteFileBytes(f,
                          "id,empty,score\n"
                          "123456789,,16777217\n"
                          "2,,0.5\n"
                          "3,,-16777219\n");
  const auto warnings = convert::OpenSource("csv", {.files = {f}})->warnings();
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_EQ(warnings[0],
            "column 'empty' is empty in every row: no feature is written for "
            "it (no value to infer its type from; a --spec entry gives it "
            "one)");
  EXPECT_EQ(warnings[1],
            f + ":2: column 'score': the integer 16777217 becomes 16777216 in "
                "the column's float feature (float32 holds integers exactly "
                "only up to 2^24; 2 such values in all); if every value is an "
                "integer, a --spec entry of dtype int64 keeps them exact");
  // A header and no row: nothing is empty "in every row".
  testing::WriteFileBytes(f, "id,empty\n");
  EXPECT_TRUE(convert::OpenSource("csv", {.files = {f}})->warnings().empty());
}

// A cell its spec'd column cannot hold: the same words as the pipeline's
// CSV source (records::CsvCellError).
TEST(CsvTest, ACellItsColumnCannotHoldNamesTheFileLineAndColumn) {
  testing::TempDir dir;
  const std::string f = dir.File("in.csv");
  testing::WriteFileBytes(f, "a,b\n1,2\nx,y\n");
  const auto spec = records::FeatureSpec::FromJsonText(
      R"({"features": {"a": {"dtype": "float32"}, "b": {"dtype": "int64"}}})");
  EXPECT_EQ(ConvertErrorOf(
                [&] { SourceExamples("csv", {.files = {f}, .spec = &spec}); }),
            f + ":3: column 'a': expected a number, found \"x\"");
  testing::WriteFileBytes(f, "a,b\n1e39,2\n");
  EXPECT_EQ(ConvertErrorOf(
                [&] { SourceExamples("csv", {.files = {f}, .spec = &spec}); }),
            f + ":2: column 'a': 1e39 is outside float32's range (a float "
                "would be inf)");
  testing::WriteFileBytes(f, "a,b\n1,2.5\n");
  EXPECT_EQ(ConvertErrorOf(
                [&] { SourceExamples("csv", {.files = {f}, .spec = &spec}); }),
            f + ":2: column 'b': expected an integer, found \"2.5\"");
}

TEST(CsvTest, ARowWithTooFewFieldsNamesTheFileAndLine) {
  testing::TempDir dir;
  testing::WriteFileBytes(dir.File("in.csv"), "a,b\n1,2\n5\n");
  EXPECT_EQ(ConvertErrorOf([&] {
              SourceExamples("csv", {.files = {dir.File("in.csv")}});
            }),
            dir.File("in.csv") + ":3: 1 fields, the header has 2");
  testing::WriteFileBytes(dir.File("empty.csv"), "");
  EXPECT_NE(ConvertErrorOf([&] {
              OpenSource("csv", {.files = {dir.File("empty.csv")}});
            }).find("empty; a CSV file starts with a header row"),
            std::string::npos);
}

}  // namespace
}  // namespace recflow::convert
