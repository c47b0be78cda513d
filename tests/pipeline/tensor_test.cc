// Tensor and Element (tensor.cc): shared storage, views and slices, bytes
// and ragged values, compaction, and the errors that name what was wrong.
#include "pipeline/tensor.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace recflow::pipeline {
namespace {

TEST(TensorTest, SlicesAndReshapesShareStorage) {
  const float v[] = {1, 2, 3, 4, 5, 6};
  const Tensor t = Tensor::FromValues<float>(v, Shape{3, 2});
  const Tensor row = t.Slice(1);
  EXPECT_EQ(row.shape(), Shape{2});
  EXPECT_EQ(row.data<float>(), t.data<float>() + 2);  // a view, no copy
  EXPECT_EQ(row.values<float>()[1], 4.0f);
  const Tensor flat = t.Reshape(Shape{6});
  EXPECT_EQ(flat.data<float>(), t.data<float>());
  EXPECT_THROW(t.Reshape(Shape{4}), Error);
  EXPECT_THROW(t.data<int64_t>(), Error);  // another dtype
  EXPECT_EQ(t.NumberAt(5), 6.0);
  EXPECT_EQ(Tensor::Scalar<int64_t>(9).scalar<int64_t>(), 9);
}

TEST(TensorTest, AViewKeepsItsOwnerAliveAndCompactLetsGo) {
  auto block = std::make_shared<std::vector<char>>(1 << 20, 'x');
  std::weak_ptr<std::vector<char>> alive = block;
  const char* data = block->data() + 100;
  Tensor record = Tensor::BytesView(data, 5, block, block->size());
  block.reset();
  ASSERT_FALSE(alive.expired());  // the view holds the block
  EXPECT_EQ(record.bytes(0), "xxxxx");
  EXPECT_FALSE(record.IsCompact());  // 5 bytes keeping 1 MiB
  Tensor own = record.Compact();
  EXPECT_TRUE(own.IsCompact());
  record = Tensor();
  EXPECT_TRUE(alive.expired());  // the compact copy does not
  EXPECT_EQ(own.bytes(0), "xxxxx");
}

TEST(TensorTest, BytesValuesRaggedRowsAndDecodeRaw) {
  const std::vector<std::string> s = {"ab", "cd", "ef"};
  const Tensor t = Tensor::FromStrings(s, Shape{3});
  EXPECT_EQ(t.bytes(2), "ef");
  EXPECT_EQ(t.byte_size(), 6u);
  const Tensor raw = t.BytesAsUInt8();
  EXPECT_EQ(raw.shape(), (Shape{3, 2}));
  EXPECT_EQ(raw.values<uint8_t>()[3], 'd');
  const std::vector<std::string> uneven = {"a", "bc"};
  EXPECT_THROW(Tensor::FromStrings(uneven, Shape{2}).BytesAsUInt8(), Error);

  const int64_t values[] = {1, 2, 3, 4, 5};
  const int64_t lengths[] = {2, 0, 3};
  const Tensor r =
      Tensor::Ragged(Tensor::FromValues<int64_t>(values, Shape{5}),
                     Tensor::FromValues<int64_t>(lengths, Shape{3}));
  EXPECT_TRUE(r.ragged());
  EXPECT_EQ(r.num_rows(), 3);
  EXPECT_EQ(r.Slice(1).num_elements(), 0);
  EXPECT_EQ(r.Slice(2).values<int64_t>()[0], 3);
  const int64_t wrong[] = {2, 2};
  EXPECT_THROW(Tensor::Ragged(Tensor::FromValues<int64_t>(values, Shape{5}),
                              Tensor::FromValues<int64_t>(wrong, Shape{2})),
               Error);
}

TEST(TensorTest, EqualityAndTheElementsNames) {
  const float a[] = {1, 2};
  const float b[] = {1, 3};
  EXPECT_EQ(Tensor::FromValues<float>(a, Shape{2}),
            Tensor::FromValues<float>(a, Shape{2}));
  EXPECT_FALSE(Tensor::FromValues<float>(a, Shape{2}) ==
               Tensor::FromValues<float>(b, Shape{2}));
  EXPECT_FALSE(Tensor::FromValues<float>(a, Shape{2}) ==
               Tensor::FromValues<float>(a, Shape{1, 2}));
  Element e;
  e.Set("x", Tensor::Scalar<int64_t>(1));
  e.Set("x", Tensor::Scalar<int64_t>(2));  // replaces
  e.Set("y", Tensor::BytesScalar("v"));
  EXPECT_EQ(e.components.size(), 2u);
  EXPECT_EQ(e["x"].scalar<int64_t>(), 2);
  EXPECT_EQ(e.Find("z"), nullptr);
  try {
    (void)e["z"];
    FAIL() << "a missing name was found";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("x"), std::string::npos)
        << err.what();  // lists the names there are
  }
}

}  // namespace
}  // namespace recflow::pipeline
