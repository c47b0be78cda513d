// Layers, variables, optimizers, schedules and metrics.
#include "train/layers.h"

#include <gtest/gtest.h>

#include <cmath>

#include "train/metrics.h"
#include "train/optimizers.h"

namespace recflow::train {
namespace {

// Host tensors and a CPU backend for values built outside a model_fn.
[[maybe_unused]] Tensor HostFloat(const Shape& s) {
  return Tensor::Allocate(DType::kFloat32, s);
}
[[maybe_unused]] Backend& HostBackend() {
  static const std::unique_ptr<Backend> backend = MakeCpuBackend(2);
  return *backend;
}

struct Fixture {
  std::unique_ptr<Backend> backend = MakeCpuBackend(2);
  VariableStore vars{7};
  MetricSet metrics;
  int64_t step = 0;
  ModelContext Context(Mode mode = Mode::kTrain) {
    return ModelContext(*backend, vars, metrics, mode, &step, 7);
  }
};

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

// One variable w (2 values) and loss = sum(w * g) so that dL/dw = g.
float RunOptimizer(const std::shared_ptr<Optimizer>& opt, int steps,
                   Fixture& f) {
  const float g[] = {0.5f, -2.0f};
  for (int s = 0; s < steps; ++s) {
    ModelContext ctx = f.Context();
    Variable& w =
        ctx.variables().GetOrCreate("w", Shape{2}, Initializer::Constant(1.0f));
    Var loss = ops::ReduceSum(
        ctx.backend(),
        ops::Multiply(ctx.backend(), VariableStore::Read(w),
                      ops::Constant(HostBackend(),
                                    Tensor::FromValues<float>(g, Shape{2}))));
    opt->Minimize(ctx, loss)();
  }
  return f.vars.Find("w")->value.data<float>()[0];
}

TEST(OptimizersTest, UpdatesFollowTensorFlowsFormulas) {
  {
    Fixture f;
    EXPECT_FLOAT_EQ(RunOptimizer(std::make_shared<SGD>(0.1f), 2, f),
                    1 - 2 * 0.1f * 0.5f);
    EXPECT_EQ(f.step, 2);
    EXPECT_EQ(f.vars.Find("w")->grad.data<float>()[0], 0.0f);
  }
  {
    Fixture f;
    // v1 = g, v2 = 0.9 g + g; w = 1 - lr (v1 + v2)
    EXPECT_FLOAT_EQ(RunOptimizer(std::make_shared<Momentum>(0.1f, 0.9f), 2, f),
                    1 - 0.1f * (0.5f + 0.95f));
    EXPECT_NE(f.vars.Find("w/Momentum/momentum"), nullptr);
  }
  {
    Fixture f;
    // Adam's first step moves each weight by about lr, against its gradient.
    EXPECT_NEAR(RunOptimizer(std::make_shared<Adam>(0.01f), 1, f), 0.99, 1e-6);
    EXPECT_NEAR(f.vars.Find("w/Adam/m")->value.data<float>()[1], -0.2, 1e-6);
    EXPECT_NEAR(f.vars.Find("w/Adam/v")->value.data<float>()[1], 0.004, 1e-7);
  }
}

TEST(OptimizersTest, LearningRateSchedules) {
  EXPECT_FLOAT_EQ(ExponentialDecay(0.1f, 100, 0.5f)(50),
                  0.1f * std::sqrt(0.5f));
  EXPECT_FLOAT_EQ(ExponentialDecay(0.1f, 100, 0.5f, true)(150), 0.05f);
  auto p = PiecewiseConstant({10, 20}, {1.0f, 0.5f, 0.1f});
  EXPECT_EQ(p(10), 1.0f);
  EXPECT_EQ(p(11), 0.5f);
  EXPECT_EQ(p(100), 0.1f);
  EXPECT_THROW(PiecewiseConstant({10}, {1.0f}), Error);
  EXPECT_FLOAT_EQ(CosineDecay(1.0f, 100)(50), 0.5f);
  EXPECT_FLOAT_EQ(CosineDecay(1.0f, 100, 0.1f)(1000), 0.1f);
  EXPECT_THROW(MakeOptimizer("rmsprop", ConstantLearningRate(1)), Error);
}

TEST(MetricsTest, AccuracyPrecisionRecallAuc) {
  MetricSet m;
  const int64_t labels[] = {1, 2, 3, 4};
  const int64_t preds[] = {1, 0, 3, 0};
  m.Get<Accuracy>("accuracy").Update(labels, preds);
  EXPECT_DOUBLE_EQ(m.Results().at("accuracy"), 0.5);
  EXPECT_THROW(m.Get<Mean>("accuracy"), Error);

  const float y[] = {1, 1, 0, 0, 1};
  const float p[] = {0.9f, 0.4f, 0.6f, 0.1f, 0.7f};
  Precision precision;
  Recall recall;
  precision.Update(y, p);
  recall.Update(y, p);
  EXPECT_DOUBLE_EQ(precision.Result(), 2.0 / 3);
  EXPECT_DOUBLE_EQ(recall.Result(), 2.0 / 3);
  AUC auc;
  auc.Update(y, p);
  // 6 positive/negative pairs, 5 ordered correctly.
  EXPECT_NEAR(auc.Result(), 5.0 / 6, 0.01);
  AUC perfect;
  const float sure[] = {0.99f, 0.8f, 0.2f, 0.01f, 0.7f};
  perfect.Update(y, sure);
  EXPECT_NEAR(perfect.Result(), 1.0, 1e-9);
}

}  // namespace
}  // namespace recflow::train
