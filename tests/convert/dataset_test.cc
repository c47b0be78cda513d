// convert/dataset.cc: a pipeline's elements written as sharded TFRecords,
// Examples or the records themselves, with the job's contract.
#include "pipeline/dataset.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "convert_test_util.h"
#include "pipeline/maps.h"
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

// An element whose record would be longer than max_record_bytes is a bad
// row naming the element, whichever way it is written.
TEST(ConvertDatasetTest, ARecordPastMaxRecordBytesIsABadElement) {
  testing::TempDir dir;
  const Dataset ds = Dataset::Range(0, 4).Map([](Element e) {
    const int64_t i = e["value"].scalar<int64_t>();
    Element out;
    const std::vector<std::string> text = {std::string(i == 2 ? 600 : 10, 'x')};
    out.Set("record", Tensor::FromStrings(text, Shape{}));
    return out;
  });
  for (const DatasetRecords& how :
       {DatasetRecords{}, DatasetRecords{.record_key = "record"},
        DatasetRecords{.record_key = "", .element_records = true}}) {
    ConvertJob job = Job(dir, 1);
    EXPECT_EQ(ConvertDataset(ds, how, job).records, 4u);
    job.max_record_bytes = 500;
    const std::string error =
        testing::ConvertErrorOf([&] { ConvertDataset(ds, how, job); });
    EXPECT_EQ(error.rfind("element 2: its record is ", 0), 0u) << error;
    EXPECT_NE(error.find("more than the 500 a record may have"),
              std::string::npos)
        << error;
    job.skip_bad = true;
    const ConvertSummary s = ConvertDataset(ds, how, job);
    EXPECT_EQ(s.records, 3u);
    EXPECT_EQ(s.first_skipped, error);
  }
}

// Element i of Mixed(), batched by 7 (the last short) with its vectors
// ragged: every dtype, batched, ragged and bytes.
Dataset MixedRaggedBatches(int64_t n) {
  return MixedElements(n).RaggedBatch(7);
}

TEST(SaveDatasetTest, LoadGivesBackEveryElementExactly) {
  const Dataset ds = MixedRaggedBatches(600);
  const std::vector<Element> saved = All(ds);
  ASSERT_EQ(saved.size(), 86u);
  ASSERT_TRUE(saved[0]["f32"].ragged());
  {  // one shard: the order saved
    testing::TempDir dir;
    const ConvertSummary s = SaveDataset(ds, dir.File("saved"));
    EXPECT_EQ(s.records, 86u);
    const Dataset loaded = LoadDataset(dir.File("saved"));
    EXPECT_EQ(loaded.Cardinality(), 86);
    const std::vector<Element> back = All(loaded);
    ASSERT_EQ(back.size(), saved.size());
    for (size_t i = 0; i < back.size(); ++i) {
      ASSERT_EQ(back[i], saved[i]) << "element " << i;
      // The origin: where the element's record is now.
      ASSERT_TRUE(back[i].origin.file);
      EXPECT_EQ(back[i].origin.record, i);
    }
  }
  // Three compressed shards, read two at a time: the same elements (each
  // shard in the order saved), and every record is an element record with
  // an index.
  testing::TempDir dir;
  const ConvertSummary s =
      SaveDataset(ds, dir.File("saved"),
                  {.shards = 3, .compression = records::Compression::kZstd});
  ASSERT_EQ(s.shards.size(), 3u);
  EXPECT_EQ(dir.List(), std::vector<std::string>{"saved"});
  LoadOptions two;
  two.reading.num_parallel_reads = 2;
  two.num_parallel_calls = 2;
  const std::vector<Element> back = All(LoadDataset(dir.File("saved"), two));
  ASSERT_EQ(back.size(), saved.size());
  for (const Element& e : saved) {
    EXPECT_EQ(std::count(back.begin(), back.end(), e), 1);
  }
  // In a uniform random order each epoch, by the indexes saved.
  LoadOptions global;
  global.global_shuffle =
      pipeline::GlobalShuffleOptions{.seed = 4, .num_epochs = 2};
  const Dataset shuffled = LoadDataset(dir.File("saved"), global);
  EXPECT_EQ(shuffled.Cardinality(), 2 * 86);
  const std::vector<Element> epochs = All(shuffled);
  ASSERT_EQ(epochs.size(), 2 * saved.size());
  const std::vector<Element> first(epochs.begin(), epochs.begin() + 86);
  EXPECT_NE(first, saved);
  for (const Element& e : saved) {
    EXPECT_EQ(std::count(first.begin(), first.end(), e), 1);
  }
  EXPECT_TRUE(std::filesystem::exists(records::IndexPathFor(s.shards[2].path)));
  // Saving again into it is refused; nothing is overwritten.
  EXPECT_EQ(
      testing::ConvertErrorOf([&] { SaveDataset(ds, dir.File("saved")); }),
      fmt::format("{}: already holds a saved dataset ({}/dataset.json); "
                  "remove it or save elsewhere",
                  dir.File("saved"), dir.File("saved")));
}

TEST(SaveDatasetTest, LoadRefusesWhatIsNotAWholeSavedDataset) {
  testing::TempDir dir;
  const std::string saved = dir.File("saved");
  SaveDataset(Dataset::Range(0, 600), saved, {.shards = 2});
  // A shard cut short at a record's end reads as a valid file: the count
  // saved tells.
  const std::string shard = saved + "/elements-00001-of-00002.tfrecord";
  const records::Index index = records::ReadIndex(records::IndexPathFor(shard));
  ASSERT_EQ(index.entries.size(), 256u);  // the second chunk of 256
  std::filesystem::resize_file(shard, index.entries.back().offset);
  std::string error;
  try {
    All(LoadDataset(saved));
  } catch (const pipeline::Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("expected to contain 600 elements but contained only "
                       "599"),
            std::string::npos)
      << error;
  // A global shuffle counts the records as it is made: without its index,
  // the cut shard is indexed by reading it, 255 records.
  std::filesystem::remove(records::IndexPathFor(shard));
  EXPECT_EQ(testing::ConvertErrorOf([&] {
              LoadDataset(saved,
                          {.global_shuffle = pipeline::GlobalShuffleOptions{}});
            }),
            fmt::format("{}: its shards' indexes hold 599 records; "
                        "dataset.json says 600",
                        saved));
  // A shard gone, a manifest gone or of something else.
  std::filesystem::remove(shard);
  EXPECT_EQ(testing::ConvertErrorOf([&] { LoadDataset(saved); }),
            fmt::format("{}: shard {} of the saved dataset is missing", saved,
                        shard));
  testing::WriteFileBytes(saved + "/dataset.json", R"({"format": "other"})");
  EXPECT_NE(testing::ConvertErrorOf([&] {
              LoadDataset(saved);
            }).find("dataset.json: not a recflow-saved-dataset of version 1"),
            std::string::npos);
  std::filesystem::remove(saved + "/dataset.json");
  EXPECT_EQ(testing::ConvertErrorOf([&] { LoadDataset(saved); }),
            fmt::format("{}: no saved dataset here ({}/dataset.json cannot be "
                        "read: No such file or directory)",
                        saved, saved));
  // Records that are no element records, named.
  const std::string plain = dir.File("plain.tfrecord");
  testing::WriteRecords(plain, {"not an element"});
  std::string decode;
  try {
    All(Dataset::FromTFRecords({plain}).Map(pipeline::maps::DecodeElement()));
  } catch (const pipeline::Error& e) {
    decode = e.what();
  }
  EXPECT_EQ(decode.find(fmt::format("decode_element('record'): not an element "
                                    "record ({}: record 0 at offset 0): ",
                                    plain)),
            0u)
      << decode;
}

}  // namespace
}  // namespace recflow::convert
