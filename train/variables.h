// Variables: a model's parameters, its optimizer's slots and other state
// that lives across steps (batch-norm moving averages), by name, as
// tf.compat.v1.get_variable.
//
// Layers ask for their variables with GetOrCreate(name, shape, init) every
// step; the first call creates and initialises them, later calls return
// the same ones.  Initial values depend only on the store's seed and the
// variable's name, so the same seed gives the same model whatever order
// layers are built in.  A store restored from a checkpoint hands out the
// checkpoint's values instead of initialising, and says clearly when a
// checkpoint lacks a variable or holds it in another shape.
//
// Thread safety: none; one training loop owns a store.
#ifndef RECFLOW_TRAIN_VARIABLES_H_
#define RECFLOW_TRAIN_VARIABLES_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "pipeline/dataset_base.h"
#include "train/ops.h"

namespace recflow::train {

// Fills a new variable's values.  fan_in / fan_out as Keras computes them
// for the shape (dense [in, out]; conv [h, w, in, out] -> h*w*in, h*w*out).
struct Initializer {
  enum class Kind {
    kZeros,
    kOnes,
    kConstant,
    kGlorotUniform,  // Keras' default for kernels
    kHeNormal,       // truncated normal, stddev sqrt(2 / fan_in)
    kRandomNormal,   // stddev
    kRandomUniform,  // [-limit, limit] with limit = stddev
  };
  Kind kind = Kind::kZeros;
  float value = 0.0f;  // kConstant: the value; kRandom*: stddev / limit

  static Initializer Zeros() { return {Kind::kZeros}; }
  static Initializer Ones() { return {Kind::kOnes}; }
  static Initializer Constant(float v) { return {Kind::kConstant, v}; }
  static Initializer GlorotUniform() { return {Kind::kGlorotUniform}; }
  static Initializer HeNormal() { return {Kind::kHeNormal}; }
  static Initializer RandomNormal(float stddev) {
    return {Kind::kRandomNormal, stddev};
  }
  static Initializer RandomUniform(float limit) {
    return {Kind::kRandomUniform, limit};
  }
  void Fill(const Shape& shape, uint64_t seed, std::span<float> out) const;
};

struct Variable {
  std::string name;
  // float32 in the store's memory (the backend's), updated in place by
  // optimizers and layers.
  Tensor value;
  Tensor grad;  // same shape, zero between steps (trainable only)
  bool trainable = true;

  float* data() { return value.mutable_data<float>(); }
  float* grad_data() { return grad.mutable_data<float>(); }
  int64_t size() const { return value.num_elements(); }
};

class VariableStore {
 public:
  // Values live in `backend`'s memory (null: host memory); the backend
  // must outlive the store.
  explicit VariableStore(uint64_t seed = 0, Backend* backend = nullptr)
      : seed_(seed), backend_(backend) {}
  VariableStore(const VariableStore&) = delete;
  VariableStore& operator=(const VariableStore&) = delete;

  // The variable `name`, created with `init` when it does not exist yet
  // (or taken from the restored checkpoint).  Throws Error when it exists
  // with another shape, or when a restored checkpoint lacks it or holds
  // another shape.
  Variable& GetOrCreate(const std::string& name, const Shape& shape,
                        const Initializer& init, bool trainable = true);
  Variable* Find(const std::string& name);
  // A graph node reading `v`: its gradient accumulates into v.grad.
  static Var Read(Variable& v);

  // In creation order.
  std::vector<Variable*> all();
  std::vector<Variable*> trainable();
  size_t size() const { return order_.size(); }

  // Values that later GetOrCreate calls take instead of initialising
  // (a checkpoint's variables); applied at once to existing variables.
  // `source` names the checkpoint in messages.
  void Restore(std::map<std::string, Tensor> values, std::string source);
  // Names of restored values no variable has asked for (yet).
  std::vector<std::string> UnusedRestoredNames() const;

  uint64_t seed() const { return seed_; }

 private:
  // `host` (float32, host memory) in the store's memory.
  Tensor Place(Tensor host);

  uint64_t seed_;
  Backend* backend_;
  std::map<std::string, std::unique_ptr<Variable>> by_name_;
  std::vector<Variable*> order_;
  std::map<std::string, Tensor> restored_;
  std::string restored_from_;
};

}  // namespace recflow::train

#endif  // RECFLOW_TRAIN_VARIABLES_H_
