// Layers: their variables, shapes and behaviour in training and later.
#include "train/layers.h"

#include <gtest/gtest.h>

#include <cmath>

#include "train_test_util.h"

namespace recflow::train {
namespace {

using testing::Fixture;
using testing::HostBackend;
using testing::HostFloat;

Tensor Filled(const Shape& s, float v) {
  Tensor t = HostFloat(s);
  std::fill_n(t.mutable_data<float>(), t.num_elements(), v);
  return t;
}

TEST(LayersTest, DenseCreatesNamedVariablesOnceWithGlorotValues) {
  Fixture f;
  for (int step = 0; step < 2; ++step) {
    ModelContext ctx = f.Context();
    Var x = ops::Constant(HostBackend(), Filled({4, 30}, 1.0f));
    Var h =
        layers::Dense(ctx, x, {.units = 20, .activation = Activation::kRelu});
    Var y = layers::Dense(ctx, h, {.units = 5});
    EXPECT_EQ(y.shape(), (Shape{4, 5}));
  }
  ASSERT_EQ(f.vars.size(), 4u);
  Variable* k = f.vars.Find("dense/kernel");
  ASSERT_NE(k, nullptr);
  ASSERT_NE(f.vars.Find("dense_1/bias"), nullptr);
  const double limit = std::sqrt(6.0 / (30 + 20));
  double max = 0, sum = 0;
  for (float v : k->value.values<float>()) {
    max = std::max(max, double(std::abs(v)));
    sum += v;
  }
  EXPECT_LE(max, limit);
  EXPECT_GT(max, 0.9 * limit);
  EXPECT_LT(std::abs(sum / 600), 0.02);
  // The same seed gives the same values, whatever else exists.
  VariableStore other(7);
  Variable& again = other.GetOrCreate("dense/kernel", Shape{30, 20},
                                      Initializer::GlorotUniform());
  EXPECT_EQ(again.value, k->value);
  EXPECT_THROW(other.GetOrCreate("dense/kernel", Shape{3, 2},
                                 Initializer::GlorotUniform()),
               Error);
}

TEST(LayersTest, ConvPoolFlattenShapes) {
  Fixture f;
  ModelContext ctx = f.Context();
  Var x = ops::Constant(HostBackend(), Filled({2, 28, 28, 1}, 0.5f));
  Var c = layers::Conv2D(ctx, x,
                         {.filters = 8,
                          .padding = Padding::kSame,
                          .activation = Activation::kRelu});
  EXPECT_EQ(c.shape(), (Shape{2, 28, 28, 8}));
  Var p = layers::MaxPool2D(ctx, c);
  EXPECT_EQ(p.shape(), (Shape{2, 14, 14, 8}));
  Var c2 = layers::Conv2D(ctx, p, {.filters = 4, .kernel_h = 5, .kernel_w = 5});
  EXPECT_EQ(c2.shape(), (Shape{2, 10, 10, 4}));
  EXPECT_EQ(layers::AvgPool2D(ctx, c2, {.pool_h = 3, .pool_w = 3}).shape(),
            (Shape{2, 3, 3, 4}));
  EXPECT_EQ(layers::Flatten(ctx, c2).shape(), (Shape{2, 400}));
  EXPECT_THROW(layers::Dense(ctx, c2, {.units = 3}), Error);
}

TEST(LayersTest, DropoutOnlyInTrainingAndKeepsTheMean) {
  Fixture f;
  Var x = ops::Constant(HostBackend(), Filled({100, 100}, 1.0f));
  ModelContext eval = f.Context(Mode::kEval);
  EXPECT_EQ(layers::Dropout(eval, x, 0.3f).value(), x.value());
  ModelContext train = f.Context();
  Var y = layers::Dropout(train, x, 0.3f);
  int zeros = 0;
  double sum = 0;
  for (float v : y.value().values<float>()) {
    zeros += v == 0;
    sum += v;
  }
  EXPECT_NEAR(zeros / 1e4, 0.3, 0.02);
  EXPECT_NEAR(sum / 1e4, 1.0, 0.03);
  // Another op in the same step draws another mask.
  EXPECT_FALSE(layers::Dropout(train, x, 0.3f).value() == y.value());
}

TEST(LayersTest, BatchNormUsesBatchStatisticsInTrainingAndMovingOnesLater) {
  Fixture f;
  Tensor x = HostFloat({4, 2});
  const float values[] = {1, 10, 3, 10, 5, 20, 7, 20};
  std::copy(values, values + 8, x.mutable_data<float>());
  ModelContext train = f.Context();
  Var y = layers::BatchNorm(train, ops::Constant(HostBackend(), x),
                            {.momentum = 0.5f});
  // Channel 0: mean 4, variance 5.
  EXPECT_NEAR(y.data()[0], (1 - 4) / std::sqrt(5 + 1e-3), 1e-4);
  Variable* mean = f.vars.Find("batch_normalization/moving_mean");
  Variable* var = f.vars.Find("batch_normalization/moving_variance");
  EXPECT_FLOAT_EQ(mean->value.data<float>()[0], 2.0f);  // 0.5*0 + 0.5*4
  EXPECT_FLOAT_EQ(var->value.data<float>()[0], 3.0f);   // 0.5*1 + 0.5*5
  EXPECT_FALSE(mean->trainable);
  ModelContext eval = f.Context(Mode::kEval);
  Var z = layers::BatchNorm(eval, ops::Constant(HostBackend(), x),
                            {.name = "batch_normalization"});
  EXPECT_NEAR(z.data()[0], (1 - 2) / std::sqrt(3 + 1e-3), 1e-4);
}

TEST(LayersTest, EmbeddingLooksUpRows) {
  Fixture f;
  ModelContext ctx = f.Context();
  const int64_t ids[] = {3, 0, 3};
  Var e = layers::Embedding(ctx, Tensor::FromValues<int64_t>(ids, Shape{3}),
                            {.input_dim = 4, .output_dim = 2});
  EXPECT_EQ(e.shape(), (Shape{3, 2}));
  const float* table = f.vars.Find("embedding/embeddings")->value.data<float>();
  EXPECT_EQ(e.data()[0], table[6]);
  EXPECT_EQ(e.data()[4], table[6]);
  const int64_t bad[] = {4};
  EXPECT_THROW(
      layers::Embedding(ctx, Tensor::FromValues<int64_t>(bad, Shape{1}),
                        {.input_dim = 4, .output_dim = 2, .name = "embedding"}),
      Error);
}

}  // namespace
}  // namespace recflow::train
