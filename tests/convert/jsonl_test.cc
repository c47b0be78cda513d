// convert/jsonl.cc: one object per line, lists, nulls and widening.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
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

// Compressed inputs (by their name's suffix) convert as the plain file
// does, with the CSV converter's reader too; a cut stream is an error
// naming the file after the rows before it, not an early end.
TEST(JsonlTest, CompressedFilesConvertAsPlainOnesAndACutOneIsAnError) {
  testing::TempDir dir;
  std::string jsonl, csv = "x,s\n";
  for (int i = 0; i < 3000; ++i) {
    jsonl += "{\"x\": " + std::to_string(i) + ", \"s\": \"r" +
             std::to_string(i) + "\"}\n";
    csv += std::to_string(i) + ",r" + std::to_string(i) + "\n";
  }
  for (const auto c :
       {records::Compression::kGzip, records::Compression::kZstd}) {
    const std::string suffix(records::CompressionSuffix(c));
    testing::WriteFileBytes(dir.File("in.jsonl" + suffix),
                            testing::Compressed(jsonl, c));
    testing::WriteFileBytes(dir.File("in.csv" + suffix),
                            testing::Compressed(csv, c));
    for (const std::string format : {"jsonl", "csv"}) {
      SCOPED_TRACE(format + suffix);
      const auto ex = SourceExamples(
          format, {.files = {dir.File("in." + format + suffix)}});
      ASSERT_EQ(ex.size(), 3000u);
      EXPECT_EQ(Get(ex[2999], "x")->int64_list().value(0), 2999);
      EXPECT_EQ(Get(ex[2999], "s")->bytes_list().value(0), "r2999");
    }
  }
  const std::string gz =
      testing::Compressed(jsonl, records::Compression::kGzip);
  testing::WriteFileBytes(dir.File("cut.jsonl.gz"),
                          gz.substr(0, gz.size() / 2));
  EXPECT_EQ(ConvertErrorOf([&] {
              SourceExamples("jsonl", {.files = {dir.File("cut.jsonl.gz")}});
            }).rfind(dir.File("cut.jsonl.gz") + ": ", 0),
            0u);
}

// Keys are typed by the lines that parse whole, from their own members'
// values and list elements only: a line cut short (whose "x" was text
// before the cut) and values inside nested objects type nothing.  Those
// lines are bad rows, skipped here; the rest keep x and n int64.
TEST(JsonlTest, OnlyWholeLinesAndTheirOwnMembersTypeKeys) {
  testing::TempDir dir;
  testing::WriteFileBytes(dir.File("in.jsonl"),
                          "{\"x\": \"abc\", \"n\": 1.5, \"y\": [1\n"
                          "{\"x\": 1, \"n\": 2}\n"
                          "{\"x\": 3, \"o\": {\"x\": \"abc\", \"n\": 0.5}}\n"
                          "{\"x\": 4, \"l\": [{\"n\": 0.5}, [\"s\"]]}\n"
                          "{\"x\": 2, \"n\": 3}\n");
  ConvertJob job;
  job.format = "jsonl";
  job.inputs.files = {dir.File("in.jsonl")};
  job.output = dir.File("out");
  job.skip_bad = true;
  const ConvertSummary s = Convert(job);
  EXPECT_EQ(s.records, 2u);
  EXPECT_EQ(s.skipped, 3u);
  // Neither an object nor a list of lists and objects types its key.
  ASSERT_EQ(s.warnings.size(), 2u);
  EXPECT_EQ(s.warnings[0].substr(0, 8), "key 'l' ");
  EXPECT_EQ(s.warnings[1].substr(0, 8), "key 'o' ");
  const auto ex = testing::ShardExamples(s);
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_EQ(Get(ex[0], "x")->int64_list().value(0), 1);
  EXPECT_EQ(Get(ex[1], "n")->int64_list().value(0), 3);
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
  // Past uint64 (the parser makes a double of it): an integer all the
  // same, so an int64 key refuses it as well, rather than turning float.
  EXPECT_EQ(error("{\"a\": 1}\n{\"a\": 18446744073709551616}\n"),
            f + ":2: key 'a': 18446744073709551616 does not fit in int64");
  EXPECT_EQ(error("{\"s\": \"-1 [2]\", \"a\": [-9223372036854775809]}\n"),
            f + ":1: key 'a': -9223372036854775809 does not fit in int64");
  EXPECT_EQ(error("{\"a\": 1}\n{\"a\": 1.8446744073709552e19}\n"), "");
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
  EXPECT_EQ(error("{\"a\": 1}\n{\"a\": [2, null]}\n"),
            f + ":2: key 'a': expected integer values (numbers, strings, "
                "booleans, or lists of one of them), found [2,null]");
  EXPECT_EQ(error("{\"a\": 1}\n{\"a\": [[2]]}\n"),
            f + ":2: key 'a': expected integer values (numbers, strings, "
                "booleans, or lists of one of them), found [[2]]");
  EXPECT_EQ(error("{\"a\": 1}\n{\"o\": {\"a\": 2}}\n"),
            f + ":2: key 'o': expected feature values (numbers, strings, "
                "booleans, or lists of one of them), found {\"a\":2}");
  EXPECT_EQ(error("{\"s\": \"x\"}\n{\"s\": true}\n"),
            f + ":2: key 's': expected string values (numbers, strings, "
                "booleans, or lists of one of them), found true");
  EXPECT_EQ(error("{\"n\": null, \"a\": 1, \"n\": null}\n"),
            f + ":1: key \"n\" appears twice; keys must differ");
  EXPECT_EQ(error("{\"a\": 1.5}\n{\"a\": -1e39}\n"),
            f + ":2: key 'a': -1e+39 is outside float32's range (a float "
                "feature would hold inf)");
  // A NUL byte: nlohmann would end the line there, dropping the rest.
  EXPECT_EQ(error(std::string("{\"a\": 1}\n{\"a\": 2}\0{\"a\": 3}\n", 28)),
            f + ":2: not JSON: a NUL byte at column 9 (JSON has none; in a "
                "string it is written \\u0000)");
  EXPECT_EQ(error(std::string("{\"a\": \"x\0y\"}\n", 13)),
            f + ":1: not JSON: a NUL byte at column 9 (JSON has none; in a "
                "string it is written \\u0000)");
  EXPECT_EQ(error("{\"a\": 1} {\"a\": 2}\n"),
            f + ":1: not JSON: parse error at column 10: syntax error while "
                "parsing value - unexpected '{'; expected end of input");
  // A JSON document given for JSON Lines: an array of objects on a line,
  // or a document written over many lines (its first line only opens it).
  const std::string array_hint =
      " (the file looks like a JSON document, not JSON Lines, which holds "
      "one object per line: `jq -c '.[]' FILE` writes an array's objects "
      "so)";
  EXPECT_EQ(error("[{\"a\": 1}, {\"a\": 2}]\n"),
            f +
                ":1: expected one JSON object per line, found an array of "
                "objects" +
                array_hint);
  EXPECT_EQ(error("[\n  {\"a\": 1},\n  {\"a\": 2}\n]\n"),
            f +
                ":1: not JSON: parse error at column 2: syntax error while "
                "parsing value - unexpected end of input; expected '[', '{', "
                "or a literal" +
                array_hint);
  EXPECT_EQ(error(" {\r\n  \"a\": 1\n}\n"),
            f + ":1: not JSON: parse error at column 4: syntax error while "
                "parsing object key - unexpected end of input; expected "
                "string literal (the file looks like a JSON document, not "
                "JSON Lines, which holds one object per line: `jq -c . FILE` "
                "writes an object on one line so)");
  // Not when the line holds more than an opening: no document shows.
  EXPECT_EQ(error("{\"a\": 1}\n[{\"a\": 1}, 2]\n"),
            f + ":2: expected one JSON object per line, found array");
  EXPECT_EQ(error("{\"a\": 1}\n[]\n"),
            f + ":2: expected one JSON object per line, found array");
  EXPECT_EQ(error("{\"a\": 1}\n{\"a\": 1,\n"),
            f + ":2: not JSON: parse error at column 9: syntax error while "
                "parsing object key - unexpected end of input; expected "
                "string literal");
  // UTF-16 (every line bad; the first says why).
  EXPECT_EQ(error(std::string("\xFF\xFE{\0}\0\n\0", 8)),
            f + ":1: starts with a UTF-16 byte order mark (FF FE); JSON Lines "
                "is read as UTF-8: convert the file first (iconv -f UTF-16 -t "
                "UTF-8)");
  // Nested a million deep (a hostile line): named by its first bytes,
  // written without recursing as deep as it goes.
  const std::string deep =
      std::string(1000000, '[') + std::string(1000000, ']');
  EXPECT_EQ(error("{\"a\": 1}\n{\"a\": " + deep + "}\n"),
            f +
                ":2: key 'a': expected integer values (numbers, strings, "
                "booleans, or lists of one of them), found " +
                std::string(80, '[') + "...");
}

// Every row of `f` as its source builds it, serialized, or "bad" for a
// bad row.
std::vector<std::string> BuiltRows(const std::string& f) {
  auto source = OpenSource("jsonl", {.files = {f}});
  std::vector<std::string> out;
  Row row;
  records::ExampleBuilder builder;
  while (source->NextRow(&row)) {
    builder.Clear();
    try {
      source->Build(row, &builder);
      out.emplace_back(builder.Serialize());
    } catch (const ConvertError&) {
      out.emplace_back("bad");
    }
  }
  return out;
}

// Good lines of every kind of value, written in any key order and spacing,
// build the Example their values say, byte for byte: each present key's
// feature in key order (std::map's, which the shards have always had),
// integers as written, floats and integers of a float key as float32,
// booleans as 0 and 1, strings unescaped; null, and [] of an untyped key,
// nothing.
TEST(JsonlTest, GoodLinesBuildWhatTheirValuesSayInKeyOrder) {
  std::mt19937_64 rng(11);
  // One key's value in one line: its JSON text, and what it adds.
  struct Value {
    std::string json;
    std::vector<int64_t> ints;
    std::vector<float> floats;
    std::vector<std::string> strings;
    bool null = false;
  };
  const auto int_value = [&](Value* v) {
    const int64_t picks[] = {0,         -1,        7,
                             INT64_MAX, INT64_MIN, static_cast<int64_t>(rng())};
    const int64_t i = picks[rng() % 6];
    if (rng() % 5 == 0) {
      v->json += i % 2 ? "true" : "false";
      v->ints.push_back(i % 2 ? 1 : 0);
      return;
    }
    v->json += std::to_string(i);
    v->ints.push_back(i);
  };
  const auto float_value = [&](Value* v) {
    switch (rng() % 6) {
      case 0: {
        const int64_t i = static_cast<int64_t>(rng()) >> (rng() % 64);
        v->json += std::to_string(i);
        v->floats.push_back(static_cast<float>(i));
        return;
      }
      case 1:
        v->json += "18446744073709551615";
        v->floats.push_back(static_cast<float>(UINT64_MAX));
        return;
      case 2:
        v->json += "18446744073709551616";  // past uint64: a double
        v->floats.push_back(static_cast<float>(18446744073709551616.0));
        return;
      case 3: {
        const bool b = rng() % 2;
        v->json += b ? "true" : "false";
        v->floats.push_back(b ? 1.0f : 0.0f);
        return;
      }
      case 4:
        v->json += "-2.5E-3";
        v->floats.push_back(static_cast<float>(-2.5e-3));
        return;
      default: {
        double d = std::ldexp(static_cast<double>(rng() >> 11) / 0x1p53,
                              static_cast<int>(rng() % 200) - 100);
        if (rng() % 2) d = -d;
        v->json += fmt::format("{:.17g}", d);  // reads back as d
        v->floats.push_back(static_cast<float>(d));
        return;
      }
    }
  };
  const auto string_value = [&](Value* v) {
    const std::pair<std::string, std::string> picks[] = {
        {R"("")", ""},
        {R"("plain")", "plain"},
        {R"("q\"b\\s\/n\nt\t")", "q\"b\\s/n\nt\t"},
        {R"("\u00e9\ud83d\ude00")", "\u00e9\U0001F600"},
        {"\"\u00e9 raw\"", "\u00e9 raw"}};
    const auto& [json, text] = picks[rng() % 5];
    v->json += json;
    v->strings.push_back(text);
  };
  using Maker = std::function<void(Value*)>;
  const std::pair<std::string, Maker> keys[] = {
      {"i", int_value},      {"f", float_value}, {"s", string_value},
      {"\u00fc", int_value},  // a UTF-8 key, after the ASCII ones
      {"n", nullptr},         // null or [] in every line: untyped
  };
  std::string text;
  std::vector<std::string> lines, want;
  for (int line = 0; line < 400; ++line) {
    std::vector<std::pair<std::string, Value>> members;
    for (const auto& [key, make] : keys) {
      if (line > 0 && rng() % 6 == 0) continue;  // absent
      Value v;
      const uint64_t shape = make == nullptr ? 3 + rng() % 2 : rng() % 5;
      if (line == 0 && key == "f") {  // types f float from the start
        v.json = "0.5";
        v.floats = {0.5f};
      } else if (shape <= 1) {
        make(&v);
      } else if (shape == 2) {
        v.json = "[";
        for (uint64_t n = rng() % 4, i = 0; i < n; ++i) {
          if (i > 0) v.json += rng() % 2 ? "," : " , ";
          make(&v);
        }
        v.json += "]";
      } else if (shape == 3) {
        v.json = "null";
        v.null = true;
      } else {
        v.json = "[ ]";
      }
      members.emplace_back(key, std::move(v));
    }
    std::shuffle(members.begin(), members.end(), rng);
    std::string json = rng() % 2 ? "{" : " {\t";
    for (size_t m = 0; m < members.size(); ++m) {
      json += fmt::format("{}\"{}\":{}{}", m > 0 ? ", " : "", members[m].first,
                          rng() % 2 ? " " : "", members[m].second.json);
    }
    json += "}";
    text += json + "\n";
    lines.push_back(json);
    std::sort(members.begin(), members.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    records::ExampleBuilder b;
    for (const auto& [key, v] : members) {
      if (v.null || key == "n") continue;
      if (key == "f") {
        b.AddFloatList(key, v.floats);
      } else if (key == "s") {
        b.AddBytesList(key, v.strings);
      } else {
        b.AddInt64List(key, v.ints);
      }
    }
    want.emplace_back(b.Serialize());
  }
  testing::TempDir dir;
  const std::string f = dir.File("in.jsonl");
  testing::WriteFileBytes(f, text);
  const std::vector<std::string> got = BuiltRows(f);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i], want[i]) << "line " << i + 1 << ": " << lines[i];
  }
}

// Each thread's reading of lines keeps the last line's keys, their types
// and their order for the next line: lines naming other keys, a bad line
// between good ones, and a second source on the same thread (its own
// types for the same keys) build what their own keys and types say.
TEST(JsonlTest, LinesBuildByTheirOwnKeysWhateverTheLinesBeforeNamed) {
  testing::TempDir dir;
  const auto rows = [&](const std::string& name, const std::string& text) {
    const std::string f = dir.File(name);
    testing::WriteFileBytes(f, text);
    return BuiltRows(f);
  };
  const auto example =
      [](std::initializer_list<std::pair<std::string, std::vector<int64_t>>>
             features) {
        records::ExampleBuilder b;
        for (const auto& [key, values] : features) b.AddInt64List(key, values);
        return std::string(b.Serialize());
      };
  // "b" then "a": sorted, the second slot first.  The bad line puts "0"
  // in the first slot (it sorts before "a") and stops at the second
  // member's value, so the next line, which names the slots' keys, sorts
  // anew.
  EXPECT_EQ(rows("a.jsonl",
                 "{\"b\": 1, \"a\": 2}\n"
                 "{\"b\": 3, \"a\": 4}\n"
                 "{\"0\": 5, \"a\": [[6]]}\n"
                 "{\"0\": 7, \"a\": 8}\n"
                 "{\"0\": 9, \"a\": 10, \"b\": 11}\n"
                 "{\"0\": 12}\n"
                 "{\"b\": 13, \"b\": 14}\n"
                 "{\"b\": 15, \"a\": 16}\n"),
            (std::vector<std::string>{
                example({{"a", {2}}, {"b", {1}}}),
                example({{"a", {4}}, {"b", {3}}}),
                "bad",
                example({{"0", {7}}, {"a", {8}}}),
                example({{"0", {9}}, {"a", {10}}, {"b", {11}}}),
                example({{"0", {12}}}),
                "bad",
                example({{"a", {16}}, {"b", {15}}}),
            }));
  // A key float in one source and int64 in the next, read on this thread.
  records::ExampleBuilder floats;
  floats.AddFloatList("a", std::vector<float>{1.0f});
  EXPECT_EQ(rows("f.jsonl", "{\"a\": 0.5}\n{\"a\": 1}\n").at(1),
            floats.Serialize());
  EXPECT_EQ(rows("i.jsonl", "{\"a\": 2}\n{\"a\": 1}\n").at(1),
            example({{"a", {1}}}));
}

// What is not an error but changes or leaves out data is said: a key no
// value types (only null or [] wherever it appears) and integers that the
// float32 of a key holding floats rounds, with the first one's place.
TEST(JsonlTest, UntypedKeysAndIntegersAFloatRoundsAreWarnedOf) {
  testing::TempDir dir;
  const std::string f = dir.File("in.jsonl");
  testing::WriteFileBytes(
      f,
      "{\"x\": 1, \"n\": null, \"e\": [], \"id\": 16777217}\n"
      "{\"x\": 2.5, \"id\": 3}\n"
      "\n"
      "{\"x\": 16777217, \"n\": null}\n"
      "{\"x\": [33554433, 16777216, -9007199254740993]}\n");
  const auto warnings = OpenSource("jsonl", {.files = {f}})->warnings();
  ASSERT_EQ(warnings.size(), 3u);
  EXPECT_EQ(warnings[0],
            "key 'e' is null or [] in every row that has it: no feature is "
            "written for it (no value to infer its type from; a --spec entry "
            "gives it one)");
  EXPECT_EQ(warnings[1].substr(0, 11), "key 'n' is ");
  // Line 4 (the blank line 3 counts), and 2 more: 33554433 and -2^53-1;
  // 16777216 (2^24) and the int64 key 'id' lose nothing.
  EXPECT_EQ(warnings[2],
            f + ":4: key 'x': the integer 16777217 becomes 16777216 in the "
                "key's float feature (float32 holds integers exactly only up "
                "to 2^24; 3 such values in all); if every value is an "
                "integer, a --spec entry of dtype int64 keeps them exact");
  // Within one line's array, too, the first such integer is named.
  const std::string g = dir.File("array.jsonl");
  testing::WriteFileBytes(g, "{\"y\": [0.5, 16777219, 16777217]}\n");
  const auto in_array = OpenSource("jsonl", {.files = {g}})->warnings();
  ASSERT_EQ(in_array.size(), 1u);
  EXPECT_EQ(in_array[0].rfind(g + ":1: key 'y': the integer 16777219 becomes "
                                  "16777220 in the key's float feature",
                              0),
            0u)
      << in_array[0];
  EXPECT_NE(in_array[0].find("2 such values in all"), std::string::npos)
      << in_array[0];
  const auto ex = SourceExamples("jsonl", {.files = {f}});
  EXPECT_FLOAT_EQ(Get(ex[2], "x")->float_list().value(0), 16777216.0f);
  EXPECT_EQ(Get(ex[0], "id")->int64_list().value(0), 16777217);
  // Typed by a spec, a key says nothing; a float spec rounds as inferred.
  const auto spec = records::FeatureSpec::FromJsonText(
      R"({"features": {"n": {"dtype": "bytes"}, "id": {"dtype": "float32"}}})");
  const auto typed =
      OpenSource("jsonl", {.files = {f}, .spec = &spec})->warnings();
  ASSERT_EQ(typed.size(), 3u);
  EXPECT_EQ(typed[0].substr(0, 8), "key 'e' ");
  EXPECT_EQ(typed[1].substr(0, f.size() + 12), f + ":1: key 'id'");
  EXPECT_EQ(typed[2].substr(0, f.size() + 11), f + ":4: key 'x'");
  // Integers past uint64 in a float key: 2^64 + 1 rounds, 2^64 does not,
  // and a float written as 1e19 is no integer.
  testing::WriteFileBytes(f,
                          "{\"b\": 0.5, \"c\": 1e19}\n"
                          "{\"b\": 18446744073709551617, \"c\": 1.5}\n"
                          "{\"b\": [18446744073709551616, -1]}\n");
  const auto big = OpenSource("jsonl", {.files = {f}})->warnings();
  ASSERT_EQ(big.size(), 1u);
  EXPECT_EQ(big[0].substr(0, big[0].find(" (")),
            f + ":2: key 'b': the integer 18446744073709551617 becomes "
                "18446744073709551616 in the key's float feature");
  EXPECT_NE(big[0].find("; 1 such value in all"), std::string::npos);
  EXPECT_FLOAT_EQ(Get(SourceExamples("jsonl", {.files = {f}})[2], "b")
                      ->float_list()
                      .value(0),
                  18446744073709551616.0f);
  // Every key typed and every integer exact: nothing to say.
  testing::WriteFileBytes(f, "{\"a\": 1, \"b\": [2.5, 16777216]}\n");
  EXPECT_TRUE(OpenSource("jsonl", {.files = {f}})->warnings().empty());
}

// The typing pass reads lines in chunks, types them on every core and
// merges the chunks in input order: over many chunks and several files
// (one empty), each key is typed as the lines one by one type it (the
// first value that is not null or [] says string or number; numbers widen
// int64 -> float), and the first integer a float key rounds is named at
// its own file and line.  Each line has one key, so what it builds, or the
// error it gives, shows that key's type.
TEST(JsonlTest, KeysAreTypedInLineOrderAcrossChunksAndFiles) {
  testing::TempDir dir;
  std::mt19937_64 rng(5);
  constexpr int kKeys = 32;
  // Per key: lines before `start` (of all files' lines) hold null or [];
  // from `start`, values of kind `first` (0: int, 1: float, 2: string, 3:
  // bool); from `later`, of any kind `kinds` allows (bit k: kind k), so
  // that a key's values change kind in another chunk or the same.
  struct Key {
    uint64_t start = 0;
    unsigned kinds = 0;
    unsigned first = 0;
    uint64_t later = 0;
    CellType type = CellType::kNone;  // the lines one by one
    uint64_t rounded = 0;             // int64s a float32 rounds
    std::string first_rounded;        // "file:line"
  };
  const std::vector<int> lines_in = {2500, 0, 1700, 3100};
  const uint64_t all_lines = 2500 + 1700 + 3100;
  std::vector<Key> keys;
  for (int k = 0; k < kKeys; ++k) {
    const unsigned kinds = k == 0 ? 0 : 1 + rng() % 15;
    unsigned first = 0;
    while (kinds != 0 && (kinds & (1u << first)) == 0) first = rng() % 4;
    Key& key = keys.emplace_back();
    key.start = rng() % all_lines;
    key.kinds = kinds;
    key.first = first;
    key.later = key.start + rng() % (all_lines - key.start);
  }
  std::vector<std::string> files;
  std::vector<std::string> lines;  // every non-blank line, in order
  std::vector<int> key_of;         // of each
  uint64_t line_index = 0;
  for (size_t f = 0; f < lines_in.size(); ++f) {
    files.push_back(dir.File(fmt::format("in{}.jsonl", f)));
    std::string text;
    uint64_t line_number = 0;
    for (int i = 0; i < lines_in[f]; ++i, ++line_index) {
      if (rng() % 50 == 0) {
        text += " \n";
        ++line_number;
      }
      const int k = static_cast<int>(rng() % kKeys);
      Key& key = keys[k];
      std::string value;
      CellType type = CellType::kNone;
      if (line_index < key.start || key.kinds == 0) {
        value = rng() % 2 ? "null" : "[]";
      } else {
        unsigned kind = key.first;
        if (line_index >= key.later) {
          do kind = rng() % 4;
          while ((key.kinds & (1u << kind)) == 0);
        }
        int64_t v = static_cast<int64_t>(rng() % 100);
        if (rng() % 4 == 0) v += (int64_t{1} << 24) + 1;  // may round
        switch (kind) {
          case 0:
            value = std::to_string(v);
            type = CellType::kInt64;
            break;
          case 1:
            value = fmt::format("{}.5", v % 100);
            type = CellType::kFloat;
            break;
          case 2:
            value = fmt::format("\"s{}\"", v);
            type = CellType::kBytes;
            break;
          default:
            value = v % 2 ? "true" : "false";
            type = CellType::kInt64;
            break;
        }
        if (kind == 0 && InexactIntegers::Rounded(v).has_value() &&
            key.rounded++ == 0) {
          key.first_rounded = fmt::format("{}:{}", files[f], line_number + 1);
        }
      }
      if (key.type == CellType::kNone ||
          (key.type != CellType::kBytes && type != CellType::kBytes)) {
        key.type = Widen(key.type, type);
      }
      text += fmt::format("{{\"k{}\": {}}}\n", k, value);
      ++line_number;
      lines.push_back(text.substr(text.rfind('{')));
      key_of.push_back(k);
    }
    testing::WriteFileBytes(files.back(), text);
  }
  auto source = OpenSource("jsonl", {.files = files});
  ASSERT_EQ(source->rows(), all_lines);
  Row row;
  records::ExampleBuilder builder;
  for (size_t i = 0; i < lines.size(); ++i) {
    ASSERT_TRUE(source->NextRow(&row));
    const Key& key = keys[key_of[i]];
    const std::string name = fmt::format("k{}", key_of[i]);
    builder.Clear();
    tensorflow::Example ex;
    CellType got = CellType::kNone;
    try {
      source->Build(row, &builder);
      ex.ParseFromString(std::string(builder.Serialize()));
      if (const auto* f = Get(ex, name)) {
        got = f->has_int64_list()   ? CellType::kInt64
              : f->has_float_list() ? CellType::kFloat
                                    : CellType::kBytes;
      } else {
        continue;  // null or []: says nothing
      }
    } catch (const ConvertError& e) {
      const std::string what = e.what();
      got = what.find("expected string") != std::string::npos ? CellType::kBytes
            : what.find("expected numeric") != std::string::npos
                ? CellType::kFloat
            : what.find("expected integer") != std::string::npos
                ? CellType::kInt64
                : CellType::kNone;
      ASSERT_NE(got, CellType::kNone) << what;
    }
    ASSERT_EQ(static_cast<int>(got), static_cast<int>(key.type))
        << "line " << i << ": " << lines[i];
  }
  EXPECT_FALSE(source->NextRow(&row));
  // The warnings: key k0 untyped, and each float key's rounded integers.
  std::vector<std::string> want = {fmt::format(
      "key 'k0' is null or [] in every row that has it: no feature is "
      "written for it (no value to infer its type from; a --spec entry "
      "gives it one)")};
  std::vector<std::string> names;
  for (int k = 0; k < kKeys; ++k) names.push_back(fmt::format("k{}", k));
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    const Key& key = keys[std::stoi(name.substr(1))];
    if (key.type == CellType::kFloat && key.rounded > 0) {
      want.push_back(fmt::format("{}: key '{}'", key.first_rounded, name));
      want.push_back(fmt::format("{} such value{} in all", key.rounded,
                                 key.rounded == 1 ? "" : "s"));
    }
  }
  const std::vector<std::string> warnings = source->warnings();
  ASSERT_EQ(warnings.size(), 1 + (want.size() - 1) / 2);
  EXPECT_EQ(warnings[0], want[0]);
  for (size_t w = 1; w < warnings.size(); ++w) {
    EXPECT_EQ(warnings[w].rfind(want[2 * w - 1], 0), 0u) << warnings[w];
    EXPECT_NE(warnings[w].find(want[2 * w]), std::string::npos) << warnings[w];
  }
  // What the test reaches: keys of every type, and rounding warned of.
  std::set<CellType> types;
  for (const Key& key : keys) types.insert(key.type);
  EXPECT_EQ(types.size(), 4u);
  EXPECT_GT(warnings.size(), 1u);
}

// A spec naming a key that no row has (a typo) is refused, as a CSV
// spec naming a column the header lacks.
TEST(JsonlTest, ASpecKeyNoRowHasIsRefused) {
  testing::TempDir dir;
  const std::string f = dir.File("in.jsonl");
  testing::WriteFileBytes(f, "{\"label\": 1, \"x\": null}\n");
  const auto typo = records::FeatureSpec::FromJsonText(
      R"({"features": {"lable": {"dtype": "int64"}}})");
  EXPECT_EQ(ConvertErrorOf([&] {
              SourceExamples("jsonl", {.files = {f}, .spec = &typo});
            }),
            f + ": --spec names key 'lable', which no row of the input has "
                "(its keys: label, x)");
  // A key that is only ever null is there: the spec types it.
  const auto x = records::FeatureSpec::FromJsonText(
      R"({"features": {"x": {"dtype": "float32"}}})");
  EXPECT_EQ(ConvertErrorOf(
                [&] { SourceExamples("jsonl", {.files = {f}, .spec = &x}); }),
            "");
}

}  // namespace
}  // namespace recflow::convert
