// Dataset::FromCsv (csv_dataset.cc): typed columns, as tf.data's CsvDataset.
#include <gtest/gtest.h>

#include "pipeline/dataset.h"
#include "pipeline_test_util.h"
#include "test_util.h"

namespace recflow::pipeline {
namespace {

using testing::Collect;
using testing::DrainWithErrors;

TEST(CsvDatasetTest, CsvRowsBecomeTypedScalars) {
  testing::TempDir dir;
  testing::WriteFileBytes(dir.File("a.csv"),
                          "id,score,name\n1,0.5,\"x, y\"\n2,1.5,z\n");
  auto out = Collect(Dataset::FromCsv({dir.File("a.csv")}));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0]["id"].dtype(), DType::kInt64);
  EXPECT_EQ(out[1]["id"].scalar<int64_t>(), 2);
  EXPECT_FLOAT_EQ(out[1]["score"].scalar<float>(), 1.5f);
  EXPECT_EQ(out[0]["name"].bytes(0), "x, y");
  testing::WriteFileBytes(dir.File("b.csv"), "id,score,name\n3,oops,w\n");
  CsvOptions o;
  try {
    Collect(Dataset::FromCsv({dir.File("a.csv"), dir.File("b.csv")}, o));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("b.csv:2: column 'score'"),
              std::string::npos)
        << e.what();
  }
}

// Compressed CSV files (tf.data's compression_type): by each name's suffix,
// or as told; a state restores into the decoded stream.
TEST(CsvDatasetTest, CompressedFilesByNameOrAsTold) {
  testing::TempDir dir;
  const std::string text = "id,v\n1,x\n2,y\n3,z\n";
  testing::WriteFileBytes(
      dir.File("a.csv.zst"),
      testing::Compressed(text, records::Compression::kZstd));
  testing::WriteFileBytes(
      dir.File("b.data"),
      testing::Compressed(text, records::Compression::kGzip));
  const Dataset by_name = Dataset::FromCsv({dir.File("a.csv.zst")});
  EXPECT_EQ(testing::Ints(Collect(by_name), "id"),
            (std::vector<int64_t>{1, 2, 3}));
  CsvOptions gzip;
  gzip.compression = records::Compression::kGzip;
  const Dataset told = Dataset::FromCsv({dir.File("b.data")}, gzip);
  EXPECT_EQ(testing::Ints(Collect(told), "id"),
            (std::vector<int64_t>{1, 2, 3}));
  Iterator whole = told.MakeIterator();
  testing::ExpectRestoresAfterEveryElement(told, DrainWithErrors(whole));
  EXPECT_NE(told.Describe().find(", gzip)"), std::string::npos)
      << told.Describe();
}

// Saved after any element or error, a restored iterator gives exactly the
// rest: rows after a bad row, and the next file after a file that fails
// (a header unlike the first file's, an unclosed quote) - never that
// file's other rows, never a row twice or not at all.
TEST(CsvDatasetTest, ARestoredIteratorContinuesAfterEveryElementAndError) {
  testing::TempDir dir;
  testing::WriteFileBytes(dir.File("a.csv"), "id,v\n1,x\n2,y,extra\n3,z\n");
  testing::WriteFileBytes(dir.File("b.csv"), "v,id\n4,p\n5,q\n");
  testing::WriteFileBytes(dir.File("c.csv"), "id,v\n6,r\n\"7,s\n");
  testing::WriteFileBytes(dir.File("d.csv"), "id,v\n8,t\n9,u\n");
  const Dataset ds = Dataset::FromCsv({dir.File("a.csv"), dir.File("b.csv"),
                                       dir.File("c.csv"), dir.File("d.csv")});
  Iterator whole = ds.MakeIterator();
  const std::vector<std::string> all = DrainWithErrors(whole);
  // 1, the short row's error, 3, b's header, 6, c's quote, 8, 9, the end.
  ASSERT_EQ(all.size(), 9u);
  EXPECT_EQ(all[1], "!" + dir.File("a.csv") + ":3: 3 fields, the header has 2");
  EXPECT_EQ(all[3], "!" + dir.File("b.csv") + ":1: header differs from " +
                        dir.File("a.csv") + "'s");
  EXPECT_EQ(all[5],
            "!" + dir.File("c.csv") + ":3: a quoted field is not closed");
  for (size_t i : {0u, 2u, 4u, 6u, 7u}) {
    EXPECT_EQ(all[i].front(), '{') << i << ": " << all[i];
  }
  testing::ExpectRestoresAfterEveryElement(ds, all);
  // Skipping errors: every good row, once.
  std::vector<int64_t> ids;
  for (const Element& e : Collect(ds.IgnoreErrors())) {
    ids.push_back(e["id"].scalar<int64_t>());
  }
  EXPECT_EQ(ids, (std::vector<int64_t>{1, 3, 6, 8, 9}));
  // And a state saved through IgnoreErrors, after any of them.
  const Dataset skipping = ds.IgnoreErrors();
  for (size_t k = 0; k <= ids.size(); ++k) {
    Iterator it = skipping.MakeIterator();
    for (size_t i = 0; i < k; ++i) it.Next();
    Iterator restored = skipping.MakeIterator();
    restored.Restore(it.Save());
    std::vector<int64_t> rest;
    while (auto e = restored.Next())
      rest.push_back((*e)["id"].scalar<int64_t>());
    EXPECT_EQ(rest, std::vector<int64_t>(ids.begin() + k, ids.end()))
        << "saved after " << k;
  }
}

TEST(CsvDatasetTest, ColumnsAreSelectedAndTypedByName) {
  testing::TempDir dir;
  testing::WriteFileBytes(dir.File("a.csv"), "id,score,name\n1,2,x\n3,4.5,y\n");
  CsvOptions o;
  o.select_columns = {"name", "score"};
  o.column_types = {{"score", DType::kFloat32}};
  const Dataset ds = Dataset::FromCsv({dir.File("a.csv")}, o);
  const auto out = Collect(ds);
  ASSERT_EQ(out.size(), 2u);
  ASSERT_EQ(out[0].components.size(), 2u);  // in the header's order
  EXPECT_EQ(out[0].components[0].name, "score");
  EXPECT_EQ(out[0].components[1].name, "name");
  EXPECT_FLOAT_EQ(out[1]["score"].scalar<float>(), 4.5f);
  EXPECT_EQ(ds.Describe().find("Csv(1 files "), 0u) << ds.Describe();
  EXPECT_NE(ds.Describe().find("score:float32 name:bytes"), std::string::npos)
      << ds.Describe();
  const auto error = [&](CsvOptions options, std::vector<std::string> files) {
    try {
      Dataset::FromCsv(std::move(files), std::move(options));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  o.select_columns = {"name", "nope"};
  EXPECT_EQ(error(o, {dir.File("a.csv")}),
            "FromCsv: " + dir.File("a.csv") + " has no column 'nope'");
  CsvOptions t;
  t.column_types = {{"id", DType::kUInt8}};
  EXPECT_EQ(error(t, {dir.File("a.csv")}),
            "FromCsv: column 'id': uint8 columns are not supported (int64, "
            "float32 or bytes)");
  // A column type for a column the header lacks is a typo, not ignored.
  CsvOptions typo;
  typo.column_types = {{"scroe", DType::kFloat32}};
  EXPECT_EQ(error(typo, {dir.File("a.csv")}),
            "FromCsv: column_types names 'scroe', which " + dir.File("a.csv") +
                " lacks (its columns: id, score, name)");
  CsvOptions d;
  d.delimiter = '"';
  EXPECT_EQ(error(d, {dir.File("a.csv")}),
            "FromCsv: CSV delimiter '\"': a quote or line end cannot "
            "separate fields");
  testing::WriteFileBytes(dir.File("empty.csv"), "");
  EXPECT_EQ(
      error({}, {dir.File("empty.csv")}),
      dir.File("empty.csv") + ": empty; a CSV file starts with a header row");
  // Components are named by the header: two columns taken under one name
  // (a second would hide the first) or one without a name are errors;
  // such columns left out by select_columns are not.
  testing::WriteFileBytes(dir.File("twice.csv"), "id,,note,id\n1,2,x,3\n");
  EXPECT_EQ(error({}, {dir.File("twice.csv")}),
            "FromCsv: " + dir.File("twice.csv") +
                ":1: column 2 of the header: names must be non-empty UTF-8");
  CsvOptions both;
  both.select_columns = {"id", "note"};
  EXPECT_EQ(error(both, {dir.File("twice.csv")}),
            "FromCsv: " + dir.File("twice.csv") +
                ":1: columns 1 and 4 of the header are both named 'id'; names "
                "must differ");
  CsvOptions note;
  note.select_columns = {"note"};
  const auto notes = Collect(Dataset::FromCsv({dir.File("twice.csv")}, note));
  ASSERT_EQ(notes.size(), 1u);
  ASSERT_EQ(notes[0].components.size(), 1u);
  EXPECT_EQ(notes[0]["note"].bytes(0), "x");
}

// tf.data's CsvDataset(field_delim=...): a tab-separated file, quoted
// fields holding the delimiter, across files and a restore.
TEST(CsvDatasetTest, ADelimiterOtherThanACommaSeparatesFields) {
  testing::TempDir dir;
  testing::WriteFileBytes(dir.File("a.tsv"), "id\tnote\n1\t\"a\tb\"\n2\tx,y\n");
  testing::WriteFileBytes(dir.File("b.tsv"), "id\tnote\n3\tz\n");
  CsvOptions o;
  o.delimiter = '\t';
  const Dataset ds =
      Dataset::FromCsv({dir.File("a.tsv"), dir.File("b.tsv")}, o);
  const auto out = Collect(ds);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0]["id"].scalar<int64_t>(), 1);
  EXPECT_EQ(out[0]["note"].bytes(0), "a\tb");
  EXPECT_EQ(out[1]["note"].bytes(0), "x,y");
  EXPECT_EQ(out[2]["id"].scalar<int64_t>(), 3);
  // Read as commas, the same file is one column named "id\tnote".
  const auto commas = Collect(Dataset::FromCsv({dir.File("b.tsv")}));
  ASSERT_EQ(commas.size(), 1u);
  EXPECT_NE(commas[0].Find("id\tnote"), nullptr);
  // Where a column or a row's fields are then missing, the error says why.
  const std::string hint =
      "; the header is a single column whose name holds tabs: if tabs "
      "separate the columns, set the delimiter to tab";
  const auto error = [&](const CsvOptions& options) {
    try {
      Dataset::FromCsv({dir.File("a.tsv")}, options);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CsvOptions note;
  note.select_columns = {"note"};
  EXPECT_EQ(error(note),
            "FromCsv: " + dir.File("a.tsv") + " has no column 'note'" + hint);
  CsvOptions typed;
  typed.column_types = {{"note", DType::kBytes}};
  EXPECT_EQ(error(typed), "FromCsv: column_types names 'note', which " +
                              dir.File("a.tsv") +
                              " lacks (its columns: id\tnote)" + hint);
  Iterator it = Dataset::FromCsv({dir.File("a.tsv")}).MakeIterator();
  const std::vector<std::string> all = DrainWithErrors(it);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[1],
            "!" + dir.File("a.tsv") + ":3: 2 fields, the header has 1" + hint);
  // A header of one column that holds no other delimiter says nothing more.
  testing::WriteFileBytes(dir.File("one.csv"), "id\n1\n2,3\n");
  Iterator one = Dataset::FromCsv({dir.File("one.csv")}).MakeIterator();
  EXPECT_EQ(DrainWithErrors(one)[1],
            "!" + dir.File("one.csv") + ":3: 2 fields, the header has 1");
}

// A row longer than max_row_bytes (its cells and delimiters) ends its
// file with an error, as an unclosed quote does; the next file is read.
TEST(CsvDatasetTest, ARowPastMaxRowBytesEndsItsFile) {
  testing::TempDir dir;
  const std::string big(600, 'x');
  testing::WriteFileBytes(dir.File("a.csv"), "id,s\n1,a\n2," + big + "\n3,b\n");
  testing::WriteFileBytes(dir.File("b.csv"), "id,s\n4,c\n");
  CsvOptions o;
  o.max_row_bytes = 602;  // "2,xxx...": exactly
  const std::vector<std::string> files = {dir.File("a.csv"), dir.File("b.csv")};
  EXPECT_EQ(testing::Ints(Collect(Dataset::FromCsv(files, o)), "id"),
            (std::vector<int64_t>{1, 2, 3, 4}));
  o.max_row_bytes = 601;
  const Dataset ds = Dataset::FromCsv(files, o);
  Iterator it = ds.MakeIterator();
  const std::vector<std::string> all = DrainWithErrors(it);
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(all[1], "!" + dir.File("a.csv") +
                        ":3: the row is longer than 601 bytes (its cells and "
                        "delimiters), the most a row may hold (max_row_bytes): "
                        "is the file CSV, with its line ends?");
  EXPECT_EQ(testing::Ints(Collect(ds.IgnoreErrors()), "id"),
            (std::vector<int64_t>{1, 4}));
  testing::ExpectRestoresAfterEveryElement(ds, all);
}

// Shard takes whole files (at least as many as shards), read as the first
// file's columns: a shard without the first file types its cells as the
// whole dataset does, so every worker's elements have the same types.
TEST(CsvDatasetTest, ShardTakesWholeFilesTypedByTheFirstFile) {
  testing::TempDir dir;
  testing::WriteFileBytes(dir.File("a.csv"), "id,score\n1,2\n");
  testing::WriteFileBytes(dir.File("b.csv"), "id,score\n2,2.5\n");
  testing::WriteFileBytes(dir.File("c.csv"), "id,score\n3,4\n");
  const Dataset ds = Dataset::FromCsv(
      {dir.File("a.csv"), dir.File("b.csv"), dir.File("c.csv")});
  const Dataset first = ds.Shard(2, 0);
  EXPECT_EQ(testing::Ints(Collect(first), "id"), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(first.Describe().rfind("Csv(2 files", 0), 0u) << first.Describe();
  Iterator second = ds.Shard(2, 1).MakeIterator();
  EXPECT_EQ(testing::NextOrError(second),
            "!" + dir.File("b.csv") +
                ":2: column 'score': expected an integer, found \"2.5\"");
  // Fewer files than shards: by element.
  const Dataset two = Dataset::FromCsv({dir.File("a.csv"), dir.File("c.csv")});
  EXPECT_EQ(testing::Ints(Collect(two.Shard(3, 1)), "id"),
            (std::vector<int64_t>{3}));
}

// A float column reads 1e-50 as 0 and refuses 1e39 by line (never inf).
TEST(CsvDatasetTest, Float32EdgesAreZeroOrAnError) {
  testing::TempDir dir;
  testing::WriteFileBytes(dir.File("a.csv"), "x\n1e-50\n+2.5\n1e39\n");
  std::vector<float> got;
  try {
    for (const Element& e : Collect(Dataset::FromCsv({dir.File("a.csv")}))) {
      got.push_back(e["x"].scalar<float>());
    }
    FAIL() << "1e39 was read";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              dir.File("a.csv") +
                  ":4: column 'x': 1e39 is outside float32's "
                  "range (a float would be inf)");
  }
  const auto first = Collect(Dataset::FromCsv({dir.File("a.csv")}).Take(2));
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0]["x"].scalar<float>(), 0.0f);
  EXPECT_EQ(first[1]["x"].scalar<float>(), 2.5f);
}

}  // namespace
}  // namespace recflow::pipeline
