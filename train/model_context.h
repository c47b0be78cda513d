// What a model_fn builds its step with: the backend, the variables, the
// metrics, the mode, and names and seeds for its layers.
//
// The Estimator makes one ModelContext per step and calls the model_fn
// with it; layers get their variables from it by name, so calling the
// same model_fn again reuses the same parameters (TF 1.x's variable
// scopes).  Layer names are made unique per step in call order ("dense",
// "dense_1", ...), as TensorFlow names layers in a graph.
//
// Thread safety: one step, one thread.
#ifndef RECFLOW_TRAIN_MODEL_CONTEXT_H_
#define RECFLOW_TRAIN_MODEL_CONTEXT_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "train/backend.h"
#include "train/collective.h"
#include "train/metrics.h"
#include "train/variables.h"

namespace recflow::train {

enum class Mode : uint8_t { kTrain, kEval, kPredict };
std::string_view ModeName(Mode m);  // "train", "eval", "infer"

class ModelContext {
 public:
  // `collective` (null: this process alone) is the world whose ranks
  // train together: optimizers average the gradients over it.
  ModelContext(Backend& backend, VariableStore& variables, MetricSet& metrics,
               Mode mode, int64_t* global_step, uint64_t seed,
               Collective* collective = nullptr)
      : backend_(backend),
        variables_(variables),
        metrics_(metrics),
        mode_(mode),
        global_step_(global_step),
        seed_(seed),
        collective_(collective) {}

  Backend& backend() { return backend_; }
  VariableStore& variables() { return variables_; }
  MetricSet& metrics() { return metrics_; }
  // Null, or the data-parallel world: the gradients are averaged over it
  // when it has more than one rank or is a launched job's (launched()).
  Collective* collective() { return collective_; }
  Mode mode() const { return mode_; }
  bool training() const { return mode_ == Mode::kTrain; }
  int64_t global_step() const { return *global_step_; }
  // Whether a hook fetches `name` after this step (a prediction or a
  // tensor of the EstimatorSpec), so that a model_fn may skip computing
  // what nobody reads in training, as a TensorFlow session runs only the
  // fetched ops.  True where that is unknown (set_fetches not called: every
  // prediction is computed).  The Estimator sets it in training.
  bool Fetched(std::string_view name) const {
    return fetches_ == nullptr || std::find(fetches_->begin(), fetches_->end(),
                                            name) != fetches_->end();
  }
  // The names this step's hooks fetch; must outlive the step (null:
  // unknown).
  void set_fetches(const std::vector<std::string>* names) { fetches_ = names; }
  // For optimizers: the step counter they advance after an update.
  int64_t* mutable_global_step() { return global_step_; }

  // `base` the first time in this step, then base_1, base_2, ...; an
  // explicit name given twice is the same layer (shared weights).
  std::string UniqueName(std::string_view base);
  // A seed for a random op (dropout): a function of the run's seed, the
  // global step and the op's position in the step, so that a restarted
  // run draws the same masks.
  uint64_t NextSeed();

 private:
  Backend& backend_;
  VariableStore& variables_;
  MetricSet& metrics_;
  Mode mode_;
  int64_t* global_step_;
  uint64_t seed_;
  const std::vector<std::string>* fetches_ = nullptr;
  Collective* collective_;
  uint64_t ops_ = 0;
  std::map<std::string, int, std::less<>> names_;
};

}  // namespace recflow::train

#endif  // RECFLOW_TRAIN_MODEL_CONTEXT_H_
