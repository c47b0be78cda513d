// Dataset::Cardinality against tf.data's rules, and against the elements
// an iteration actually gives wherever it is known.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pipeline/dataset.h"
#include "pipeline_test_util.h"
#include "records/tfrecord_writer.h"
#include "test_util.h"

namespace recflow::pipeline {
namespace {

using testing::Collect;

// The cardinality, checked against a run where it is a count.
int64_t Known(const Dataset& ds) {
  const int64_t n = ds.Cardinality();
  if (n >= 0) {
    EXPECT_EQ(static_cast<int64_t>(Collect(ds).size()), n) << ds.Describe();
  }
  return n;
}

TEST(CardinalityTest, CountsWhatTheStagesGive) {
  EXPECT_EQ(Known(Dataset::Range(0, 10)), 10);
  EXPECT_EQ(Known(Dataset::Range(0, 10, 3)), 4);
  EXPECT_EQ(Known(Dataset::Range(10, 0, -3)), 4);
  EXPECT_EQ(Known(Dataset::Range(5, 5)), 0);
  EXPECT_EQ(Known(Dataset::Range(5, 0)), 0);
  EXPECT_EQ(Dataset::Range(INT64_MIN, INT64_MAX, INT64_MAX).Cardinality(), 3);
  Element arrays;
  arrays.Set("x",
             Tensor::FromValues<int64_t>(std::vector<int64_t>(7, 1), Shape{7}));
  const Dataset seven = Dataset::FromTensorSlices(arrays);
  EXPECT_EQ(Known(seven), 7);
  const Dataset ten = Dataset::Range(0, 10);
  // One element per input element.
  EXPECT_EQ(Known(ten.Map(testing::Square).Shuffle(4).Prefetch(2).Cache()), 10);
  EXPECT_EQ(Known(ten.Enumerate()), 10);
  EXPECT_EQ(Known(ten.Scan(testing::Int(0),
                           [](const Element& state, Element e) {
                             return std::pair<Element, Element>{state, e};
                           })),
            10);
  // Windows (every case against a run: BatchTest).
  EXPECT_EQ(Known(ten.Window(3)), 4);
  EXPECT_EQ(Known(ten.Window(3, {.shift = 2, .drop_remainder = true})), 4);
  // Batches, with and without the remainder.
  EXPECT_EQ(Known(ten.Batch(4)), 3);
  EXPECT_EQ(Known(ten.Batch(4, true)), 2);
  EXPECT_EQ(Known(ten.Batch(5, true)), 2);
  EXPECT_EQ(Known(ten.PaddedBatch(3)), 4);
  // Take, Skip, Shard.
  EXPECT_EQ(Known(ten.Take(3)), 3);
  EXPECT_EQ(Known(ten.Take(30)), 10);
  EXPECT_EQ(Known(ten.Take(-1)), 10);
  EXPECT_EQ(Known(ten.Skip(3)), 7);
  EXPECT_EQ(Known(ten.Skip(30)), 0);
  EXPECT_EQ(Known(ten.Skip(-1)), 0);
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(Known(ten.Shard(3, i)), i == 0 ? 4 : 3) << i;
  }
  // Repeat, Zip, Concatenate.
  EXPECT_EQ(Known(ten.Repeat(3)), 30);
  EXPECT_EQ(Known(ten.Repeat(0)), 0);
  EXPECT_EQ(ten.Repeat().Cardinality(), kInfiniteCardinality);
  EXPECT_EQ(Known(Dataset::Range(0, 0).Repeat()), 0);
  EXPECT_EQ(Known(ten.Repeat().Take(25)), 25);
  EXPECT_EQ(Known(ten.Repeat().Skip(25).Take(4)), 4);
  const Dataset named = seven.Map([](Element e) {
    Element out;
    out.Set("y", e["x"]);
    return out;
  });
  EXPECT_EQ(Known(Dataset::Zip({ten, named})), 7);
  EXPECT_EQ(Known(Dataset::Zip({ten.Repeat(), named})), 7);
  EXPECT_EQ(Dataset::Zip({ten.Repeat(), named.Repeat()}).Cardinality(),
            kInfiniteCardinality);
  EXPECT_EQ(Known(ten.Concatenate(Dataset::Range(0, 5))), 15);
  EXPECT_EQ(ten.Concatenate(ten.Repeat()).Cardinality(), kInfiniteCardinality);
  // SampleFromDatasets: every input of weight > 0 when going on to the end.
  EXPECT_EQ(Known(Dataset::SampleFromDatasets(
                {ten, Dataset::Range(0, 5), Dataset::Range(0, 99)},
                {.weights = {1, 1, 0}, .seed = 3})),
            15);
  EXPECT_EQ(Dataset::SampleFromDatasets({ten, ten.Repeat()}).Cardinality(),
            kInfiniteCardinality);
  EXPECT_EQ(
      Dataset::SampleFromDatasets({ten, ten}, {.stop_on_empty_dataset = true})
          .Cardinality(),
      kUnknownCardinality);
  EXPECT_EQ(Dataset::SampleFromDatasets({ten.Repeat(), ten.Repeat()},
                                        {.stop_on_empty_dataset = true})
                .Cardinality(),
            kInfiniteCardinality);
}

TEST(CardinalityTest, UnknownWhereOnlyARunCanTell) {
  const Dataset ten = Dataset::Range(0, 10);
  const std::vector<Dataset> unknown = {
      ten.Filter([](const Element&) { return true; }),
      ten.TakeWhile([](const Element&) { return true; }),
      ten.FlatMap([](const Element&) { return Dataset::Range(0, 2); }),
      ten.Batch(2).Unbatch(),
      ten.IgnoreErrors(),
      Dataset::ChooseFromDatasets({ten}, Dataset::Range(0, 1).Repeat(3)),
      ten.Map([](Element) {
           Element out;
           out.Set("x", Tensor::FromValues<int64_t>(std::vector<int64_t>{1},
                                                    Shape{1}));
           return out;
         })
          .BucketBySequenceLength("x", {.bucket_batch_sizes = {2}}),
      Dataset::FromGenerator([] {
        return []() -> std::optional<Element> { return std::nullopt; };
      }),
  };
  for (const Dataset& ds : unknown) {
    EXPECT_EQ(ds.Cardinality(), kUnknownCardinality) << ds.Describe();
    // What follows an unknown stage stays unknown, Repeat() forever aside.
    EXPECT_EQ(ds.Batch(3).Take(2).Cardinality(), kUnknownCardinality);
    EXPECT_EQ(ds.Repeat().Cardinality(), kInfiniteCardinality);
  }
}

TEST(CardinalityTest, FilesAreUnknownUnlessIndexedForAGlobalShuffle) {
  testing::TempDir dir;
  std::vector<std::string> files;
  for (int f = 0; f < 2; ++f) {
    files.push_back(dir.File("part-" + std::to_string(f) + ".tfrecord"));
    records::TFRecordWriter w(files.back());
    for (int i = 0; i < 5 + f; ++i) w.Write(testing::MixedExample(f, i));
    w.Close();
  }
  EXPECT_EQ(Dataset::FromTFRecords(files).Cardinality(), kUnknownCardinality);
  const auto shuffled = [&](GlobalShuffleOptions o) {
    return Dataset::FromTFRecordsGlobalShuffle(files, o);
  };
  EXPECT_EQ(Known(shuffled({.seed = 1})), 11);
  EXPECT_EQ(Known(shuffled({.seed = 1, .num_epochs = 3})), 33);
  // Shard i of 4 over 33 positions: i, i + 4, ...
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(
        Known(shuffled(
            {.seed = 1, .num_shards = 4, .shard_index = i, .num_epochs = 3})),
        i == 0 ? 9 : 8)
        << i;
  }
  EXPECT_EQ(shuffled({.seed = 1, .num_epochs = -1}).Cardinality(),
            kInfiniteCardinality);
}

}  // namespace
}  // namespace recflow::pipeline
