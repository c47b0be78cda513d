// Optimizers (SGD, Momentum, Adam) and learning-rate schedules against
// TensorFlow's formulas.
#include "train/optimizers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "estimator_test_util.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/ops.h"
#include "train_test_util.h"

namespace recflow::train {
namespace {

using testing::Fixture;
using testing::HostBackend;

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

// Host memory: a gradient of kInPlaceAllReduceValues or more is reduced
// where it is, the smaller ones together in one packed buffer, and every
// buffer gets its sum back.
TEST(OptimizersTest, HostAllReducePacksSmallGradientsAndReducesLargeInPlace) {
  testing::FakeWorld world(2);
  const size_t large = Backend::kInPlaceAllReduceValues;
  std::vector<std::vector<float>> grads = {
      std::vector<float>(large + 5), std::vector<float>(10),
      std::vector<float>(large), std::vector<float>(3)};
  float next = 1;
  for (auto& g : grads) {
    for (float& v : g) v = next++;
  }
  const std::vector<std::vector<float>> before = grads;
  std::vector<std::span<float>> spans;
  for (auto& g : grads) spans.emplace_back(g);
  HostBackend().AllReduceSum(world, spans);

  ASSERT_EQ(world.float_calls.size(), 3u);
  EXPECT_EQ(world.float_calls[0].data(), grads[0].data());
  EXPECT_EQ(world.float_calls[1].data(), grads[2].data());
  EXPECT_EQ(world.float_calls[2].size(), 13u);  // 10 + 3, packed
  EXPECT_NE(world.float_calls[2].data(), grads[1].data());
  for (size_t i = 0; i < grads.size(); ++i) {
    for (size_t j = 0; j < grads[i].size(); ++j) {
      ASSERT_EQ(grads[i][j], 2 * before[i][j])
          << "buffer " << i << " [" << j << "]";
    }
  }
}

// A launched job of one rank (mpirun -np 1) takes the all-reduce's path,
// as a job of many does, and trains exactly as a process alone; a process
// alone (no collective: LocalCollective) skips it.
TEST(OptimizersTest, OneLaunchedRankAllReducesAndTrainsAsAProcessAlone) {
  using namespace estimator_testing;
  recflow::testing::TempDir dir;
  auto world = std::make_shared<testing::FakeWorld>(1);
  EstimatorOptions launched = Quiet();
  launched.collective = world;
  Estimator one(Classifier(), Config((dir.path() / "one").string()), launched);
  Estimator alone(Classifier(), Config((dir.path() / "alone").string()),
                  Quiet());
  EXPECT_EQ(one.Train(TrainInput(), {}, std::nullopt, 7), 7);
  EXPECT_EQ(alone.Train(TrainInput(), {}, std::nullopt, 7), 7);
  // Two kernels and two biases, all under the in-place size: one packed
  // all-reduce a step.
  EXPECT_EQ(world->float_calls.size(), 7u);
  const TensorMap a = ReadCheckpoint(*one.latest_checkpoint());
  const TensorMap b = ReadCheckpoint(*alone.latest_checkpoint());
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    if (t.dtype() != DType::kFloat32) continue;
    const auto x = t.values<float>();
    const auto y = b.at(name).values<float>();
    ASSERT_EQ(x.size(), y.size()) << name;
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], y[i]) << name;
  }
}

}  // namespace
}  // namespace recflow::train
