#include "train/optimizers.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <span>
#include <vector>

namespace recflow::train {

LearningRate ConstantLearningRate(float lr) {
  return [lr](int64_t) { return lr; };
}

LearningRate ExponentialDecay(float lr, int64_t decay_steps, float rate,
                              bool staircase) {
  if (decay_steps <= 0) throw Error("exponential decay: decay_steps <= 0");
  return [=](int64_t step) {
    double p = double(step) / double(decay_steps);
    if (staircase) p = std::floor(p);
    return static_cast<float>(lr * std::pow(double(rate), p));
  };
}

LearningRate PiecewiseConstant(std::vector<int64_t> boundaries,
                               std::vector<float> values) {
  if (values.size() != boundaries.size() + 1) {
    throw Error(
        fmt::format("piecewise constant: {} boundaries need {} values, got {}",
                    boundaries.size(), boundaries.size() + 1, values.size()));
  }
  return [boundaries = std::move(boundaries),
          values = std::move(values)](int64_t step) {
    for (size_t i = 0; i < boundaries.size(); ++i) {
      if (step <= boundaries[i]) return values[i];
    }
    return values.back();
  };
}

LearningRate CosineDecay(float lr, int64_t decay_steps, float alpha) {
  if (decay_steps <= 0) throw Error("cosine decay: decay_steps <= 0");
  return [=](int64_t step) {
    const double p = std::min<double>(double(step), double(decay_steps)) /
                     double(decay_steps);
    const double cosine = 0.5 * (1 + std::cos(std::numbers::pi * p));
    return static_cast<float>(lr * ((1 - alpha) * cosine + alpha));
  };
}

namespace {

// Data parallelism: every rank's gradients replaced by their sum over the
// ranks (Backend::AllReduceSum: the collective's all-reduce on host memory,
// NCCL on the GPU's); Minimize seeds the backward pass with 1/N, so the sum
// is the mean (each rank's loss is the mean over its own batch, so with
// equal batches this is the gradient of the mean over the global batch)
// with no pass over the gradients to scale them.  Every rank issues the
// same collectives in the same order: the trainable variables are the same
// everywhere.
void SumGradients(ModelContext& ctx) {
  const std::vector<Variable*> vars = ctx.variables().trainable();
  thread_local std::vector<std::span<float>> grads;
  grads.clear();
  for (Variable* v : vars) {
    grads.emplace_back(v->grad_data(), static_cast<size_t>(v->size()));
  }
  ctx.backend().AllReduceSum(*ctx.collective(), grads);
}

// Whether the gradients go through the all-reduce: with more than one
// rank, and with one rank of a job that a launcher started (mpirun -np 1),
// so that its path, NCCL's on a GPU, runs and is measured as the job of
// many would run it.  A process alone (LocalCollective) skips it.
bool AllReduces(const Collective* world) {
  return world != nullptr && (world->size() > 1 || world->launched());
}

}  // namespace

TrainOp Optimizer::Minimize(ModelContext& ctx, const Var& loss) {
  auto self = shared_from_this();
  return [self, &ctx, loss] {
    Backend& be = ctx.backend();
    const int ranks =
        ctx.collective() != nullptr ? ctx.collective()->size() : 1;
    ops::Backward(be, loss, 1.0f / static_cast<float>(ranks));
    if (AllReduces(ctx.collective())) SumGradients(ctx);
    const int64_t step = ctx.global_step();
    const float lr = self->lr_(step);
    self->ApplyAll(ctx, ctx.variables().trainable(), lr, step + 1);
    ++*ctx.mutable_global_step();
  };
}

void Optimizer::ApplyAll(ModelContext& ctx, const std::vector<Variable*>& vars,
                         float lr, int64_t step) {
  for (Variable* v : vars) {
    Apply(ctx, *v, lr, step);
    ctx.backend().Fill(v->size(), 0.0f, v->grad_data());
  }
}

Variable& Optimizer::Slot(ModelContext& ctx, Variable& v,
                          const std::string& slot) {
  return ctx.variables().GetOrCreate(v.name + "/" + name() + "/" + slot,
                                     v.value.shape(), Initializer::Zeros(),
                                     /*trainable=*/false);
}

void SGD::Apply(ModelContext& ctx, Variable& v, float lr, int64_t) {
  ctx.backend().SgdUpdate(v.size(), lr, v.grad_data(), v.data());
}

void Momentum::Apply(ModelContext& ctx, Variable& v, float lr, int64_t) {
  Variable& accumulator = Slot(ctx, v, "momentum");
  ctx.backend().MomentumUpdate(v.size(), lr, momentum_, nesterov_,
                               v.grad_data(), accumulator.data(), v.data());
}

namespace {

// TensorFlow's bias-corrected step size at update `step` (from 1).
float AdamStepSize(float lr, float beta1, float beta2, int64_t step) {
  const double t = static_cast<double>(step);
  return static_cast<float>(lr * std::sqrt(1 - std::pow(double(beta2), t)) /
                            (1 - std::pow(double(beta1), t)));
}

}  // namespace

void Adam::Apply(ModelContext& ctx, Variable& v, float lr, int64_t step) {
  Variable& m = Slot(ctx, v, "m");
  Variable& s = Slot(ctx, v, "v");
  ctx.backend().AdamUpdate(v.size(), AdamStepSize(lr, beta1_, beta2_, step),
                           beta1_, beta2_, epsilon_, v.grad_data(), m.data(),
                           s.data(), v.data());
}

void Adam::ApplyAll(ModelContext& ctx, const std::vector<Variable*>& vars,
                    float lr, int64_t step) {
  thread_local std::vector<Backend::AdamVariable> all;
  all.clear();
  for (Variable* v : vars) {
    all.push_back({.n = v->size(),
                   .g = v->grad_data(),
                   .m = Slot(ctx, *v, "m").data(),
                   .v = Slot(ctx, *v, "v").data(),
                   .w = v->data()});
  }
  ctx.backend().AdamUpdateAll(all, AdamStepSize(lr, beta1_, beta2_, step),
                              beta1_, beta2_, epsilon_);
}

std::shared_ptr<Optimizer> MakeOptimizer(std::string_view name,
                                         LearningRate lr) {
  if (name == "sgd") return std::make_shared<SGD>(std::move(lr));
  if (name == "momentum") return std::make_shared<Momentum>(std::move(lr));
  if (name == "adam") return std::make_shared<Adam>(std::move(lr));
  throw Error(fmt::format(
      "unknown optimizer \"{}\" (expected sgd, momentum or adam)", name));
}

}  // namespace recflow::train
