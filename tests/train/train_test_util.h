// Helpers shared by the train/ tests.
#ifndef RECFLOW_TESTS_TRAIN_TRAIN_TEST_UTIL_H_
#define RECFLOW_TESTS_TRAIN_TRAIN_TEST_UTIL_H_

#include <cstdint>
#include <memory>

#include "train/backend.h"
#include "train/metrics.h"
#include "train/model_context.h"
#include "train/variables.h"

namespace recflow::testing {

using pipeline::DType;
using pipeline::Shape;
using pipeline::Tensor;
using train::Backend;
using train::MakeCpuBackend;
using train::MetricSet;
using train::Mode;
using train::ModelContext;
using train::VariableStore;

// Host tensors and a CPU backend for values built outside a model_fn.
inline Tensor HostFloat(const Shape& s) {
  return Tensor::Allocate(DType::kFloat32, s);
}
inline Backend& HostBackend() {
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

}  // namespace recflow::testing

#endif  // RECFLOW_TESTS_TRAIN_TRAIN_TEST_UTIL_H_
