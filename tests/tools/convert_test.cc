// `recflow convert`, `cat` and `inspect` end to end, on files written here
// in each input format.
#include <fmt/format.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "recflow_runner.h"
#include "records/example.pb.h"
#include "records/example_parser.h"
#include "records/feature_spec.h"
#include "records/index.h"
#include "records/tfrecord_writer.h"
#include "test_util.h"

namespace recflow::tools {
namespace {

using testing::Be32;
using testing::NpyBytes;
using testing::Raw;
using testing::TempDir;
using testing::Zip;

using testing::Recflow;
using testing::Result;

// Every Example in the shards PREFIX-*-of-0000N.tfrecord, shard by shard.
std::vector<tensorflow::Example> ReadExamples(const TempDir& dir,
                                              const std::string& prefix,
                                              int shards) {
  std::vector<tensorflow::Example> out;
  for (int s = 0; s < shards; ++s) {
    const std::string path =
        dir.File(prefix + "-0000" + std::to_string(s) + "-of-0000" +
                 std::to_string(shards) + ".tfrecord");
    for (const auto& r : testing::ReadRecords(path)) {
      tensorflow::Example ex;
      EXPECT_TRUE(ex.ParseFromString(r));
      out.push_back(ex);
    }
  }
  return out;
}

const tensorflow::Feature* Get(const tensorflow::Example& ex,
                               const std::string& key) {
  const auto& m = ex.features().feature();
  auto it = m.find(key);
  return it == m.end() ? nullptr : &it->second;
}

TEST(ConvertTest, CsvWithQuotingTypesAndAbsentCells) {
  TempDir dir;
  testing::WriteFileBytes(dir.File("in.csv"),
                          "id,name,score,note\r\n"
                          "1,\"Smith, Jane\",2.5,plain\r\n"
                          "2,\"say \"\"hi\"\"\",3,\"two\nlines\"\r\n"
                          "3,bob,,\n");
  const Result r = Recflow(dir, "convert csv " + dir.File("in.csv") + " -o " +
                                    dir.File("out") + " --shards 1");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto ex = ReadExamples(dir, "out", 1);
  ASSERT_EQ(ex.size(), 3u);
  EXPECT_EQ(Get(ex[0], "id")->int64_list().value(0), 1);
  EXPECT_EQ(Get(ex[0], "name")->bytes_list().value(0), "Smith, Jane");
  EXPECT_FLOAT_EQ(Get(ex[0], "score")->float_list().value(0), 2.5f);
  EXPECT_EQ(Get(ex[1], "name")->bytes_list().value(0), "say \"hi\"");
  EXPECT_FLOAT_EQ(Get(ex[1], "score")->float_list().value(0), 3.0f);
  EXPECT_EQ(Get(ex[1], "note")->bytes_list().value(0), "two\nlines");
  EXPECT_EQ(Get(ex[2], "score"), nullptr);  // empty cell: absent
  EXPECT_EQ(Get(ex[2], "note"), nullptr);
}

TEST(ConvertTest, TsvAndOtherDelimiters) {
  TempDir dir;
  testing::WriteFileBytes(dir.File("in.tsv"),
                          "id\tname\n1\t\"Smith\tJane\"\n2\tbob, jr\n");
  for (const char* tab : {"tab", "'\\t'"}) {
    const Result r =
        Recflow(dir, fmt::format("convert csv {} -o {} --delimiter {}",
                                 dir.File("in.tsv"), dir.File("out"), tab));
    ASSERT_EQ(r.code, 0) << r.err;
    const auto ex = ReadExamples(dir, "out", 1);
    ASSERT_EQ(ex.size(), 2u) << tab;
    EXPECT_EQ(Get(ex[0], "id")->int64_list().value(0), 1);
    EXPECT_EQ(Get(ex[0], "name")->bytes_list().value(0), "Smith\tJane");
    EXPECT_EQ(Get(ex[1], "name")->bytes_list().value(0), "bob, jr");
  }
  Result r = Recflow(dir, "convert csv " + dir.File("in.tsv") + " -o " +
                              dir.File("x") + " --delimiter ab");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "recflow: --delimiter 'ab': expected one character (or tab)\n");
  r = Recflow(dir, "convert csv " + dir.File("in.tsv") + " -o " +
                       dir.File("x") + " --delimiter '\"'");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "recflow: --delimiter: CSV delimiter '\"': a quote or line end "
            "cannot separate fields\n");
  r = Recflow(dir, "convert jsonl " + dir.File("in.tsv") + " -o " +
                       dir.File("x") + " --delimiter tab");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "recflow: --delimiter is for csv, not jsonl\n");
}

TEST(ConvertTest, BadCsvRowNamesFileAndLineAndLeavesNoShards) {
  TempDir dir;
  testing::WriteFileBytes(dir.File("in.csv"), "a,b\n1,2\n3,4\n5\n6,7\n");
  const Result r = Recflow(dir, "convert csv " + dir.File("in.csv") + " -o " +
                                    dir.File("out") + " --shards 2");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find(dir.File("in.csv") + ":4: 1 fields, the header has 2"),
            std::string::npos)
      << r.err;
  for (const auto& name : dir.List()) {
    EXPECT_EQ(name.find("out-"), std::string::npos) << name;
  }
  const Result skip =
      Recflow(dir, "convert csv --skip-bad --json " + dir.File("in.csv") +
                       " -o " + dir.File("out") + " --shards 2");
  ASSERT_EQ(skip.code, 0) << skip.err;
  const auto j = nlohmann::json::parse(skip.out);
  EXPECT_EQ(j["records"], 3);
  EXPECT_EQ(j["skipped"], 1);
  EXPECT_EQ(ReadExamples(dir, "out", 2).size(), 3u);
}

// --max-record-bytes: a row whose Example would be longer is a bad row
// (by default 2 GiB, what readers take); 0 is refused.
TEST(ConvertTest, MaxRecordBytesMakesLongerRowsBad) {
  TempDir dir;
  testing::WriteFileBytes(dir.File("in.csv"),
                          "a,b\n1,2\n3," + std::string(300, 'x') + "\n5,6\n");
  const std::string convert =
      "convert csv " + dir.File("in.csv") + " -o " + dir.File("out");
  EXPECT_EQ(Recflow(dir, convert).code, 0);
  const Result r = Recflow(dir, convert + " --max-record-bytes 200");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find(dir.File("in.csv") + ":3: its record is "),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("more than the 200 a record may have"),
            std::string::npos)
      << r.err;
  const Result skip =
      Recflow(dir, convert + " --max-record-bytes 200 --skip-bad --json");
  ASSERT_EQ(skip.code, 0) << skip.err;
  EXPECT_EQ(nlohmann::json::parse(skip.out)["skipped"], 1);
  EXPECT_EQ(ReadExamples(dir, "out", 1).size(), 2u);
  EXPECT_EQ(Recflow(dir, convert + " --max-record-bytes 0").code, 2);
}

// --max-row-bytes: a csv or jsonl row that is longer ends the conversion
// (even with --skip-bad), writing nothing; other formats refuse it, as 0.
TEST(ConvertTest, MaxRowBytesEndsTheConversionAtALongerRow) {
  TempDir dir;
  testing::WriteFileBytes(dir.File("in.jsonl"),
                          "{\"a\": 1}\n{\"a\": 22}\n{\"a\": 3}\n");
  const std::string convert =
      "convert jsonl " + dir.File("in.jsonl") + " -o " + dir.File("out");
  EXPECT_EQ(Recflow(dir, convert + " --max-row-bytes 9").code, 0);
  EXPECT_EQ(ReadExamples(dir, "out", 1).size(), 3u);
  std::filesystem::remove(dir.File("out-00000-of-00001.tfrecord"));
  const Result r = Recflow(dir, convert + " --max-row-bytes 8 --skip-bad");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "recflow: " + dir.File("in.jsonl") +
                       ":2: the line is longer than 8 bytes, the most a row "
                       "may hold (max_row_bytes)\n");
  for (const auto& name : dir.List()) {
    EXPECT_EQ(name.find("out-"), std::string::npos) << name;
  }
  testing::WriteFileBytes(dir.File("x.npy"),
                          testing::NpyBytes("<f4", "(1,)", std::string(4, 0)));
  const Result npy = Recflow(dir, "convert npy " + dir.File("x.npy") + " -o " +
                                      dir.File("out") + " --max-row-bytes 9");
  EXPECT_EQ(npy.code, 2);
  EXPECT_EQ(npy.err,
            "recflow: --max-row-bytes is for csv and jsonl, not npy\n");
  EXPECT_EQ(Recflow(dir, convert + " --max-row-bytes 0").code, 2);
}

// The source's warnings reach the user: on stderr, one line each, and in
// --json's "warnings"; the shards are written.
TEST(ConvertTest, WarningsArePrintedAndInTheJson) {
  TempDir dir;
  testing::WriteFileBytes(dir.File("in.jsonl"),
                          "{\"a\": 1, \"n\": null}\n{\"a\": 0.5}\n");
  Result r = Recflow(
      dir, "convert jsonl " + dir.File("in.jsonl") + " -o " + dir.File("out"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err,
            "recflow: warning: key 'n' is null or [] in every row that has "
            "it: no feature is written for it (no value to infer its type "
            "from; a --spec entry gives it one)\n");
  r = Recflow(dir, "convert jsonl --json " + dir.File("in.jsonl") + " -o " +
                       dir.File("out"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = r.Json();
  ASSERT_EQ(j["warnings"].size(), 1u);
  EXPECT_EQ(j["warnings"][0].get<std::string>().substr(0, 8), "key 'n' ");
  EXPECT_EQ(ReadExamples(dir, "out", 1).size(), 2u);
}

// What a CSV's header or a spec'd column can get wrong, each named with
// its file and line: files whose headers differ, an empty header name, a
// quote error counted as a bad row in the first pass, and text in a column
// the spec types as int64.
TEST(ConvertTest, CsvHeadersAndSpecTypedColumnsAreChecked) {
  TempDir dir;
  testing::WriteFileBytes(dir.File("a.csv"), "id,name\n1,x\n");
  testing::WriteFileBytes(dir.File("b.csv"), "id,nom\n2,y\n");
  testing::WriteFileBytes(dir.File("empty.csv"), "id,\n1,x\n");
  const auto convert = [&](const std::string& args) {
    return Recflow(dir, "convert csv " + args + " -o " + dir.File("out"));
  };
  Result r = convert(dir.File("a.csv") + " " + dir.File("b.csv"));
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "recflow: " + dir.File("b.csv") +
                       ":1: header differs from " + dir.File("a.csv") + "'s\n");
  r = convert(dir.File("a.csv") + " " + dir.path().string() + "/./a.csv");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "recflow: " + dir.path().string() +
                       "/./a.csv is named twice (also as " + dir.File("a.csv") +
                       "): convert would convert its rows twice\n");
  r = convert(dir.File("empty.csv"));
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "recflow: " + dir.File("empty.csv") +
                       ":1: column 2 of the header: names must be non-empty "
                       "UTF-8\n");
  // Two columns of one name: the second's cells would hide the first's.
  testing::WriteFileBytes(dir.File("twice.csv"), "id,x,id\n1,2,3\n");
  r = convert(dir.File("twice.csv"));
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "recflow: " + dir.File("twice.csv") +
                       ":1: columns 1 and 3 of the header are both named "
                       "'id'; names must differ\n");
  // A spec making `id` int64: a row with text there is a bad row.
  testing::WriteFileBytes(dir.File("ids.csv"),
                          "id,name\n1,x\n\"2\"z,y\nabc,z\n4,w\n");
  testing::WriteFileBytes(dir.File("spec.json"), R"({"features": {
      "id": {"kind": "fixed", "dtype": "int64", "shape": []}}})");
  r = convert(dir.File("ids.csv") + " --spec " + dir.File("spec.json"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find(dir.File("ids.csv") +
                       ":3: unexpected 'z' after a closing quote"),
            std::string::npos)
      << r.err;
  r = convert(dir.File("ids.csv") + " --spec " + dir.File("spec.json") +
              " --skip-bad --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["records"], 2);
  EXPECT_EQ(j["skipped"], 2);
  EXPECT_NE(
      r.err.find("the first: " + dir.File("ids.csv") + ":3: unexpected 'z'"),
      std::string::npos)
      << r.err;
  testing::WriteFileBytes(dir.File("text.csv"), "id,name\n1,x\nabc,z\n");
  r = convert(dir.File("text.csv") + " --spec " + dir.File("spec.json"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find(dir.File("text.csv") +
                       ":3: column 'id': expected an integer, found \"abc\""),
            std::string::npos)
      << r.err;
}

// Numbers at float32's edges: 1e-50 is a (zero) float, not text that
// turns the column into bytes; 1e39 is a bad row in CSV and JSON Lines
// alike, never a stored inf; "+5" is the integer 5.
TEST(ConvertTest, NumbersPastFloat32AreRowErrorsNotInfinities) {
  TempDir dir;
  testing::WriteFileBytes(dir.File("a.csv"), "x,n\n1e-50,+5\n2.5,6\n");
  Result r =
      Recflow(dir, "convert csv " + dir.File("a.csv") + " -o " + dir.File("a"));
  ASSERT_EQ(r.code, 0) << r.err;
  auto ex = ReadExamples(dir, "a", 1);
  ASSERT_EQ(ex.size(), 2u);
  ASSERT_TRUE(Get(ex[0], "x")->has_float_list());
  EXPECT_EQ(Get(ex[0], "x")->float_list().value(0), 0.0f);
  EXPECT_EQ(Get(ex[0], "n")->int64_list().value(0), 5);
  testing::WriteFileBytes(dir.File("b.csv"), "x\n1.5\n1e39\n");
  r = Recflow(dir, "convert csv " + dir.File("b.csv") + " -o " + dir.File("b"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find(dir.File("b.csv") +
                       ":3: column 'x': 1e39 is outside float32's range"),
            std::string::npos)
      << r.err;
  testing::WriteFileBytes(dir.File("c.jsonl"),
                          "{\"x\": 1.5}\n{\"x\": [1, 1e39]}\n");
  r = Recflow(dir,
              "convert jsonl " + dir.File("c.jsonl") + " -o " + dir.File("c"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find(dir.File("c.jsonl") +
                       ":2: key 'x': 1e+39 is outside float32's range"),
            std::string::npos)
      << r.err;
}

// Rows are built on several threads but reach the shards in input order,
// and the bad row reported is the first one in the input.
TEST(ConvertTest, ManyRowsKeepTheirOrderAndTheFirstBadRowIsReported) {
  TempDir dir;
  std::string csv = "id,v\n";
  for (int i = 0; i < 20000; ++i) {
    csv += std::to_string(i) + "," + std::to_string(i * 0.5) + "\n";
  }
  testing::WriteFileBytes(dir.File("good.csv"), csv);
  ASSERT_EQ(Recflow(dir, "convert csv " + dir.File("good.csv") + " -o " +
                             dir.File("out"))
                .code,
            0);
  const auto ex = ReadExamples(dir, "out", 1);
  ASSERT_EQ(ex.size(), 20000u);
  for (int i = 0; i < 20000; ++i) {
    ASSERT_EQ(Get(ex[i], "id")->int64_list().value(0), i);
  }
  std::string bad = "id,v\n";
  for (int i = 0; i < 20000; ++i) {
    bad += i == 3000 || i == 15000 ? std::to_string(i) + "\n"
                                   : std::to_string(i) + ",1\n";
  }
  testing::WriteFileBytes(dir.File("bad.csv"), bad);
  for (int run = 0; run < 3; ++run) {
    const Result r = Recflow(
        dir, "convert csv " + dir.File("bad.csv") + " -o " + dir.File("bad"));
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find("bad.csv:3002: 1 fields"), std::string::npos) << r.err;
  }
}

TEST(ConvertTest, UsageErrorsExitTwo) {
  TempDir dir;
  EXPECT_EQ(Recflow(dir, "convert parquet x -o " + dir.File("o")).code, 2);
  const Result missing = Recflow(
      dir, "convert csv " + dir.File("none.csv") + " -o " + dir.File("o"));
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.err.find("none.csv: no such file"), std::string::npos);
}

TEST(ConvertTest, JsonLinesWithListsNullsAndWidening) {
  TempDir dir;
  testing::WriteFileBytes(
      dir.File("in.jsonl"),
      "{\"x\": 1, \"v\": [1, 2], \"s\": \"a\", \"b\": true}\n"
      "\n"
      "{\"x\": 2.5, \"v\": [3.5], \"s\": [\"b\", \"c\"], "
      "\"b\": null}\n");
  const Result r = Recflow(
      dir, "convert jsonl " + dir.File("in.jsonl") + " -o " + dir.File("out"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto ex = ReadExamples(dir, "out", 1);
  ASSERT_EQ(ex.size(), 2u);
  // x and v hold a float somewhere: float in every record.
  EXPECT_FLOAT_EQ(Get(ex[0], "x")->float_list().value(0), 1.0f);
  EXPECT_EQ(Get(ex[0], "v")->float_list().value_size(), 2);
  EXPECT_FLOAT_EQ(Get(ex[1], "x")->float_list().value(0), 2.5f);
  EXPECT_EQ(Get(ex[1], "s")->bytes_list().value(1), "c");
  EXPECT_EQ(Get(ex[0], "b")->int64_list().value(0), 1);
  EXPECT_EQ(Get(ex[1], "b"), nullptr);

  testing::WriteFileBytes(dir.File("bad.jsonl"), "{\"x\": 1}\n[1, 2]\n");
  const Result bad = Recflow(
      dir, "convert jsonl " + dir.File("bad.jsonl") + " -o " + dir.File("bad"));
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find(dir.File("bad.jsonl") + ":2: expected one JSON "
                                                 "object per line"),
            std::string::npos)
      << bad.err;

  // A key twice in one line: JSON parsers keep the last value, which would
  // lose the first; keys in nested values are not the line's.
  testing::WriteFileBytes(dir.File("twice.jsonl"),
                          "{\"x\": 1, \"v\": [2]}\n"
                          "{\"x\": 1, \"v\": [3], \"x\": 4}\n"
                          "{\"x\": 5, \"n\": \"{\\\"x\\\": 6}\"}\n"
                          "{\"x\": 7, \"q\\\",\": [\"a,]\", \"b\"]}\n");
  const Result twice = Recflow(dir, "convert jsonl " + dir.File("twice.jsonl") +
                                        " -o " + dir.File("twice"));
  EXPECT_EQ(twice.code, 1);
  EXPECT_EQ(twice.err, "recflow: " + dir.File("twice.jsonl") +
                           ":2: key \"x\" appears twice; keys must differ\n");
  const Result skipped =
      Recflow(dir, "convert jsonl --skip-bad " + dir.File("twice.jsonl") +
                       " -o " + dir.File("skipped"));
  ASSERT_EQ(skipped.code, 0) << skipped.err;
  const auto kept = ReadExamples(dir, "skipped", 1);
  ASSERT_EQ(kept.size(), 3u);
  EXPECT_EQ(Get(kept[0], "x")->int64_list().value(0), 1);
  EXPECT_EQ(Get(kept[1], "x")->int64_list().value(0), 5);
  EXPECT_EQ(Get(kept[1], "n")->bytes_list().value(0), "{\"x\": 6}");
  EXPECT_EQ(Get(kept[2], "q\",")->bytes_list().value(0), "a,]");
}

TEST(ConvertTest, NpyArraysOneExamplePerRow) {
  TempDir dir;
  testing::WriteFileBytes(
      dir.File("x.npy"),
      NpyBytes("<f4", "(3, 2)", Raw(std::vector<float>{1, 2, 3, 4, 5, 6})));
  testing::WriteFileBytes(
      dir.File("y.npy"),
      NpyBytes("<i2", "(3,)", Raw(std::vector<int16_t>{-1, 0, 7})));
  const Result r =
      Recflow(dir, "convert npy " + dir.File("x.npy") + " " +
                       dir.File("y.npy") + " -o " + dir.File("out"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto ex = ReadExamples(dir, "out", 1);
  ASSERT_EQ(ex.size(), 3u);
  EXPECT_EQ(Get(ex[2], "x")->float_list().value(1), 6.0f);
  EXPECT_EQ(Get(ex[0], "y")->int64_list().value(0), -1);
  testing::WriteFileBytes(dir.File("short.npy"),
                          NpyBytes("<f4", "(3,)", Raw(std::vector<float>{1})));
  const Result bad = Recflow(
      dir, "convert npy " + dir.File("short.npy") + " -o " + dir.File("bad"));
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("data ends before row 1 of 3"), std::string::npos)
      << bad.err;
}

// float16 (exact as float32) and Unicode strings (UTF-32 in the file,
// UTF-8 in the Example) convert; a float64 past float32's range is a bad
// row, never inf; an object array (pickles) is refused by what it is.
TEST(ConvertTest, NpyHalfFloatsUnicodeAndWhatCannotBeRead) {
  TempDir dir;
  // 1.5 and -2; below, 65504 (the largest half) and 2^-24 (the smallest
  // subnormal).
  testing::WriteFileBytes(
      dir.File("h.npy"),
      NpyBytes("<f2", "(2,)", Raw(std::vector<uint16_t>{0x3e00, 0xc000})));
  // ["h\u00e9", "\U0001f600"] as <U2: four bytes a character, NUL-padded.
  testing::WriteFileBytes(
      dir.File("u.npy"),
      NpyBytes("<U2", "(2,)",
               Raw(std::vector<uint32_t>{'h', 0xe9, 0x1f600, 0})));
  Result r = Recflow(dir, "convert npy " + dir.File("h.npy") + " " +
                              dir.File("u.npy") + " -o " + dir.File("out"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto ex = ReadExamples(dir, "out", 1);
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_EQ(Get(ex[0], "h")->float_list().value(0), 1.5f);
  EXPECT_EQ(Get(ex[1], "h")->float_list().value(0), -2.0f);
  EXPECT_EQ(Get(ex[0], "u")->bytes_list().value(0), "h\xc3\xa9");
  EXPECT_EQ(Get(ex[1], "u")->bytes_list().value(0), "\xf0\x9f\x98\x80");
  testing::WriteFileBytes(
      dir.File("h2.npy"),
      NpyBytes("<f2", "(2,)", Raw(std::vector<uint16_t>{0x7bff, 0x0001})));
  r = Recflow(dir,
              "convert npy " + dir.File("h2.npy") + " -o " + dir.File("out2"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto edge = ReadExamples(dir, "out2", 1);
  EXPECT_EQ(Get(edge[0], "h2")->float_list().value(0), 65504.0f);
  EXPECT_EQ(Get(edge[1], "h2")->float_list().value(0), std::ldexp(1.0f, -24));

  testing::WriteFileBytes(
      dir.File("big.npy"),
      NpyBytes("<f8", "(2,)", Raw(std::vector<double>{1.5, 1e300})));
  r = Recflow(dir,
              "convert npy " + dir.File("big.npy") + " -o " + dir.File("bad"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find(dir.File("big.npy") +
                       ": row 1: float64 value 1e+300 is outside float32's "
                       "range"),
            std::string::npos)
      << r.err;
  testing::WriteFileBytes(dir.File("o.npy"),
                          NpyBytes("|O", "(1,)", "xxxxxxxx"));
  r = Recflow(dir,
              "convert npy " + dir.File("o.npy") + " -o " + dir.File("bad"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("dtype '|O': an object array (pickled Python objects) "
                       "cannot be read"),
            std::string::npos)
      << r.err;
}

TEST(ConvertTest, NpzStoredAndDeflated) {
  TempDir dir;
  const std::string features =
      NpyBytes("<f8", "(2, 2)", Raw(std::vector<double>{0.5, 1, 2, 4}));
  const std::string labels =
      NpyBytes("<i8", "(2,)", Raw(std::vector<int64_t>{3, 9}));
  for (bool deflate : {false, true}) {
    testing::WriteFileBytes(
        dir.File("a.npz"),
        Zip({{"features.npy", features}, {"labels.npy", labels}}, deflate));
    const Result r = Recflow(
        dir, "convert npz " + dir.File("a.npz") + " -o " + dir.File("out"));
    ASSERT_EQ(r.code, 0) << r.err;
    const auto ex = ReadExamples(dir, "out", 1);
    ASSERT_EQ(ex.size(), 2u) << deflate;
    EXPECT_EQ(Get(ex[1], "features")->float_list().value(1), 4.0f);
    EXPECT_EQ(Get(ex[1], "labels")->int64_list().value(0), 9);
  }
  testing::WriteFileBytes(
      dir.File("uneven.npz"),
      Zip({{"a.npy", features},
           {"b.npy",
            NpyBytes("<i8", "(3,)", Raw(std::vector<int64_t>{1, 2, 3}))}},
          false));
  const Result bad = Recflow(
      dir, "convert npz " + dir.File("uneven.npz") + " -o " + dir.File("bad"));
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("different lengths"), std::string::npos) << bad.err;
}

void WriteIdx(const std::string& path, const std::string& bytes, bool gz) {
  if (!gz) {
    testing::WriteFileBytes(path, bytes);
    return;
  }
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

TEST(ConvertTest, IdxImagesAndLabelsGzipOrNot) {
  TempDir dir;
  std::string images = Be32(0x803) + Be32(5) + Be32(2) + Be32(3);
  std::string labels = Be32(0x801) + Be32(5);
  for (int i = 0; i < 5; ++i) {
    images += std::string(6, static_cast<char>(i));
    labels.push_back(static_cast<char>(i * 2));
  }
  WriteIdx(dir.File("images.gz"), images, true);
  WriteIdx(dir.File("labels"), labels, false);
  const Result r = Recflow(
      dir, "convert idx --images " + dir.File("images.gz") + " --labels " +
               dir.File("labels") + " -o " + dir.File("out") + " --shards 2");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto ex = ReadExamples(dir, "out", 2);
  ASSERT_EQ(ex.size(), 5u);
  EXPECT_EQ(Get(ex[4], "image")->bytes_list().value(0), std::string(6, '\4'));
  EXPECT_EQ(Get(ex[4], "label")->int64_list().value(0), 8);
  EXPECT_EQ(Get(ex[0], "height")->int64_list().value(0), 2);
  EXPECT_EQ(Get(ex[0], "width")->int64_list().value(0), 3);
  WriteIdx(dir.File("labels4"), Be32(0x801) + Be32(4) + "abcd", false);
  const Result bad = Recflow(
      dir, "convert idx --images " + dir.File("images.gz") + " --labels " +
               dir.File("labels4") + " -o " + dir.File("bad"));
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("holds 5 images but"), std::string::npos) << bad.err;
}

TEST(ConvertTest, ImageFoldersWithLabels) {
  TempDir dir;
  std::filesystem::create_directories(dir.File("imgs/cat"));
  std::filesystem::create_directories(dir.File("imgs/dog"));
  const std::string png = testing::TinyPng();
  const std::string jpeg = testing::TinyJpeg();
  testing::WriteFileBytes(dir.File("imgs/cat/a.png"), png);
  testing::WriteFileBytes(dir.File("imgs/dog/b.JPG"), jpeg);
  testing::WriteFileBytes(dir.File("imgs/dog/notes.txt"), "ignored");
  const Result r = Recflow(
      dir, "convert images " + dir.File("imgs") + " -o " + dir.File("out"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto ex = ReadExamples(dir, "out", 1);
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_EQ(Get(ex[0], "image/encoded")->bytes_list().value(0), png);
  EXPECT_EQ(Get(ex[0], "image/format")->bytes_list().value(0), "png");
  EXPECT_EQ(Get(ex[0], "image/height")->int64_list().value(0), 3);
  EXPECT_EQ(Get(ex[0], "image/width")->int64_list().value(0), 4);
  EXPECT_EQ(Get(ex[0], "image/class/text")->bytes_list().value(0), "cat");
  EXPECT_EQ(Get(ex[1], "image/format")->bytes_list().value(0), "jpeg");
  EXPECT_EQ(Get(ex[1], "image/height")->int64_list().value(0), 5);
  EXPECT_EQ(Get(ex[1], "image/width")->int64_list().value(0), 7);
  EXPECT_EQ(Get(ex[1], "image/class/label")->int64_list().value(0), 1);
  EXPECT_EQ(Get(ex[1], "image/filename")->bytes_list().value(0), "b.JPG");
  EXPECT_EQ(testing::ReadFileBytes(dir.File("out-labels.txt")),
            "0:cat\n1:dog\n");
}

TEST(ConvertTest, CatJsonIsCanonicalJsonOnePerLine) {
  TempDir dir;
  testing::WriteFileBytes(dir.File("in.jsonl"),
                          "{\"n\": 5, \"f\": 0.5, \"s\": \"hi\"}\n"
                          "{\"n\": 6}\n");
  ASSERT_EQ(Recflow(dir, "convert jsonl " + dir.File("in.jsonl") + " -o " +
                             dir.File("out"))
                .code,
            0);
  const Result r =
      Recflow(dir, "cat --json " + dir.File("out-00000-of-00001.tfrecord"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto first = nlohmann::json::parse(r.out.substr(0, r.out.find('\n')));
  // int64 as strings, bytes as base64, camelCase list names.
  EXPECT_EQ(first["features"]["feature"]["n"]["int64List"]["value"][0], "5");
  EXPECT_EQ(first["features"]["feature"]["s"]["bytesList"]["value"][0], "aGk=");
  EXPECT_EQ(first["features"]["feature"]["f"]["floatList"]["value"][0], 0.5);
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 2);
  const Result text =
      Recflow(dir, "cat -n 1 " + dir.File("out-00000-of-00001.tfrecord"));
  EXPECT_NE(text.out.find("key: \"s\""), std::string::npos) << text.out;
}

TEST(ConvertTest, CatSequenceExamples) {
  TempDir dir;
  tensorflow::SequenceExample ex;
  (*ex.mutable_context()->mutable_feature())["id"]
      .mutable_int64_list()
      ->add_value(3);
  auto& steps = (*ex.mutable_feature_lists()->mutable_feature_list())["frames"];
  steps.add_feature()->mutable_float_list()->add_value(0.5f);
  steps.add_feature()->mutable_float_list()->add_value(1.5f);
  testing::WriteRecords(dir.File("s.tfrecord"), {ex.SerializeAsString()});
  const Result r =
      Recflow(dir, "cat --sequence --json " + dir.File("s.tfrecord"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["context"]["feature"]["id"]["int64List"]["value"][0], "3");
  EXPECT_EQ(j["featureLists"]["featureList"]["frames"]["feature"][1]
             ["floatList"]["value"][0],
            1.5);
  // Not an Example: says so, with the record, and exits 1.
  testing::WriteRecords(dir.File("junk.tfrecord"), {"\xff\xff"});
  const Result junk = Recflow(dir, "cat " + dir.File("junk.tfrecord"));
  EXPECT_EQ(junk.code, 1);
  EXPECT_NE(junk.err.find("record 0 at byte offset 0: Can't parse serialized "
                          "Example."),
            std::string::npos)
      << junk.err;
}

// `cat --json` prints map entries (features, feature lists) in key order:
// protobuf's own JSON follows its hash map, whose order changed from run
// to run, so the same file printed differently each time.  What is
// printed still parses back into the same message.
TEST(ConvertTest, CatJsonPrintsFeaturesInKeyOrderEveryRun) {
  TempDir dir;
  tensorflow::Example ex;
  tensorflow::SequenceExample seq;
  std::vector<std::string> keys;
  for (int k = 0; k < 40; ++k) {
    const std::string key = fmt::format("k{:02d}\"<é>", (k * 17) % 40);
    keys.push_back(key);
    auto& f = (*ex.mutable_features()->mutable_feature())[key];
    f.mutable_float_list()->add_value(-0.0f);
    f.mutable_float_list()->add_value(0.1f * static_cast<float>(k));
    (*seq.mutable_context()->mutable_feature())[key]
        .mutable_int64_list()
        ->add_value(k);
    (*seq.mutable_feature_lists()->mutable_feature_list())[key]
        .add_feature()
        ->mutable_bytes_list()
        ->add_value(std::string(1, static_cast<char>(k)));
  }
  std::sort(keys.begin(), keys.end());
  tensorflow::Example empty_features;
  empty_features.mutable_features();
  testing::WriteRecords(
      dir.File("e.tfrecord"),
      {ex.SerializeAsString(), tensorflow::Example().SerializeAsString(),
       empty_features.SerializeAsString()});
  testing::WriteRecords(dir.File("s.tfrecord"), {seq.SerializeAsString()});
  const Result first = Recflow(dir, "cat --json " + dir.File("e.tfrecord"));
  ASSERT_EQ(first.code, 0) << first.err;
  for (int run = 0; run < 3; ++run) {
    EXPECT_EQ(Recflow(dir, "cat --json " + dir.File("e.tfrecord")).out,
              first.out);
  }
  std::vector<std::string> lines;
  std::istringstream in(first.out);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[1], "{}");
  EXPECT_EQ(lines[2], "{\"features\":{}}");
  // Keys in order, as printed (ordered_json keeps the text's order).
  auto printed_keys = [](const nlohmann::ordered_json& map) {
    std::vector<std::string> out;
    for (const auto& [key, value] : map.items()) out.push_back(key);
    return out;
  };
  EXPECT_EQ(printed_keys(
                nlohmann::ordered_json::parse(lines[0])["features"]["feature"]),
            keys);
  tensorflow::Example back;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(lines[0], &back).ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(back, ex));
  for (size_t i = 1; i < lines.size(); ++i) {
    tensorflow::Example e;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(lines[i], &e).ok());
  }

  const Result s =
      Recflow(dir, "cat --sequence --json " + dir.File("s.tfrecord"));
  ASSERT_EQ(s.code, 0) << s.err;
  EXPECT_EQ(Recflow(dir, "cat --sequence --json " + dir.File("s.tfrecord")).out,
            s.out);
  tensorflow::SequenceExample seq_back;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(s.out, &seq_back).ok());
  EXPECT_TRUE(
      google::protobuf::util::MessageDifferencer::Equals(seq_back, seq));
  const auto j = nlohmann::ordered_json::parse(s.out);
  EXPECT_EQ(j.begin().key(), "context");
  EXPECT_EQ(printed_keys(j["context"]["feature"]), keys);
  EXPECT_EQ(printed_keys(j["featureLists"]["featureList"]), keys);
}

// `cat --records` reads only the records asked for, through the indexes
// (or ones built in memory), numbered across the files: what a full `cat`
// prints of them, in the order asked.
TEST(ConvertTest, CatRecordsByNumber) {
  TempDir dir;
  std::vector<std::string> a, b;
  for (int i = 0; i < 6; ++i) {
    tensorflow::Example e;
    (*e.mutable_features()->mutable_feature())["i"]
        .mutable_int64_list()
        ->add_value(i);
    (i < 4 ? a : b).push_back(e.SerializeAsString());
  }
  const std::string fa = dir.File("a.tfrecord");
  const std::string fb = dir.File("b.tfrecord.zst");
  testing::WriteRecords(fa, a);
  records::WriterOptions zstd;
  zstd.compression = records::Compression::kZstd;
  zstd.build_index = true;
  testing::WriteRecords(fb, b, zstd);
  const Result all = Recflow(dir, "cat --json " + fa + " " + fb);
  ASSERT_EQ(all.code, 0) << all.err;
  std::vector<std::string> lines;
  std::istringstream in(all.out);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 6u);
  Result r = Recflow(dir, "cat --json --records 5,0-2,4 " + fa + " " + fb);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, lines[5] + "\n" + lines[0] + "\n" + lines[1] + "\n" +
                       lines[2] + "\n" + lines[4] + "\n");
  EXPECT_NE(r.err.find("a.tfrecord.idx; indexing it in memory"),
            std::string::npos)
      << r.err;
  r = Recflow(dir, "cat --json --records 1-5 -n 2 " + fa + " " + fb);
  EXPECT_EQ(r.out, lines[1] + "\n" + lines[2] + "\n");
  // The text format names each record's file and its number there.
  r = Recflow(dir, "cat --records 4 " + fa + " " + fb);
  EXPECT_EQ(r.out.substr(0, r.out.find('\n')), "# " + fb + " record 0");
  for (const auto& [list, error] :
       std::vector<std::pair<std::string, std::string>>{
           {"6", "record 6 is past the end: the files hold 6 records"},
           {"3-1", "the range '3-1' runs backwards"},
           {"1,,2", "'' is not a record number"},
           {"x", "'x' is not a record number or range A-B"},
           {"-1", "'-1' is not a record number"}}) {
    r = Recflow(dir, "cat --records " + list + " " + fa + " " + fb);
    EXPECT_EQ(r.code, 2) << list;
    EXPECT_NE(r.err.find(error), std::string::npos) << list << ": " << r.err;
    EXPECT_EQ(r.out, "") << list;
  }
  // A damaged record, in a file indexed before the damage: the records
  // before it print, then the error names it (exit 1), as a full `cat`
  // does.  Without an index, indexing the file finds the damage first.
  ASSERT_EQ(Recflow(dir, "index " + fa).code, 0);
  std::string bytes = testing::ReadFileBytes(fa);
  const size_t third = 2 * (16 + a[0].size());  // records 0 and 1 before it
  bytes[third + 12 + 3] ^= 0x20;
  testing::WriteFileBytes(fa, bytes);
  const std::string damage = "record 2 at byte offset " + std::to_string(third);
  r = Recflow(dir, "cat --json --records 0-3 " + fa + " " + fb);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, lines[0] + "\n" + lines[1] + "\n");
  EXPECT_NE(r.err.find(damage), std::string::npos) << r.err;
  std::filesystem::remove(records::IndexPathFor(fa));
  r = Recflow(dir, "cat --json --records 0-3 " + fa + " " + fb);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find(damage), std::string::npos) << r.err;
  const std::string gz = dir.File("c.tfrecord.gz");
  testing::WriteRecords(gz, a, records::Compression::kGzip);
  r = Recflow(dir, "cat --records 0 " + gz);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("gzip stream cannot be indexed"), std::string::npos)
      << r.err;
}

// The spec `inspect --spec` infers parses the data it came from.
TEST(ConvertTest, InspectSpecParsesTheData) {
  TempDir dir;
  testing::WriteFileBytes(dir.File("in.jsonl"),
                          "{\"v\": [1, 2, 3], \"t\": [1], \"s\": \"x\"}\n"
                          "{\"v\": [4, 5, 6], \"t\": [2, 3], \"s\": \"y\"}\n");
  ASSERT_EQ(Recflow(dir, "convert jsonl " + dir.File("in.jsonl") + " -o " +
                             dir.File("out"))
                .code,
            0);
  const std::string shard = dir.File("out-00000-of-00001.tfrecord");
  const Result r = Recflow(dir, "inspect --spec " + shard);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto spec = records::FeatureSpec::FromJsonText(r.out);
  ASSERT_NE(spec.Find("v"), nullptr);
  EXPECT_EQ(spec.Find("v")->kind, records::FeatureConfig::Kind::kFixed);
  EXPECT_EQ(spec.Find("v")->shape, std::vector<int64_t>{3});
  EXPECT_EQ(spec.Find("t")->kind, records::FeatureConfig::Kind::kVar);
  EXPECT_EQ(spec.Find("s")->shape, std::vector<int64_t>{});
  const auto recs = testing::ReadRecords(shard);
  std::vector<std::string_view> views(recs.begin(), recs.end());
  records::ParsedBatch batch;
  records::ExampleParser(spec).ParseBatch(views, &batch);
  EXPECT_EQ(batch.feature("v").ints.size(), 6u);
  EXPECT_EQ(batch.feature("t").row_lengths.size(), 2u);
  const Result j = Recflow(dir, "inspect --json " + shard);
  const auto stats = nlohmann::json::parse(j.out);
  EXPECT_EQ(stats["records"], 2);
  EXPECT_EQ(stats["features"]["t"]["values_max"], 2);
}

// SequenceExamples: read as Examples their feature_lists would be left out
// without a word (Example has no field 2), so inspect says so; --sequence
// summarises them, and its spec parses the records.
TEST(ConvertTest, InspectSequenceSummarisesFeatureListsAndInfersTheirSpec) {
  TempDir dir;
  std::vector<std::string> records;
  for (int i = 0; i < 3; ++i) {
    tensorflow::SequenceExample ex;
    (*ex.mutable_context()->mutable_feature())["label"]
        .mutable_int64_list()
        ->add_value(i);
    auto& lists = *ex.mutable_feature_lists()->mutable_feature_list();
    for (int step = 0; step < i + 1; ++step) {  // 1, 2 and 3 steps
      auto* frame = lists["frame"].add_feature()->mutable_float_list();
      frame->add_value(static_cast<float>(step));
      frame->add_value(0.5f);
      // 1, 2, 3... tokens a step: var
      auto* tokens = lists["tokens"].add_feature()->mutable_bytes_list();
      for (int t = 0; t <= step; ++t) tokens->add_value("w");
    }
    if (i == 2) lists["rare"].add_feature()->mutable_int64_list()->add_value(7);
    records.push_back(ex.SerializeAsString());
  }
  const std::string file = dir.File("seq.tfrecord");
  testing::WriteRecords(file, records);

  const Result plain = Recflow(dir, "inspect " + file);
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_EQ(plain.err,
            "recflow: 3 of 3 records also hold feature_lists, as a "
            "tf.train.SequenceExample does: read as Examples, only their "
            "context features are shown; give --sequence\n");

  const Result table = Recflow(dir, "inspect --sequence " + file);
  ASSERT_EQ(table.code, 0) << table.err;
  EXPECT_EQ(table.err, "");
  EXPECT_EQ(
      table.out.rfind("3 records, 1 context features, 3 feature lists\n", 0),
      0u)
      << table.out;
  // feature list, kind, present, absent, steps, values per step, samples
  EXPECT_NE(table.out.find("\nframe                    float                3 "
                           "        0               1/3/2.0                  "
                           "2/2/2.0  0 0 1"),
            std::string::npos)
      << table.out;
  EXPECT_NE(table.out.find("\nrare                     int64                1 "
                           "        2               1/1/1.0"),
            std::string::npos)
      << table.out;

  const Result json = Recflow(dir, "inspect --sequence --json " + file);
  ASSERT_EQ(json.code, 0) << json.err;
  const auto j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["features"]["label"]["present"], 3);
  EXPECT_EQ(j["feature_lists"]["tokens"]["steps_max"], 3);
  EXPECT_EQ(j["feature_lists"]["tokens"]["steps"]["values_max"], 3);
  EXPECT_EQ(j["feature_lists"]["rare"]["absent"], 2);

  const Result spec = Recflow(dir, "inspect --sequence --spec " + file);
  ASSERT_EQ(spec.code, 0) << spec.err;
  const auto both = nlohmann::json::parse(spec.out);
  const auto context = records::FeatureSpec::FromJson(both["context"]);
  const auto sequence = records::FeatureSpec::FromJson(both["sequence"]);
  ASSERT_NE(sequence.Find("frame"), nullptr);
  EXPECT_EQ(sequence.Find("frame")->kind, records::FeatureConfig::Kind::kFixed);
  EXPECT_EQ(sequence.Find("frame")->shape, std::vector<int64_t>{2});
  EXPECT_EQ(sequence.Find("tokens")->kind, records::FeatureConfig::Kind::kVar);
  // Present in one record only, one value a step: fixed still (a record
  // without the list has no steps of it).
  EXPECT_EQ(sequence.Find("rare")->kind, records::FeatureConfig::Kind::kFixed);
  std::vector<std::string_view> views(records.begin(), records.end());
  records::ParsedSequenceBatch batch;
  records::SequenceExampleParser(context, sequence).ParseBatch(views, &batch);
  EXPECT_EQ(batch.sequence.feature("frame").floats.size(), 12u);
  EXPECT_EQ(batch.sequence.feature("tokens").step_lengths.size(), 6u);
  EXPECT_EQ(batch.sequence.feature("rare").row_lengths[2], 1);
}

// The table counts each feature's records with values, with an empty list
// and without it; a feature with two kinds of list is left out of the
// inferred spec, saying so; a record that is not an Example stops it.
TEST(ConvertTest, InspectTablesEveryKindAndLeavesMixedKindsOutOfTheSpec) {
  TempDir dir;
  std::vector<std::string> records;
  for (int i = 0; i < 3; ++i) {
    tensorflow::Example ex;
    auto& m = *ex.mutable_features()->mutable_feature();
    m["f"].mutable_float_list()->add_value(0.5f + static_cast<float>(i));
    // Up to 40 printable bytes are shown; longer ones are counted.
    m["b"].mutable_bytes_list()->add_value(std::string(i == 2 ? 41 : 2, 'x'));
    if (i == 0) m["e"].mutable_int64_list();  // an empty list
    if (i == 1) m["e"];                       // a Feature with no list
    if (i == 1) {
      m["mixed"].mutable_float_list()->add_value(1);
    } else {
      m["mixed"].mutable_int64_list()->add_value(i);
    }
    records.push_back(ex.SerializeAsString());
  }
  const std::string file = dir.File("f.tfrecord");
  testing::WriteRecords(file, records);
  const Result table = Recflow(dir, "inspect " + file);
  ASSERT_EQ(table.code, 0) << table.err;
  const auto line = [&](const std::string& feature) {
    const size_t at = table.out.find("\n" + feature + " ");
    return at == std::string::npos
               ? std::string()
               : table.out.substr(at + 1,
                                  table.out.find('\n', at + 1) - at - 1);
  };
  EXPECT_EQ(table.out.rfind("3 records, 4 features\n", 0), 0u) << table.out;
  // feature, kind, present, empty, absent, value counts, samples
  EXPECT_EQ(line("f"),
            "f                        float                3         0         "
            "0               1/1/1.0  0.5 1.5 2.5");
  EXPECT_EQ(line("b"),
            "b                        bytes                3         0         "
            "0               1/1/1.0  \"xx\" \"xx\" <41 bytes>");
  EXPECT_EQ(line("e"),
            "e                        int64                0         1         "
            "2               0/0/0.0  ");
  EXPECT_EQ(line("mixed").substr(0, 37),
            "mixed                    float,int64 ");
  const Result spec = Recflow(dir, "inspect --spec " + file);
  ASSERT_EQ(spec.code, 0) << spec.err;
  EXPECT_EQ(spec.err,
            "recflow: feature 'mixed' holds 2 kinds of list; left out of the "
            "spec\n");
  const auto parsed = records::FeatureSpec::FromJsonText(spec.out);
  EXPECT_EQ(parsed.Find("mixed"), nullptr);
  ASSERT_NE(parsed.Find("e"), nullptr);
  EXPECT_EQ(parsed.Find("e")->kind, records::FeatureConfig::Kind::kVar);
  ASSERT_NE(parsed.Find("f"), nullptr);
  EXPECT_EQ(parsed.Find("f")->kind, records::FeatureConfig::Kind::kFixed);

  records.insert(records.begin() + 1, "\xff\xff");
  testing::WriteRecords(file, records);
  const Result junk = Recflow(dir, "inspect " + file);
  EXPECT_EQ(junk.code, 1);
  EXPECT_NE(junk.err.find(fmt::format("{}: record 1 at byte offset {}: Can't "
                                      "parse serialized Example.",
                                      file, records[0].size() + 16)),
            std::string::npos)
      << junk.err;
}

}  // namespace
}  // namespace recflow::tools
