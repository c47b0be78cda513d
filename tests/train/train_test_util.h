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

// A square pooling window over square images: the cases the pooling tests
// of every backend run through.
struct PoolCase {
  int64_t in, window, stride;
  train::Padding padding;
  // Resolved for `batch` images of `channels` channels.
  train::Window2D Window(int64_t batch, int64_t channels) const {
    train::Window2D g;
    g.batch = batch;
    g.in_h = g.in_w = in;
    g.in_c = g.out_c = channels;
    g.window_h = g.window_w = window;
    g.stride_h = g.stride_w = stride;
    g.padding = padding;
    g.Resolve();
    return g;
  }
};

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
