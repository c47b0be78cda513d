// Helpers shared by the train/ tests.
#ifndef RECFLOW_TESTS_TRAIN_TRAIN_TEST_UTIL_H_
#define RECFLOW_TESTS_TRAIN_TRAIN_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "train/backend.h"
#include "train/collective.h"
#include "train/error.h"
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

// A world of `size` ranks seen from rank 0, for what goes through a
// Collective without MPI: a sum multiplies by `size` (every rank holding
// the same values), max and min leave the values, a broadcast leaves rank
// 0's bytes; `local_rank` is this rank's index on its host.  It keeps the
// float spans it was asked to all-reduce and
// counts the broadcasts.  It stands for a launched job's world
// (launched()), so one rank of it all-reduces too.
class FakeWorld : public train::Collective {
 public:
  explicit FakeWorld(int size, int local_rank = 0)
      : size_(size), local_rank_(local_rank) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_rank_ + 1; }
  std::string name() const override { return "fake"; }
  bool launched() const override { return true; }
  void AllReduce(std::span<float> data, train::ReduceOp op) override {
    float_calls.push_back(data);
    Apply(data, op);
  }
  void AllReduce(std::span<double> data, train::ReduceOp op) override {
    Apply(data, op);
  }
  void AllReduce(std::span<int64_t> data, train::ReduceOp op) override {
    Apply(data, op);
  }
  void Broadcast(std::string&, int) override { ++broadcasts; }
  void Barrier() override {}
  void Abort(int code) override {
    throw train::Error("FakeWorld::Abort(" + std::to_string(code) + ")");
  }

  std::vector<std::span<float>> float_calls;
  int broadcasts = 0;

 private:
  template <typename T>
  void Apply(std::span<T> data, train::ReduceOp op) {
    if (op != train::ReduceOp::kSum) return;
    for (T& v : data) v *= static_cast<T>(size_);
  }
  int size_, local_rank_;
};

}  // namespace recflow::testing

#endif  // RECFLOW_TESTS_TRAIN_TRAIN_TEST_UTIL_H_
