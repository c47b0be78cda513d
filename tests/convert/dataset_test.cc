// convert/dataset.cc: a pipeline's elements written as sharded TFRecords,
// Examples or the records themselves, with the job's contract.
#include "pipeline/dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "convert_test_util.h"
#include "records/index.h"
#include "records/tfrecord_writer.h"

namespace recflow::convert {
namespace {

using pipeline::Dataset;
using pipeline::DType;
using pipeline::Element;
using pipeline::Shape;
using pipeline::Tensor;
using testing::Get;
using testing::ShardExamples;

// Element i: a component of every dtype.
Element Mixed(int64_t i) {
  Element e;
  e.Set("f32", Tensor::FromValues<float>(std::vector<float>{0.5f * i, -1.0f},
                                         Shape{2}));
  e.Set("f64", Tensor::Scalar<double>(0.25 * i));
  e.Set("i64", Tensor::Scalar<int64_t>(i - 5));
  e.Set("i32",
        Tensor::FromValues<int32_t>(
            std::vector<int32_t>{static_cast<int32_t>(-i), 7}, Shape{2, 1}));
  e.Set("u8",
        Tensor::FromValues<uint8_t>(
            std::vector<uint8_t>{255, static_cast<uint8_t>(i)}, Shape{2}));
  const std::vector<std::string> words = {"w" + std::to_string(i), ""};
  e.Set("s", Tensor::FromStrings(words, Shape{2}));
  return e;
}

Dataset MixedElements(int64_t n) {
  return Dataset::Range(0, n).Map(
      [](Element e) { return Mixed(e["value"].scalar<int64_t>()); });
}

std::vector<Element> All(const Dataset& ds) {
  pipeline::Iterator it = ds.MakeIterator();
  std::vector<Element> out;
  Element e;
  while (it.Next(&e)) out.push_back(e);
  return out;
}

ConvertJob Job(const testing::TempDir& dir, uint64_t shards) {
  ConvertJob job;
  job.output = dir.File("part");
  job.shards = shards;
  return job;
}

TEST(ConvertDatasetTest, EachElementBecomesAnExampleOfItsComponents) {
  testing::TempDir dir;
  ConvertJob job = Job(dir, 3);
  job.writer.build_index = true;
  const ConvertSummary s = ConvertDataset(MixedElements(600), {}, job);
  EXPECT_EQ(s.records, 600u);
  ASSERT_EQ(s.shards.size(), 3u);
  EXPECT_EQ(s.shards[2].path, dir.File("part-00002-of-00003.tfrecord"));
  EXPECT_TRUE(s.labels_file.empty());
  for (const auto& shard : s.shards) {
    EXPECT_EQ(
        records::ReadIndex(records::IndexPathFor(shard.path)).entries.size(),
        shard.records);
  }
  // Chunks of 256 go round-robin: elements 0-255, 256-511, 512-599.
  EXPECT_EQ(s.shards[0].records, 256u);
  EXPECT_EQ(s.shards[2].records, 88u);
  const auto examples = ShardExamples(s);
  ASSERT_EQ(examples.size(), 600u);
  const tensorflow::Example& ex = examples[300];
  EXPECT_EQ(Get(ex, "f32")->float_list().value(0), 150.0f);
  EXPECT_EQ(Get(ex, "f32")->float_list().value(1), -1.0f);
  EXPECT_EQ(Get(ex, "f64")->float_list().value(0), 75.0f);
  EXPECT_EQ(Get(ex, "i64")->int64_list().value(0), 295);
  ASSERT_EQ(Get(ex, "i32")->int64_list().value_size(), 2);
  EXPECT_EQ(Get(ex, "i32")->int64_list().value(0), -300);
  EXPECT_EQ(Get(ex, "u8")->int64_list().value(0), 255);
  EXPECT_EQ(Get(ex, "u8")->int64_list().value(1), 300 % 256);
  EXPECT_EQ(Get(ex, "s")->bytes_list().value(0), "w300");
  EXPECT_EQ(Get(ex, "s")->bytes_list().value(1), "");
  // And recflow's own reader parses them back with a spec of the shapes.
  const auto spec = records::FeatureSpec::FromJsonText(R"({"features": {
    "f32": {"kind": "fixed", "dtype": "float32", "shape": [2]},
    "i32": {"kind": "fixed", "dtype": "int64", "shape": [2, 1]},
    "s": {"kind": "fixed", "dtype": "bytes", "shape": [2]}}})");
  std::vector<std::string> files;
  for (const auto& shard : s.shards) files.push_back(shard.path);
  const auto parsed = All(Dataset::FromTFRecords(files).Parse(spec));
  ASSERT_EQ(parsed.size(), 600u);
  EXPECT_EQ(parsed[599]["i32"].shape(), (Shape{2, 1}));
  EXPECT_EQ(parsed[599]["i32"].values<int64_t>()[0], -599);
  EXPECT_EQ(parsed[599]["s"].bytes(0), "w599");
}

TEST(ConvertDatasetTest, RaggedComponentsWriteTheirValues) {
  testing::TempDir dir;
  // Batches of 2 of [i] x i: ragged [2, (i)].
  const Dataset ragged =
      Dataset::Range(1, 5)
          .Map([](Element e) {
            const int64_t i = e["value"].scalar<int64_t>();
            Element out;
            out.Set("r", Tensor::FromValues<int64_t>(
                             std::vector<int64_t>(static_cast<size_t>(i), i),
                             Shape{i}));
            return out;
          })
          .RaggedBatch(2);
  const auto examples = ShardExamples(ConvertDataset(ragged, {}, Job(dir, 1)));
  ASSERT_EQ(examples.size(), 2u);
  EXPECT_EQ(Get(examples[1], "r")->int64_list().value_size(), 7);
}

TEST(ConvertDatasetTest, ARecordKeyWritesTheRecordsThemselves) {
  testing::TempDir dir;
  std::vector<std::string> written;
  {
    records::TFRecordWriter w(dir.File("in.tfrecord"));
    for (int i = 0; i < 500; ++i) {
      written.push_back("record " + std::to_string(i));
      w.Write(written.back());
    }
    w.Close();
  }
  // A shuffled, filtered reshard.
  const Dataset ds = Dataset::FromTFRecords({dir.File("in.tfrecord")})
                         .Shuffle(100, 7)
                         .Filter([](const Element& e) {
                           return e["record"].bytes(0).back() != '3';
                         });
  const ConvertSummary s =
      ConvertDataset(ds, {.record_key = "record"}, Job(dir, 2));
  EXPECT_EQ(s.records, 450u);
  std::vector<std::string> got;
  for (const auto& shard : s.shards) {
    for (auto& r : testing::ReadRecords(shard.path)) got.push_back(r);
  }
  // The shuffled stream, in order: records 0-255 in shard 0, the rest in
  // shard 1.
  std::vector<std::string> want;
  for (const Element& e : All(ds)) want.emplace_back(e["record"].bytes(0));
  EXPECT_EQ(got, want);
  EXPECT_EQ(s.shards[0].records, 256u);
  std::sort(want.begin(), want.end());
  written.erase(
      std::remove_if(written.begin(), written.end(),
                     [](const std::string& r) { return r.back() == '3'; }),
      written.end());
  std::sort(written.begin(), written.end());
  EXPECT_EQ(want, written);
  // An element without the record is a row-level error.
  EXPECT_EQ(testing::ConvertErrorOf([&] {
              ConvertDataset(Dataset::Range(0, 3), {.record_key = "record"},
                             Job(dir, 1));
            }),
            "element 0: record_key 'record' names no component; the record "
            "must be a bytes scalar in host memory");
}

TEST(ConvertDatasetTest,
     BadValuesAreSkippedOnlyWhenAskedAndErrorsWriteNothing) {
  testing::TempDir dir;
  const Dataset big = Dataset::Range(0, 300).Map([](Element e) {
    const int64_t i = e["value"].scalar<int64_t>();
    Element out;
    out.Set("x", Tensor::Scalar<double>(i == 270 ? 1e300 : 1.0 * i));
    return out;
  });
  const std::string error =
      "element 270: component 'x': float64 value 1e+300 is outside "
      "float32's range, which a float_list holds";
  EXPECT_EQ(
      testing::ConvertErrorOf([&] { ConvertDataset(big, {}, Job(dir, 2)); }),
      error);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  ConvertJob skip = Job(dir, 2);
  skip.skip_bad = true;
  const ConvertSummary s = ConvertDataset(big, {}, skip);
  EXPECT_EQ(s.records, 299u);
  EXPECT_EQ(s.skipped, 1u);
  EXPECT_EQ(s.first_skipped, error);
  // The pipeline's own error ends the job, whatever skip_bad says.
  testing::TempDir other;
  ConvertJob failing = Job(other, 2);
  failing.skip_bad = true;
  EXPECT_THROW(ConvertDataset(Dataset::Range(0, 600).Map([](Element e) {
                 if (e["value"].scalar<int64_t>() == 555) {
                   throw pipeline::Error("element 555 is bad");
                 }
                 return e;
               }),
                              {}, failing),
               pipeline::Error);
  EXPECT_TRUE(std::filesystem::is_empty(other.path()));
}

}  // namespace
}  // namespace recflow::convert
