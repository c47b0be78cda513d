// convert/csv.cc: RFC 4180 rows, typed columns, and row errors.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "convert/sources.h"
#include "convert_test_util.h"
#include "records/example_builder.h"

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

// The typing pass reads rows on one thread and types them on every core
// in chunks (of 1,024 rows, one file's each), merged in input order: the
// columns get the types, and the first rounded integer the place, that
// typing row by row gives, across chunks and files, with quoted newlines,
// blank lines and bad rows (counted, typing nothing) among the rows.
// A file separated by tabs, ';' or '|' read with a comma: its header is
// one column whose name holds them.  The rows convert as one cell each
// (it may be meant), said in a warning; a row the comma splits is a bad
// row saying the same.
TEST(CsvTest, AHeaderOfOneColumnHoldingAnotherDelimiterIsSaid) {
  testing::TempDir dir;
  const std::string f = dir.File("in.csv");
  const auto warnings = [&](const std::string& text, char delimiter = ',') {
    testing::WriteFileBytes(f, text);
    return convert::OpenSource("csv", {.files = {f}, .delimiter = delimiter})
        ->warnings();
  };
  EXPECT_EQ(warnings("a\tb\n1\t2\n"),
            std::vector<std::string>{
                f + ":1: the header is a single column whose name holds "
                    "tabs: if tabs separate the columns, give --delimiter "
                    "tab"});
  EXPECT_EQ(warnings("a;b\n1;2\n"),
            std::vector<std::string>{
                f + ":1: the header is a single column whose name holds ';' "
                    "characters: if they separate the columns, give "
                    "--delimiter ';'"});
  EXPECT_EQ(warnings("a|b\n1|2\n").size(), 1u);
  EXPECT_TRUE(warnings("a\tb\n1\t2\n", '\t').empty());
  EXPECT_TRUE(warnings("a;b\n1;2\n", ';').empty());
  EXPECT_TRUE(warnings("a b\n1 2\n").empty());      // one column, as meant
  EXPECT_TRUE(warnings("a;b,c\n1;2,3\n").empty());  // two columns
  testing::WriteFileBytes(f, "a;b;c\n1;2,5;3\n");
  EXPECT_EQ(ConvertErrorOf([&] { SourceExamples("csv", {.files = {f}}); }),
            f + ":2: 2 fields, the header has 1; the header is a single "
                "column whose name holds ';' characters: if they separate "
                "the columns, give --delimiter ';'");
}

TEST(CsvTest, ColumnsAreTypedInRowOrderAcrossChunksAndFiles) {
  testing::TempDir dir;
  std::mt19937_64 rng(7);
  constexpr int kColumns = 13;
  // Per column: rows before `start` (of all files' rows) leave it empty;
  // from `start`, cells of kind `first` (0: int, 1: float, 2: text); from
  // `later`, of any kind `kinds` allows (bit k: kind k).
  struct Column {
    uint64_t start = 0;
    unsigned kinds = 0;
    unsigned first = 0;
    uint64_t later = 0;
    CellType type = CellType::kNone;  // the rows one by one
    uint64_t rounded = 0;             // integers a float32 rounds
    std::string first_rounded;        // "file:line"
  };
  const std::vector<int> rows_in = {2500, 0, 1700, 3100};
  const uint64_t all_rows = 2500 + 1700 + 3100;
  std::vector<Column> columns;
  std::string header;
  for (int k = 0; k < kColumns; ++k) {
    const unsigned kinds = k == 0 ? 0 : 1 + (k - 1) % 7;  // each mix
    unsigned first = 0;
    while (kinds != 0 && (kinds & (1u << first)) == 0) first = rng() % 3;
    Column& c = columns.emplace_back();
    c.start = rng() % all_rows;
    c.kinds = kinds;
    c.first = first;
    c.later = c.start + rng() % (all_rows - c.start);
    header += fmt::format("{}c{}", k == 0 ? "" : ",", k);
  }
  std::vector<std::string> files;
  std::vector<bool> bad;  // of each row, in order
  uint64_t row_index = 0;
  for (size_t f = 0; f < rows_in.size(); ++f) {
    files.push_back(dir.File(fmt::format("in{}.csv", f)));
    std::string text = header + "\n";
    uint64_t line = 2;  // of the next row
    for (int r = 0; r < rows_in[f]; ++r, ++row_index) {
      if (rng() % 50 == 0) {
        text += "\n";  // blank: no row
        ++line;
      }
      // The last row of the first file and the first of the third (the
      // second has none) meet in one chunk unless a chunk ends at a file's
      // end, as it must for the rounded integer's place to name its file.
      const bool edge = (f == 0 && r == rows_in[0] - 1) || (f == 2 && r == 0);
      if (!edge && rng() % 97 == 0) {  // text after a closing quote: bad
        text += "\"q\"x,1,2\n";
        ++line;
        bad.push_back(true);
        continue;
      }
      bad.push_back(false);
      const uint64_t row_line = line;
      for (int k = 0; k < kColumns; ++k) {
        Column& c = columns[k];
        if (k > 0) text += ',';
        unsigned kind = c.first;
        int64_t v = static_cast<int64_t>(rng() % 100);
        if (k == kColumns - 1) {  // at the edge only: a rounded int, a float
          if (!edge) continue;
          kind = f == 0 ? 0 : 1;
          v = (int64_t{1} << 24) + 1;
        } else {
          if (row_index < c.start || c.kinds == 0) continue;  // empty
          if (row_index >= c.later) {
            do kind = rng() % 3;
            while ((c.kinds & (1u << kind)) == 0);
          }
          if (rng() % 4 == 0) v += (int64_t{1} << 24) + 1;  // may round
        }
        CellType type;
        switch (kind) {
          case 0:
            text += std::to_string(v);
            type = CellType::kInt64;
            if (InexactIntegers::Rounded(v).has_value() && c.rounded++ == 0) {
              c.first_rounded = fmt::format("{}:{}", files[f], row_line);
            }
            break;
          case 1:
            text += fmt::format("{}.5", v % 100);
            type = CellType::kFloat;
            break;
          default:
            if (rng() % 8 == 0) {  // quoted, over two lines
              text += fmt::format("\"s,{}\nt\"", v);
              ++line;
            } else {
              text += fmt::format("s{}", v);
            }
            type = CellType::kBytes;
            break;
        }
        c.type = Widen(c.type, type);
      }
      text += "\n";
      ++line;
    }
    testing::WriteFileBytes(files.back(), text);
  }
  auto source = OpenSource("csv", {.files = files});
  ASSERT_EQ(source->rows(), all_rows);
  // Every cell's feature has its column's type.
  Row row;
  records::ExampleBuilder builder;
  for (size_t i = 0; i < bad.size(); ++i) {
    ASSERT_TRUE(source->NextRow(&row));
    ASSERT_EQ(row.error.empty(), !bad[i]) << "row " << i << ": " << row.error;
    if (bad[i]) continue;
    builder.Clear();
    source->Build(row, &builder);
    tensorflow::Example ex;
    ASSERT_TRUE(ex.ParseFromString(std::string(builder.Serialize())));
    for (int k = 0; k < kColumns; ++k) {
      const auto* feature = Get(ex, fmt::format("c{}", k));
      ASSERT_EQ(feature != nullptr, !row.fields[k].empty());
      if (feature == nullptr) continue;
      const CellType got = feature->has_int64_list()   ? CellType::kInt64
                           : feature->has_float_list() ? CellType::kFloat
                                                       : CellType::kBytes;
      ASSERT_EQ(static_cast<int>(got), static_cast<int>(columns[k].type))
          << "row " << i << ", column c" << k;
    }
  }
  EXPECT_FALSE(source->NextRow(&row));
  // The warnings, in column order: c0 empty, and each float column's
  // rounded integers with the first one's place.
  std::vector<std::string> want = {
      "column 'c0' is empty in every row: no feature is written for it (no "
      "value to infer its type from; a --spec entry gives it one)"};
  std::vector<std::string> counts = {""};
  for (int k = 0; k < kColumns; ++k) {
    const Column& c = columns[k];
    if (c.type == CellType::kFloat && c.rounded > 0) {
      want.push_back(fmt::format("{}: column 'c{}'", c.first_rounded, k));
      counts.push_back(fmt::format("{} such value{} in all", c.rounded,
                                   c.rounded == 1 ? "" : "s"));
    }
  }
  const std::vector<std::string> warnings = source->warnings();
  ASSERT_EQ(warnings.size(), want.size());
  EXPECT_EQ(warnings[0], want[0]);
  for (size_t w = 1; w < warnings.size(); ++w) {
    EXPECT_EQ(warnings[w].rfind(want[w], 0), 0u) << warnings[w];
    EXPECT_NE(warnings[w].find(counts[w]), std::string::npos) << warnings[w];
  }
  // What the test reaches: columns of every type, rounding warned of, and
  // bad rows.
  std::set<CellType> types;
  for (const Column& c : columns) types.insert(c.type);
  EXPECT_EQ(types.size(), 4u);
  EXPECT_GT(warnings.size(), 1u);
  EXPECT_GT(std::count(bad.begin(), bad.end(), true), 10);
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
