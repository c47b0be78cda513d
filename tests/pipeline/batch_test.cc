// Batch, PaddedBatch, RaggedBatch, BucketBySequenceLength, GroupByWindow,
// Window, Rebatch and Unbatch (batch.cc) against tf.data's documented
// behaviour.
#include <fmt/format.h>
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

// Matrices and strings pad in every dimension; values land at their own
// (row, column), the rest is the padding value.
TEST(BatchTest, PaddedBatchPadsMatricesAndBytesInEveryDimension) {
  std::vector<Element> elements(2);
  const std::vector<float> a = {1, 2, 3};  // 1 x 3
  const std::vector<float> b = {4, 5};     // 2 x 1
  elements[0].Set("m", Tensor::FromValues<float>(a, Shape{1, 3}));
  elements[1].Set("m", Tensor::FromValues<float>(b, Shape{2, 1}));
  const std::vector<std::string> s0 = {"a", "b"}, s1 = {"c", "d", "e", "f"};
  elements[0].Set("s", Tensor::FromStrings(s0, Shape{1, 2}));
  elements[1].Set("s", Tensor::FromStrings(s1, Shape{2, 2}));
  elements[0].Set(
      "u", Tensor::FromValues<uint8_t>(std::vector<uint8_t>{7}, Shape{1}));
  elements[1].Set(
      "u", Tensor::FromValues<uint8_t>(std::vector<uint8_t>{8, 9}, Shape{2}));
  const auto ds = Dataset::FromGenerator([elements] {
    return [elements, i = size_t{0}]() mutable -> std::optional<Element> {
      if (i == elements.size()) return std::nullopt;
      return elements[i++];
    };
  });
  PaddedBatchOptions o;
  o.padding_values = {{"m", -1}, {"u", 255}};
  o.padded_shapes = {{"m", {-1, 4}}};
  const auto out = Collect(ds.PaddedBatch(2, o));
  ASSERT_EQ(out.size(), 1u);
  const Tensor& m = out[0]["m"];
  ASSERT_EQ(m.shape(), (Shape{2, 2, 4}));
  const float* v = m.data<float>();
  EXPECT_EQ(std::vector<float>(v, v + 16),
            (std::vector<float>{1, 2, 3, -1, -1, -1, -1, -1,  //
                                4, -1, -1, -1, 5, -1, -1, -1}));
  const Tensor& str = out[0]["s"];
  ASSERT_EQ(str.shape(), (Shape{2, 2, 2}));
  std::vector<std::string> got;
  for (int64_t k = 0; k < 8; ++k) got.emplace_back(str.bytes(k));
  EXPECT_EQ(got,
            (std::vector<std::string>{"a", "b", "", "", "c", "d", "e", "f"}));
  const Tensor& u = out[0]["u"];
  EXPECT_EQ(std::vector<uint8_t>(u.data<uint8_t>(), u.data<uint8_t>() + 4),
            (std::vector<uint8_t>{7, 255, 8, 9}));
  // A padding value must be one of the component's dtype.
  const auto error = [&](std::string name, double value) {
    PaddedBatchOptions bad;
    bad.padding_values = {{name, value}};
    try {
      Collect(ds.PaddedBatch(2, bad));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error("u", 256),
            "PaddedBatch: padding value 256 for 'u' is not a value of its "
            "dtype uint8");
  EXPECT_EQ(error("u", -1),
            "PaddedBatch: padding value -1 for 'u' is not a value of its "
            "dtype uint8");
  EXPECT_EQ(error("u", 0.5),
            "PaddedBatch: padding value 0.5 for 'u' is not a value of its "
            "dtype uint8");
  EXPECT_EQ(error("m", 1e300),
            "PaddedBatch: padding value 1e+300 for 'm' is not a value of its "
            "dtype float32");
  EXPECT_EQ(error("m", -INFINITY), "");
  EXPECT_EQ(error("s", 1),
            "PaddedBatch: padding value 1 for 's' is not a value of its dtype "
            "bytes (bytes pad with empty strings)");
}

// A name in padded_shapes or padding_values that no component has is a
// typo; ignored, it padded the real component to the longest silently.
TEST(BatchTest, PaddedBatchRefusesNamesTheElementsLack) {
  const auto ds = Dataset::Range(0, 3).Batch(1).Map([](Element e) {
    Element out;
    out.Set("ids", e["value"]);
    out.Set("mask", e["value"]);
    return out;
  });
  const auto message = [&](PaddedBatchOptions o) {
    try {
      Collect(ds.PaddedBatch(2, o));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  PaddedBatchOptions shapes;
  shapes.padded_shapes = {{"ids", {4}}, {"idz", {4}}};
  EXPECT_EQ(message(shapes),
            "PaddedBatch: padded_shapes names 'idz', which the elements lack "
            "(they have: ids, mask)");
  PaddedBatchOptions values;
  values.padding_values = {{"msk", -1}};
  EXPECT_EQ(message(values),
            "PaddedBatch: padding_values names 'msk', which the elements "
            "lack (they have: ids, mask)");
  shapes.padded_shapes.pop_back();
  EXPECT_EQ(message(shapes), "");
}

// Elements that cannot form one batch are refused by component and
// element, never stacked under the first element's layout.
TEST(BatchTest, ElementsThatDoNotStackAreRefusedByName) {
  const auto with = [](std::vector<std::pair<std::string, Tensor>> parts) {
    Element e;
    for (auto& [name, t] : parts) e.Set(name, t);
    return e;
  };
  const Tensor one = Tensor::Scalar<int64_t>(1);
  const Tensor ragged = Tensor::Ragged(
      Tensor::FromValues<int64_t>(std::vector<int64_t>{1, 2, 3}, Shape{3}),
      Tensor::FromValues<int64_t>(std::vector<int64_t>{1, 2}, Shape{2}));
  const auto error = [](std::vector<Element> elements, bool padded) {
    const auto ds = Dataset::FromGenerator([elements] {
      return [elements, i = size_t{0}]() mutable -> std::optional<Element> {
        if (i == elements.size()) return std::nullopt;
        return elements[i++];
      };
    });
    try {
      Collect(padded ? ds.PaddedBatch(3) : ds.Batch(3));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  for (bool padded : {false, true}) {
    SCOPED_TRACE(padded);
    EXPECT_EQ(
        error({with({{"a", one}}), with({{"a", one}, {"b", one}})}, padded),
        "Cannot batch elements with different components: the first "
        "element has 1, element 1 has 2");
  }
  EXPECT_EQ(error({with({{"a", one}}), with({{"b", one}})}, false),
            "Cannot batch elements with different components: component 0 "
            "is 'a' in the first element and 'b' in element 1");
  EXPECT_EQ(error({with({{"a", one}}), with({{"b", one}})}, true),
            "PaddedBatch: component 0 ('b') of element 1 differs from the "
            "first element's in name, dtype or rank");
  EXPECT_EQ(error({with({{"a", one}}), with({{"a", Tensor::Scalar<float>(1)}})},
                  false),
            "Cannot batch tensors of different dtypes in component 'a'. First "
            "element had dtype int64 and element 1 had dtype float32.");
  // Ragged first or later: a ragged component has rows of its own.
  EXPECT_EQ(error({with({{"r", ragged}})}, false),
            "Cannot batch the ragged component 'r'; use PaddedBatch, or Parse "
            "after Batch");
  EXPECT_EQ(error({with({{"r", ragged}})}, true),
            "PaddedBatch: component 'r' is ragged");
  const Tensor vector =
      Tensor::FromValues<int64_t>(std::vector<int64_t>{1, 2}, Shape{2});
  EXPECT_EQ(error({with({{"a", vector}}), with({{"a", one}})}, true),
            "PaddedBatch: component 0 ('a') of element 1 differs from the "
            "first element's in name, dtype or rank");
  // Unbatch needs a first dimension, the same in every component.
  const auto unbatch = [](Element e) {
    try {
      Collect(Dataset::FromGenerator([e] {
                return [e, done = false]() mutable -> std::optional<Element> {
                  if (done) return std::nullopt;
                  done = true;
                  return e;
                };
              }).Unbatch());
    } catch (const Error& err) {
      return std::string(err.what());
    }
    return std::string();
  };
  EXPECT_EQ(unbatch(with({{"a", vector}, {"s", one}})),
            "Unbatch: component 's' is a scalar; it has no rows");
  EXPECT_EQ(
      unbatch(with({{"a", vector},
                    {"b", Tensor::FromValues<int64_t>(
                              std::vector<int64_t>{1, 2, 3}, Shape{3})}})),
      "Unbatch: component 'b' has 3 rows, 'a' has 2");
}

TEST(BatchTest, RaggedBatchFollowsTensorFlowsExample) {
  // tf.data: range(6).map(lambda x: range(x)).ragged_batch(2) ->
  // [[], [0]], [[0, 1], [0, 1, 2]], [[0, 1, 2, 3], [0, 1, 2, 3, 4]].
  const Dataset ranges = Dataset::Range(0, 6).Map([](Element e) {
    const int64_t n = e["value"].scalar<int64_t>();
    Element out;
    out.Set("r", Tensor::FromValues<int64_t>(Iota(0, n), Shape{n}));
    out.Set("n", Tensor::Scalar<int64_t>(n));
    out.Set("s", Tensor::FromStrings(
                     std::vector<std::string>(static_cast<size_t>(n), "ab"),
                     Shape{n}));
    return out;
  });
  const auto out = Collect(ranges.RaggedBatch(2));
  ASSERT_EQ(out.size(), 3u);
  const std::vector<std::vector<int64_t>> rows = {
      {}, {0}, {0, 1}, {0, 1, 2}, {0, 1, 2, 3}, {0, 1, 2, 3, 4}};
  for (size_t b = 0; b < 3; ++b) {
    const Tensor& r = out[b]["r"];
    ASSERT_TRUE(r.ragged());
    ASSERT_EQ(r.num_rows(), 2);
    for (int64_t i = 0; i < 2; ++i) {
      const Tensor row = r.Slice(i);
      EXPECT_EQ(std::vector<int64_t>(row.values<int64_t>().begin(),
                                     row.values<int64_t>().end()),
                rows[b * 2 + static_cast<size_t>(i)]);
    }
    // Scalars batch dense; bytes vectors are ragged too.
    EXPECT_FALSE(out[b]["n"].ragged());
    EXPECT_EQ(out[b]["n"].shape(), (Shape{2}));
    EXPECT_TRUE(out[b]["s"].ragged());
    EXPECT_EQ(out[b]["s"].FlatValues().num_elements(),
              static_cast<int64_t>(4 * b + 1));
  }
  // Unbatch gives the elements back.
  const auto back = Collect(ranges.RaggedBatch(4).Unbatch());
  ASSERT_EQ(back.size(), 6u);
  EXPECT_EQ(back[5]["r"].shape(), (Shape{5}));
  EXPECT_EQ(back[5]["s"].bytes(4), "ab");
  EXPECT_EQ(Collect(ranges.RaggedBatch(4, true)).size(), 1u);
  EXPECT_EQ(ranges.RaggedBatch(4).Cardinality(), 2);
}

TEST(BatchTest, RaggedBatchKeepsInnerDimensionsAndRefusesOthers) {
  // [n, 2] matrices: ragged [batch, (n), 2]; `bad` makes the third [3, 3].
  const auto matrices = [](bool bad) {
    return Dataset::Range(1, 4).Map([bad](Element e) {
      const int64_t n = e["value"].scalar<int64_t>();
      const int64_t inner = bad && n == 3 ? 3 : 2;
      Element out;
      out.Set("m",
              Tensor::FromValues<int64_t>(Iota(0, n * inner), Shape{n, inner}));
      return out;
    });
  };
  const auto out = Collect(matrices(false).RaggedBatch(3));
  ASSERT_EQ(out.size(), 1u);
  const Tensor& m = out[0]["m"];
  EXPECT_EQ(m.FlatValues().shape(), (Shape{6, 2}));
  EXPECT_EQ(std::vector<int64_t>(m.row_lengths().values<int64_t>().begin(),
                                 m.row_lengths().values<int64_t>().end()),
            (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(m.Slice(2).shape(), (Shape{3, 2}));
  EXPECT_EQ(std::vector<int64_t>(m.Slice(2).values<int64_t>().begin(),
                                 m.Slice(2).values<int64_t>().end()),
            Iota(0, 6));
  try {
    Collect(matrices(true).RaggedBatch(3));
    FAIL() << "batched [3, 3] with [1, 2]";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "RaggedBatch: component 'm' has shape [3, 3] in element 2, "
                 "[1, 2] in the first; only the first dimension may differ");
  }
  EXPECT_THROW(Dataset::Range(0, 3).RaggedBatch(0), Error);
}

TEST(BatchTest, UnbatchUndoesBatch) {
  auto ds = Dataset::Range(0, 11).Batch(4).Unbatch();
  EXPECT_EQ(Ints(Collect(ds)), Iota(0, 11));
}

// The elements of tf.data's bucket_by_sequence_length example, as {"x":
// int64 [n]} and {"id": i}.
Dataset Sequences(std::vector<std::vector<int64_t>> seqs) {
  auto shared = std::make_shared<const std::vector<std::vector<int64_t>>>(
      std::move(seqs));
  const auto n = static_cast<int64_t>(shared->size());
  return Dataset::Range(0, n).Map([shared](Element e) {
    const int64_t i = e["value"].scalar<int64_t>();
    const auto& v = (*shared)[static_cast<size_t>(i)];
    Element out;
    out.Set("x", Tensor::FromValues<int64_t>(
                     v, Shape{static_cast<int64_t>(v.size())}));
    out.Set("id", Tensor::Scalar<int64_t>(i));
    return out;
  });
}
const std::vector<std::vector<int64_t>> kTfExample = {{0},
                                                      {1, 2, 3, 4},
                                                      {5, 6, 7},
                                                      {7, 8, 9, 10, 11},
                                                      {13, 14, 15, 16, 19, 20},
                                                      {21, 22}};

TEST(BatchTest, BucketBySequenceLengthFollowsTensorFlowsExample) {
  const auto out = Collect(
      Sequences(kTfExample)
          .BucketBySequenceLength("x", {.bucket_boundaries = {3, 5},
                                        .bucket_batch_sizes = {2, 2, 2}}));
  // tf.data prints [[1 2 3 4] [5 6 7 0]], [[7 8 9 10 11 0] [13 14 15 16
  // 19 20]], [[0 0] [21 22]].
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0]["x"].shape(), (Shape{2, 4}));
  EXPECT_EQ(Ints({out[0]}, "x"),
            (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 0}));
  EXPECT_EQ(Ints({out[1]}, "x"),
            (std::vector<int64_t>{7, 8, 9, 10, 11, 0, 13, 14, 15, 16, 19, 20}));
  EXPECT_EQ(Ints({out[2]}, "x"), (std::vector<int64_t>{0, 0, 21, 22}));
  EXPECT_EQ(Ints(out, "id"), (std::vector<int64_t>{1, 2, 3, 4, 0, 5}));
  // The part-full buckets at the end, in bucket order, or dropped.
  const auto ends = Collect(
      Sequences(kTfExample)
          .BucketBySequenceLength("x", {.bucket_boundaries = {3, 5},
                                        .bucket_batch_sizes = {4, 4, 4}}));
  EXPECT_EQ(Ints(ends, "id"), (std::vector<int64_t>{0, 5, 1, 2, 3, 4}));
  ASSERT_EQ(ends.size(), 3u);
  EXPECT_EQ(ends[2]["x"].shape(), (Shape{2, 6}));
  EXPECT_TRUE(
      Collect(Sequences(kTfExample)
                  .BucketBySequenceLength("x", {.bucket_boundaries = {3, 5},
                                                .bucket_batch_sizes = {4, 4, 4},
                                                .drop_remainder = true}))
          .empty());
}

TEST(BatchTest, BucketBySequenceLengthPadsToTheBoundary) {
  const auto bucketed = [](BucketOptions o) {
    return Collect(
        Sequences(kTfExample).BucketBySequenceLength("x", std::move(o)));
  };
  const auto out = bucketed({.bucket_boundaries = {3, 7},
                             .bucket_batch_sizes = {2, 2, 2},
                             .padded_shapes = {{"x", {-1}}},
                             .padding_values = {{"x", -1}},
                             .pad_to_bucket_boundary = true});
  ASSERT_EQ(out.size(), 3u);
  // Lengths 3 to 6 pad to 6, lengths below 3 to 2, whatever the longest.
  EXPECT_EQ(Ints({out[0]}, "x"),
            (std::vector<int64_t>{1, 2, 3, 4, -1, -1, 5, 6, 7, -1, -1, -1}));
  EXPECT_EQ(out[1]["x"].shape(), (Shape{2, 6}));
  EXPECT_EQ(Ints({out[2]}, "x"), (std::vector<int64_t>{0, -1, 21, 22}));
  // A length from the last boundary up has no boundary to pad to.
  try {
    bucketed({.bucket_boundaries = {3, 5},
              .bucket_batch_sizes = {2, 2, 2},
              .padded_shapes = {{"x", {-1}}},
              .pad_to_bucket_boundary = true});
    FAIL() << "padded a length past the last boundary";
  } catch (const Error& e) {
    EXPECT_STREQ(
        e.what(),
        "BucketBySequenceLength: element 3 has length 5 (length of 'x'), not "
        "below the last boundary 5, which pad_to_bucket_boundary "
        "needs");
  }
  // A padding error says which bucket.
  try {
    bucketed({.bucket_boundaries = {3, 5},
              .bucket_batch_sizes = {2, 2, 2},
              .padded_shapes = {{"x", {4}}}});
    FAIL() << "padded 5 values to 4";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "BucketBySequenceLength: bucket 2: PaddedBatch: component "
                 "'x' has size 6 in dimension 0, more than its padded size 4");
  }
}

TEST(BatchTest, BucketBySequenceLengthRefusesWhatCannotBucket) {
  const Dataset ds = Sequences(kTfExample);
  const auto refused = [&](BucketOptions o) {
    try {
      ds.BucketBySequenceLength("x", std::move(o));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(refused({.bucket_boundaries = {3, 5}, .bucket_batch_sizes = {2}}),
            "BucketBySequenceLength: 1 batch sizes for 2 boundaries; give one "
            "more batch size than boundaries (the last bucket holds the "
            "lengths from the last boundary up)");
  EXPECT_EQ(
      refused({.bucket_boundaries = {5, 3}, .bucket_batch_sizes = {2, 2, 2}}),
      "BucketBySequenceLength: boundaries [5, 3] must be positive and "
      "increasing");
  EXPECT_EQ(refused({.bucket_boundaries = {3}, .bucket_batch_sizes = {2, 0}})
                .rfind("BucketBySequenceLength: a batch size", 0),
            0u);
  EXPECT_EQ(refused({.bucket_boundaries = {3},
                     .bucket_batch_sizes = {2, 2},
                     .padded_shapes = {{"x", {8}}},
                     .pad_to_bucket_boundary = true}),
            "BucketBySequenceLength: pad_to_bucket_boundary pads the "
            "dimensions padded_shapes gives as -1, and it gives none");
  EXPECT_EQ(refused({.bucket_boundaries = {3},
                     .bucket_batch_sizes = {2, 2},
                     .padding_values = {{"x", 1}},
                     .no_padding = true}),
            "BucketBySequenceLength: padded_shapes and padding_values pad, "
            "which no_padding does not");
  EXPECT_EQ(refused({.bucket_boundaries = {3},
                     .bucket_batch_sizes = {2, 2},
                     .padded_shapes = {{"x", {-1}}},
                     .pad_to_bucket_boundary = true,
                     .no_padding = true}),
            "BucketBySequenceLength: pad_to_bucket_boundary and no_padding "
            "contradict each other");
  // Lengths: negative, or of a scalar that has none.
  const auto error = [&](Dataset::LengthFn fn) {
    try {
      Collect(ds.BucketBySequenceLength(
          std::move(fn), {.bucket_batch_sizes = {4}}, "my_length"));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(
      error([](const Element& e) { return 2 - e["id"].scalar<int64_t>(); }),
      "BucketBySequenceLength: element 3 has length -1 (my_length); "
      "lengths must be >= 0");
  try {
    Collect(ds.BucketBySequenceLength("id", {.bucket_batch_sizes = {4}}));
    FAIL() << "took a length of a scalar";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "BucketBySequenceLength: component 'id' is a scalar "
                 "(int64), which has no length (a bytes scalar's is its "
                 "size)");
  }
}

TEST(BatchTest, BucketBySequenceLengthWithoutPaddingBatchesRecords) {
  // Serialized records of many sizes, bucketed by their size and batched
  // as they are (to parse after): each batch from one bucket, every record
  // once.
  const Dataset records = Dataset::Range(0, 200).Map([](Element e) {
    const int64_t i = e["value"].scalar<int64_t>();
    Element out;
    out.Set("record", Tensor::BytesScalar(std::string(
                          static_cast<size_t>((i * 37) % 100), 'r')));
    out.Set("id", Tensor::Scalar<int64_t>(i));
    return out;
  });
  const auto out = Collect(records.BucketBySequenceLength(
      "record", {.bucket_boundaries = {10, 50},
                 .bucket_batch_sizes = {8, 16, 32},
                 .no_padding = true}));
  std::vector<int64_t> ids = Ints(out, "id");
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, Iota(0, 200));
  for (const auto& batch : out) {
    const Tensor& r = batch["record"];
    const auto bucket = [](size_t n) { return n < 10 ? 0 : n < 50 ? 1 : 2; };
    const int b = bucket(r.bytes(0).size());
    EXPECT_LE(r.shape()[0], (std::vector<int64_t>{8, 16, 32})[b]);
    for (int64_t k = 0; k < r.shape()[0]; ++k) {
      EXPECT_EQ(bucket(r.bytes(k).size()), b);
    }
  }
}

// The windows of Range(0, n) as lists.
std::vector<std::vector<int64_t>> Windows(int64_t n, int64_t size,
                                          WindowOptions o) {
  std::vector<std::vector<int64_t>> out;
  for (const Element& w : Collect(Dataset::Range(0, n).Window(size, o))) {
    EXPECT_EQ(w["value"].shape().rank(), 1);
    const auto v = w["value"].values<int64_t>();
    out.emplace_back(v.begin(), v.end());
  }
  return out;
}

using Lists = std::vector<std::vector<int64_t>>;

TEST(BatchTest, WindowFollowsTensorFlowsExamples) {
  // tf.data.Dataset.window's documented examples, on range(7).
  EXPECT_EQ(Windows(7, 3, {}), (Lists{{0, 1, 2}, {3, 4, 5}, {6}}));
  EXPECT_EQ(Windows(7, 3, {.shift = 1, .drop_remainder = true}),
            (Lists{{0, 1, 2}, {1, 2, 3}, {2, 3, 4}, {3, 4, 5}, {4, 5, 6}}));
  EXPECT_EQ(Windows(7, 3, {.shift = 1, .stride = 2, .drop_remainder = true}),
            (Lists{{0, 2, 4}, {1, 3, 5}, {2, 4, 6}}));
  // Without drop_remainder the windows that run past the end come short.
  EXPECT_EQ(
      Windows(7, 3, {.shift = 1}),
      (Lists{
          {0, 1, 2}, {1, 2, 3}, {2, 3, 4}, {3, 4, 5}, {4, 5, 6}, {5, 6}, {6}}));
  EXPECT_EQ(Windows(7, 3, {.shift = 1, .stride = 2}),
            (Lists{{0, 2, 4}, {1, 3, 5}, {2, 4, 6}, {3, 5}, {4, 6}, {5}, {6}}));
  // A shift past the window's reach drops the elements between.
  EXPECT_EQ(Windows(11, 2, {.shift = 4}), (Lists{{0, 1}, {4, 5}, {8, 9}}));
  EXPECT_EQ(Windows(11, 2, {.shift = 5, .stride = 2}),
            (Lists{{0, 2}, {5, 7}, {10}}));
  EXPECT_TRUE(Windows(2, 3, {.drop_remainder = true}).empty());
  EXPECT_TRUE(Windows(0, 3, {}).empty());
}

// Every window of every small case against the definition: window k holds
// elements k * shift + j * stride below n, j < size; with drop_remainder
// only the full ones.  The cardinality is the count.
TEST(BatchTest, WindowMatchesItsDefinitionAndItsCardinality) {
  for (int64_t n = 0; n <= 12; ++n) {
    for (int64_t size = 1; size <= 4; ++size) {
      for (int64_t shift = 1; shift <= 5; ++shift) {
        for (int64_t stride = 1; stride <= 3; ++stride) {
          for (bool drop : {false, true}) {
            Lists want;
            for (int64_t start = 0; start < n; start += shift) {
              std::vector<int64_t> w;
              for (int64_t j = 0; j < size && start + j * stride < n; ++j) {
                w.push_back(start + j * stride);
              }
              if (drop && static_cast<int64_t>(w.size()) < size) break;
              want.push_back(w);
            }
            const WindowOptions o{
                .shift = shift, .stride = stride, .drop_remainder = drop};
            const std::string what =
                fmt::format("n={} size={} shift={} stride={} drop={}", n, size,
                            shift, stride, drop);
            EXPECT_EQ(Windows(n, size, o), want) << what;
            EXPECT_EQ(Dataset::Range(0, n).Window(size, o).Cardinality(),
                      static_cast<int64_t>(want.size()))
                << what;
          }
        }
      }
    }
  }
  EXPECT_EQ(Dataset::Range(0, 5).Repeat().Window(2).Cardinality(),
            kInfiniteCardinality);
  EXPECT_EQ(Dataset::Range(0, 5)
                .Filter([](const Element&) { return true; })
                .Window(2)
                .Cardinality(),
            kUnknownCardinality);
}

TEST(BatchTest, WindowStacksEachComponentAsBatchDoes) {
  // Element i: {"x": [i, -i] float32, "s": bytes of i 'a's}.
  auto ds = Dataset::Range(0, 5)
                .Map([](Element e) {
                  const auto i = e["value"].scalar<int64_t>();
                  Element out;
                  out.Set("x", Tensor::FromValues<float>(
                                   std::vector<float>{1.0f * i, -1.0f * i},
                                   Shape{2}));
                  out.Set("s", Tensor::BytesScalar(
                                   std::string(static_cast<size_t>(i), 'a')));
                  return out;
                })
                .Window(3, {.shift = 2});
  const auto windows = Collect(ds);
  ASSERT_EQ(windows.size(), 3u);
  EXPECT_EQ(windows[1]["x"].shape(), (Shape{3, 2}));
  const auto x = windows[1]["x"].values<float>();
  EXPECT_EQ(std::vector<float>(x.begin(), x.end()),
            (std::vector<float>{2, -2, 3, -3, 4, -4}));
  EXPECT_EQ(windows[1]["s"].shape(), (Shape{3}));
  EXPECT_EQ(windows[1]["s"].bytes(2), "aaaa");
  EXPECT_EQ(windows[2]["x"].shape(), (Shape{1, 2}));
}

// Element i of n: {"v": [i]}, but [i, i] at `at`: a shape that does not
// stack with the others.
Dataset LongerAt(int64_t n, int64_t at) {
  return Dataset::Range(0, n).Map([at](Element e) {
    const auto i = e["value"].scalar<int64_t>();
    const int64_t size = i == at ? 2 : 1;
    Element out;
    out.Set("v", Tensor::FromValues<int64_t>(
                     std::vector<int64_t>(static_cast<size_t>(size), i),
                     Shape{size}));
    return out;
  });
}

TEST(BatchTest, WindowThrowsInputErrorsAsTheyComeAndGoesOn) {
  const auto failing = [](int64_t bad) {
    return Dataset::Range(0, 11).Map([bad](Element e) {
      if (e["value"].scalar<int64_t>() == bad) throw Error("bad element");
      return e;
    });
  };
  // An error while a window fills: the element it used up is in none.
  Iterator it = failing(4).Window(3).IgnoreErrors().MakeIterator();
  Lists got;
  Element w;
  while (it.Next(&w)) {
    const auto v = w["value"].values<int64_t>();
    got.emplace_back(v.begin(), v.end());
  }
  EXPECT_EQ(got, (Lists{{0, 1, 2}, {3, 5, 6}, {7, 8, 9}, {10}}));
  uint64_t ignored = 0;
  for (const auto& s : it.Stats()) ignored += s.errors_ignored;
  EXPECT_EQ(ignored, 1u);
  // An error in an element the shift drops is thrown too, once.
  Iterator skip = failing(3).Window(2, {.shift = 4}).MakeIterator();
  ASSERT_TRUE(skip.Next(&w));
  EXPECT_THROW(skip.Next(&w), Error);
  got.clear();
  while (skip.Next(&w)) {
    const auto v = w["value"].values<int64_t>();
    got.emplace_back(v.begin(), v.end());
  }
  EXPECT_EQ(got, (Lists{{4, 5}, {8, 9}}));
  // A window that does not stack is an Error naming the component; the
  // next window follows it.
  Iterator mixed = LongerAt(6, 1).Window(2).MakeIterator();
  try {
    mixed.Next(&w);
    FAIL() << "stacked [1] and [2]";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("component 'v'"), std::string::npos)
        << e.what();
  }
  ASSERT_TRUE(mixed.Next(&w));
  EXPECT_EQ(Ints({w}, "v"), (std::vector<int64_t>{2, 3}));
}

TEST(BatchTest, WindowRefusesSizesItCannotTake) {
  const Dataset ds = Dataset::Range(0, 5);
  EXPECT_THROW(ds.Window(0), Error);
  EXPECT_THROW(ds.Window(2, {.shift = -1}), Error);
  EXPECT_THROW(ds.Window(2, {.stride = 0}), Error);
  try {
    ds.Window(int64_t{1} << 40, {.stride = int64_t{1} << 40});
    FAIL() << "a reach past 2^63 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("spans more than 2^63"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NE(ds.Window(2, {.shift = 1, .stride = 3})
                .Describe()
                .find("Window(2, shift=1, stride=3, drop_remainder=false)"),
            std::string::npos);
}

// The value lists of a dataset of batches of Range elements.
Lists ValueLists(const Dataset& ds) {
  Lists out;
  for (const Element& b : Collect(ds)) {
    const auto v = b["value"].values<int64_t>();
    out.emplace_back(v.begin(), v.end());
  }
  return out;
}

Dataset::KeyFn Mod(int64_t n, int64_t sign = 1) {
  return [n, sign](const Element& e) {
    return sign * (e["value"].scalar<int64_t>() % n);
  };
}

TEST(BatchTest, GroupByWindowFollowsTensorFlowsExample) {
  // tf.data's example: range(10), key x % 2, windows of 5, each batched.
  EXPECT_EQ(ValueLists(Dataset::Range(0, 10).GroupByWindow(Mod(2), 5)),
            (Lists{{0, 2, 4, 6, 8}, {1, 3, 5, 7, 9}}));
  // A group is delivered as it fills; at the end the groups left come
  // part-full in key order (keys 0, -1, -2: -2 first), or are dropped.
  const Dataset ten = Dataset::Range(0, 10);
  EXPECT_EQ(ValueLists(ten.GroupByWindow(Mod(3, -1), 4)),
            (Lists{{0, 3, 6, 9}, {2, 5, 8}, {1, 4, 7}}));
  EXPECT_EQ(
      ValueLists(ten.GroupByWindow(Mod(3, -1), 4, {.drop_remainder = true})),
      (Lists{{0, 3, 6, 9}}));
  EXPECT_EQ(ten.GroupByWindow(Mod(2), 5).Cardinality(), kUnknownCardinality);
  // Each key's own window size, asked once per group begun.
  int asked = 0;
  const auto sizes = [&asked](int64_t key) {
    ++asked;
    return key + 2;
  };
  EXPECT_EQ(ValueLists(Dataset::Range(0, 12).GroupByWindow(Mod(2), sizes)),
            (Lists{{0, 2}, {1, 3, 5}, {4, 6}, {8, 10}, {7, 9, 11}}));
  EXPECT_EQ(asked, 5);
  // By an integer entry's value.
  auto labelled = ten.Map([](Element e) {
    Element out = e;
    out.Set("label", Tensor::Scalar<int32_t>(static_cast<int32_t>(
                         e["value"].scalar<int64_t>() / 4)));
    return out;
  });
  EXPECT_EQ(
      ValueLists(labelled.GroupByWindow(Dataset::ComponentKey("label"), 3)),
      (Lists{{0, 1, 2}, {4, 5, 6}, {3}, {7}, {8, 9}}));
  EXPECT_NE(ten.GroupByWindow(Mod(2), 5, {.key_name = "parity"})
                .Describe()
                .find("GroupByWindow(parity, window_size=5, "
                      "drop_remainder=false)"),
            std::string::npos);
}

// The message of the Error a run of `ds` throws, or "no error".
std::string ErrorOf(const Dataset& ds) {
  try {
    Collect(ds);
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::string("no error");
}

TEST(BatchTest, GroupByWindowRefusesWhatCannotGroup) {
  const Dataset ten = Dataset::Range(0, 10);
  EXPECT_THROW(ten.GroupByWindow(Mod(2), 0), Error);
  EXPECT_THROW(ten.GroupByWindow(Mod(2), Dataset::WindowSizeFn()), Error);
  EXPECT_EQ(ErrorOf(ten.GroupByWindow(
                Mod(2), [](int64_t key) { return key == 1 ? 0 : 3; },
                {.window_size_name = "sizes"})),
            "GroupByWindow: the window size of key 1 (sizes) is 0; it must "
            "be positive");
  EXPECT_EQ(ErrorOf(ten.Map([](Element) {
                         Element out;
                         out.Set("f", Tensor::Scalar<float>(1));
                         return out;
                       })
                        .GroupByWindow(Dataset::ComponentKey("f"), 2)),
            "component 'f' is float32[]; a key must be an integer scalar");
  // A group that does not stack names its key.
  const std::string error = ErrorOf(LongerAt(10, 3).GroupByWindow(
      [](const Element& e) { return e["v"].values<int64_t>()[0] % 2; }, 2));
  EXPECT_NE(error.find("GroupByWindow: the group of key 1: Cannot batch "
                       "tensors with different shapes in component 'v'"),
            std::string::npos)
      << error;
}

TEST(BatchTest, RebatchGivesTheRowsOfUnbatchThenBatch) {
  // tf.data's example: range(6).batch(4).rebatch(3) -> [0 1 2] [3 4 5].
  EXPECT_EQ(ValueLists(Dataset::Range(0, 6).Batch(4).Rebatch({3})),
            (Lists{{0, 1, 2}, {3, 4, 5}}));
  EXPECT_EQ(ValueLists(Dataset::Range(0, 6).Batch(4).Rebatch({3, 1})),
            (Lists{{0, 1, 2}, {3}, {4, 5}}));
  EXPECT_EQ(ValueLists(Dataset::Range(0, 6).Batch(4).Rebatch({4}, true)),
            (Lists{{0, 1, 2, 3}}));
  // Every small case against Unbatch().Batch(n), with a matrix, bytes and
  // a ragged component, and the origins of the records.
  const auto rows = [](int64_t n) {
    return Dataset::Range(0, n).Map([](Element e) {
      const int64_t i = e["value"].scalar<int64_t>();
      Element out;
      out.Set("m", Tensor::FromValues<int32_t>(
                       std::vector<int32_t>{static_cast<int32_t>(i), -1, 7},
                       Shape{3}));
      out.Set("s", Tensor::BytesScalar(
                       std::string(static_cast<size_t>(i % 3), 'a' + i % 26)));
      out.Set("r", Tensor::FromValues<int64_t>(
                       std::vector<int64_t>(static_cast<size_t>(i % 4), i),
                       Shape{i % 4}));
      out.origin.file = std::make_shared<const std::string>("f");
      out.origin.record = static_cast<uint64_t>(i);
      return out;
    });
  };
  for (int64_t n : {0, 1, 7, 12}) {
    for (int64_t in : {1, 3, 5}) {
      for (const std::vector<int64_t>& sizes :
           std::vector<std::vector<int64_t>>{{1}, {3}, {5}, {2, 4}, {7}}) {
        for (bool drop : {false, true}) {
          const Dataset got_ds = rows(n).RaggedBatch(in).Rebatch(sizes, drop);
          // The reference: each output size in turn over the rows.
          std::vector<Element> want;
          {
            const auto all = Collect(rows(n));
            size_t at = 0, k = 0;
            while (at < all.size()) {
              const auto size = static_cast<size_t>(sizes[k++ % sizes.size()]);
              if (drop && at + size > all.size()) break;
              std::vector<Element> chunk(
                  all.begin() + static_cast<ptrdiff_t>(at),
                  all.begin() +
                      static_cast<ptrdiff_t>(std::min(all.size(), at + size)));
              at += chunk.size();
              want.push_back(
                  Collect(Dataset::FromGenerator([chunk] {
                            return [chunk, i = size_t{0}]() mutable
                                   -> std::optional<Element> {
                              if (i == chunk.size()) return std::nullopt;
                              return chunk[i++];
                            };
                          }).RaggedBatch(static_cast<int64_t>(chunk.size())))
                      .at(0));
            }
          }
          const auto got = Collect(got_ds);
          const std::string what =
              fmt::format("n={} in={} sizes=[{}] drop={}", n, in,
                          fmt::join(sizes, ","), drop);
          ASSERT_EQ(got.size(), want.size()) << what;
          for (size_t b = 0; b < got.size(); ++b) {
            EXPECT_EQ(got[b], want[b]) << what << " batch " << b;
            ASSERT_NE(got[b].batch_origins, nullptr) << what;
            ASSERT_EQ(got[b].batch_origins->size(),
                      static_cast<size_t>(got[b]["m"].num_rows()));
            for (size_t i = 0; i < got[b].batch_origins->size(); ++i) {
              EXPECT_EQ((*got[b].batch_origins)[i].record,
                        want[b].OriginOf(static_cast<int64_t>(i))->record)
                  << what;
            }
          }
        }
      }
    }
  }
}

TEST(BatchTest, RebatchPassesWholeBatchesAndRefusesWhatDoesNotJoin) {
  // A batch that passes whole is the input's, not a copy.
  std::vector<float> data(8, 1.0f);
  Element arrays;
  arrays.Set("x",
             Tensor::View(DType::kFloat32, Shape{2, 4}, data.data(), nullptr));
  const auto out =
      Collect(Dataset::FromTensors(arrays).Repeat(2).Rebatch({2, 1, 1}));
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0]["x"].data<float>(), data.data());
  EXPECT_NE(out[1]["x"].data<float>(), data.data());
  EXPECT_EQ(out[2]["x"].shape(), (Shape{1, 4}));
  EXPECT_EQ(ErrorOf(Dataset::Range(0, 3).Rebatch({2})),
            "Rebatch: component 'value' of input element 0 is a scalar; "
            "Rebatch takes batches");
  // Batches whose rows differ in shape cannot join.
  // Batches whose rows differ in shape cannot join: [2, 1] then [2, 2].
  const Dataset widening = Dataset::Range(0, 4).Map([](Element e) {
    const int64_t i = e["value"].scalar<int64_t>();
    const int64_t width = i < 2 ? 1 : 2;
    Element out;
    out.Set("v", Tensor::FromValues<int64_t>(
                     std::vector<int64_t>(static_cast<size_t>(width), i),
                     Shape{width}));
    return out;
  });
  EXPECT_EQ(ValueLists(widening.Batch(2).Rebatch({2}).Map([](Element e) {
              Element out;
              out.Set("value", e["v"]);
              return out;
            })),
            (Lists{{0, 1}, {2, 2, 3, 3}}));
  EXPECT_EQ(ErrorOf(widening.Batch(2).Rebatch({3})),
            "Rebatch: the batches joined differ in component 0 ('v' int64[2, "
            "1] in the first): their components must have one name, dtype "
            "and row shape");
  // An input error while a batch gathers keeps the rows gathered.
  const Dataset failing = Dataset::Range(0, 10).Batch(3).Map([](Element e) {
    if (e["value"].values<int64_t>()[0] == 3) throw Error("batch 1");
    return e;
  });
  EXPECT_EQ(ValueLists(failing.Rebatch({4}).IgnoreErrors()),
            (Lists{{0, 1, 2, 6}, {7, 8, 9}}));
  EXPECT_THROW(Dataset::Range(0, 3).Rebatch({}), Error);
  EXPECT_THROW(Dataset::Range(0, 3).Rebatch({2, 0}), Error);
  EXPECT_EQ(Dataset::Range(0, 8).Batch(4).Rebatch({2}).Cardinality(),
            kUnknownCardinality);
}

}  // namespace
}  // namespace recflow::pipeline
