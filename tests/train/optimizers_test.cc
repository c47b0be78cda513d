// Optimizers (SGD, Momentum, Adam) and learning-rate schedules against
// TensorFlow's formulas.
#include "train/optimizers.h"

#include <gtest/gtest.h>

#include <cmath>

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

}  // namespace
}  // namespace recflow::train
