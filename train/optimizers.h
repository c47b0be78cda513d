// Optimizers (SGD, Momentum, Adam) and learning-rate schedules, with
// TensorFlow's update formulas.
//
//   auto opt = std::make_shared<Adam>(ExponentialDecay(1e-3, 1000, 0.9));
//   spec.train_op = opt->Minimize(ctx, loss);
//
// Minimize() returns the step's train op: run, it computes the gradients
// of `loss`, applies them to every trainable variable, zeroes the
// gradients and advances the global step by one.  Slots (momentum
// accumulators, Adam's moments) are non-trainable variables named
// "<variable>/<Optimizer>/<slot>", so they are saved in checkpoints with
// the model and a resumed run continues the same trajectory.  Optimizers
// hold only hyperparameters and may be re-created every step.
#ifndef RECFLOW_TRAIN_OPTIMIZERS_H_
#define RECFLOW_TRAIN_OPTIMIZERS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "train/model_context.h"

namespace recflow::train {

// The learning rate at a global step.
using LearningRate = std::function<float(int64_t step)>;
LearningRate ConstantLearningRate(float lr);
// lr * rate^(step / decay_steps) (staircase: integer division).
LearningRate ExponentialDecay(float lr, int64_t decay_steps, float rate,
                              bool staircase = false);
// values[i] while step <= boundaries[i] (values has one more entry).
LearningRate PiecewiseConstant(std::vector<int64_t> boundaries,
                               std::vector<float> values);
// Cosine decay from lr to lr * alpha over decay_steps, then lr * alpha.
LearningRate CosineDecay(float lr, int64_t decay_steps, float alpha = 0.0f);

using TrainOp = std::function<void()>;

class Optimizer : public std::enable_shared_from_this<Optimizer> {
 public:
  explicit Optimizer(LearningRate lr) : lr_(std::move(lr)) {}
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;  // "SGD", "Momentum", "Adam"

  // The train op for `loss` (see above).  The optimizer and `ctx` must
  // outlive the op (the Estimator runs it within the step).
  TrainOp Minimize(ModelContext& ctx, const Var& loss);
  float learning_rate(int64_t step) const { return lr_(step); }

 protected:
  // Applies v.grad to v.  `step` counts updates from 1.
  virtual void Apply(ModelContext& ctx, Variable& v, float lr,
                     int64_t step) = 0;
  // Applies every variable's gradient and sets the gradients to zero for
  // the next step.  The default: Apply, then a Fill of the gradient, per
  // variable; an optimizer whose update the backend fuses over all the
  // variables (Adam) does it in one call.
  virtual void ApplyAll(ModelContext& ctx, const std::vector<Variable*>& vars,
                        float lr, int64_t step);
  Variable& Slot(ModelContext& ctx, Variable& v, const std::string& slot);

 private:
  LearningRate lr_;
};

class SGD final : public Optimizer {
 public:
  explicit SGD(LearningRate lr) : Optimizer(std::move(lr)) {}
  explicit SGD(float lr) : SGD(ConstantLearningRate(lr)) {}
  std::string name() const override { return "SGD"; }

 protected:
  void Apply(ModelContext& ctx, Variable& v, float lr, int64_t step) override;
};

class Momentum final : public Optimizer {
 public:
  Momentum(LearningRate lr, float momentum = 0.9f, bool nesterov = false)
      : Optimizer(std::move(lr)), momentum_(momentum), nesterov_(nesterov) {}
  Momentum(float lr, float momentum = 0.9f, bool nesterov = false)
      : Momentum(ConstantLearningRate(lr), momentum, nesterov) {}
  std::string name() const override { return "Momentum"; }

 protected:
  void Apply(ModelContext& ctx, Variable& v, float lr, int64_t step) override;

 private:
  float momentum_;
  bool nesterov_;
};

class Adam final : public Optimizer {
 public:
  Adam(LearningRate lr, float beta1 = 0.9f, float beta2 = 0.999f,
       float epsilon = 1e-7f)
      : Optimizer(std::move(lr)),
        beta1_(beta1),
        beta2_(beta2),
        epsilon_(epsilon) {}
  explicit Adam(float lr = 1e-3f) : Adam(ConstantLearningRate(lr)) {}
  std::string name() const override { return "Adam"; }

 protected:
  void Apply(ModelContext& ctx, Variable& v, float lr, int64_t step) override;
  // Backend::AdamUpdateAll over every variable: the same values as Apply
  // per variable.
  void ApplyAll(ModelContext& ctx, const std::vector<Variable*>& vars, float lr,
                int64_t step) override;

 private:
  float beta1_, beta2_, epsilon_;
};

// "sgd", "momentum", "adam" with a learning rate (CLI and canned
// estimators).  Throws Error for other names.
std::shared_ptr<Optimizer> MakeOptimizer(std::string_view name,
                                         LearningRate lr);

}  // namespace recflow::train

#endif  // RECFLOW_TRAIN_OPTIMIZERS_H_
