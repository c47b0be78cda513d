// Batch, PaddedBatch and Unbatch (batch.cc) against tf.data's documented
// behaviour.
#include <gtest/gtest.h>

#include "pipeline/dataset.h"
#include "pipeline_test_util.h"
#include "test_util.h"

namespace recflow::pipeline {
namespace {

using testing::Collect;
using testing::Ints;
using testing::Iota;

TEST(BatchTest, BatchKeepsOrDropsTheRemainder) {
  auto batches = Collect(Dataset::Range(0, 10).Batch(4));
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[0]["value"].shape(), (Shape{4}));
  EXPECT_EQ(batches[2]["value"].shape(), (Shape{2}));
  EXPECT_EQ(Ints(batches), Iota(0, 10));
  auto dropped = Collect(Dataset::Range(0, 10).Batch(4, true));
  ASSERT_EQ(dropped.size(), 2u);
  EXPECT_EQ(Ints(dropped), Iota(0, 8));
}

TEST(BatchTest, BatchStacksTensorsAndRefusesShapeMismatches) {
  Element a, b;
  a.Set("x", Tensor::FromValues<float>(std::vector<float>{1, 2}, Shape{2}));
  a.Set("s", Tensor::BytesScalar("one"));
  b.Set("x", Tensor::FromValues<float>(std::vector<float>{3, 4}, Shape{2}));
  b.Set("s", Tensor::BytesScalar("two"));
  int calls = 0;
  auto gen = [&] {
    return [&, i = 0]() mutable -> std::optional<Element> {
      ++calls;
      if (i == 2) return std::nullopt;
      return i++ == 0 ? a : b;
    };
  };
  auto out = Collect(Dataset::FromGenerator(gen).Batch(2));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0]["x"].shape(), (Shape{2, 2}));
  EXPECT_EQ(std::vector<float>(out[0]["x"].values<float>().begin(),
                               out[0]["x"].values<float>().end()),
            (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(out[0]["s"].bytes(1), "two");

  Element c;
  c.Set("x", Tensor::FromValues<float>(std::vector<float>{5, 6, 7}, Shape{3}));
  c.Set("s", Tensor::BytesScalar("three"));
  auto gen2 = [&] {
    return [&, i = 0]() mutable -> std::optional<Element> {
      if (i == 2) return std::nullopt;
      return i++ == 0 ? a : c;
    };
  };
  try {
    Collect(Dataset::FromGenerator(gen2).Batch(2));
    FAIL() << "batched different shapes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("component 'x'"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("[3]"), std::string::npos);
  }
}

TEST(BatchTest, PaddedBatchPadsToTheLongestOrTheGivenShape) {
  // Element i: i values of i.
  auto ds = Dataset::Range(1, 4).Map([](Element e) {
    const int64_t n = e["value"].scalar<int64_t>();
    std::vector<int64_t> v(static_cast<size_t>(n), n);
    Element out;
    out.Set("v", Tensor::FromValues<int64_t>(v, Shape{n}));
    return out;
  });
  auto out = Collect(ds.PaddedBatch(3));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0]["v"].shape(), (Shape{3, 3}));
  EXPECT_EQ(Ints(out, "v"), (std::vector<int64_t>{1, 0, 0, 2, 2, 0, 3, 3, 3}));

  PaddedBatchOptions o;
  o.padded_shapes = {{"v", {5}}};
  o.padding_values = {{"v", -1}};
  out = Collect(ds.PaddedBatch(2, o));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0]["v"].shape(), (Shape{2, 5}));
  EXPECT_EQ(Ints({out[1]}, "v"), (std::vector<int64_t>{3, 3, 3, -1, -1}));

  o.padded_shapes = {{"v", {2}}};
  EXPECT_THROW(Collect(ds.PaddedBatch(3, o)), Error);
}

TEST(BatchTest, UnbatchUndoesBatch) {
  auto ds = Dataset::Range(0, 11).Batch(4).Unbatch();
  EXPECT_EQ(Ints(Collect(ds)), Iota(0, 11));
}

}  // namespace
}  // namespace recflow::pipeline
