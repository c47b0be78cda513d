// Training throughput per model, next to the same GEMMs called directly
// through Eigen in the same run (the baseline): how much of a step
// is the matrix products, and what the rest (im2col, activations, losses,
// the optimizer, the tape) costs.
//
//   build/bench/train_bench --benchmark_repetitions=3
//
// Each Step benchmark runs model_fn + backward + Adam update on an
// in-memory batch of 128 Fashion-MNIST-shaped examples (random pixels), so
// it measures compute alone; `recflow train` reports the same with the
// input pipeline in front.  The Gemm benchmarks run exactly the products
// that step runs (forward, dW, dX) on a ThreadPoolDevice of the same size.
#define EIGEN_USE_THREADS
#include <benchmark/benchmark.h>

#include <random>
#include <unsupported/Eigen/CXX11/Tensor>

#include "pipeline/io.h"
#include "train/canned.h"
#include "train/layers.h"

namespace recflow::train {
namespace {

constexpr int64_t kBatch = 128;

// As `recflow` does: large step tensors reuse freed memory instead of
// fresh pages from the kernel each step.
const bool kTuned = [] {
  pipeline::TuneAllocatorForBatches();
  return true;
}();
constexpr int kThreads = 2;

Features Batch() {
  std::mt19937 rng(1);
  std::vector<std::string> images(kBatch, std::string(784, '\0'));
  for (auto& im : images) {
    for (char& c : im) c = static_cast<char>(rng() & 0xff);
  }
  std::vector<int64_t> labels(kBatch);
  for (auto& l : labels) l = rng() % 10;
  Features f;
  f.Set("image", Tensor::FromStrings(images, Shape{kBatch}));
  f.Set("label", Tensor::FromValues<int64_t>(labels, Shape{kBatch}));
  return f;
}

ModelFn Model(const std::string& name) {
  const FeatureColumn image =
      RawBytesColumn("image", Shape{28, 28, 1}, 1.0f / 255);
  if (name == "linear") {
    return LinearClassifierFn({.columns = {image}, .n_classes = 10});
  }
  if (name == "dnn") {
    return DNNClassifierFn(
        {.hidden_units = {256, 128}, .columns = {image}, .n_classes = 10});
  }
  CNNOptions o;
  o.image = image;
  return CNNClassifierFn(o);
}

void Step(benchmark::State& state, const std::string& name) {
  auto backend = MakeCpuBackend(kThreads);
  VariableStore vars(1);
  MetricSet metrics;
  int64_t step = 0;
  Features f = Batch();
  const Tensor labels = f["label"];
  f.components.pop_back();
  const ModelFn fn = Model(name);
  for (auto _ : state) {
    ModelContext ctx(*backend, vars, metrics, Mode::kTrain, &step, 1);
    EstimatorSpec spec = fn(f, &labels, Mode::kTrain, ctx);
    spec.train_op();
    benchmark::DoNotOptimize(spec.loss.value().data<float>()[0]);
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}

struct GemmShape {
  int64_t m, n, k;
  bool ta, tb;
};

// The products of one training step of the model (forward, dW, dX).
std::vector<GemmShape> StepGemms(const std::string& name) {
  auto dense = [](std::vector<GemmShape>& g, int64_t in, int64_t out,
                  bool input_grad) {
    g.push_back({kBatch, out, in, false, false});  // y = x W
    g.push_back({in, out, kBatch, true, false});   // dW = x^T dy
    if (input_grad) g.push_back({kBatch, in, out, false, true});  // dx
  };
  std::vector<GemmShape> g;
  if (name == "linear") {
    dense(g, 784, 10, false);
  } else if (name == "dnn") {
    dense(g, 784, 256, false);
    dense(g, 256, 128, true);
    dense(g, 128, 10, true);
  } else {
    // conv 3x3 SAME: im2col rows = batch * pixels, k = 9 * in_channels.
    auto conv = [&](int64_t pixels, int64_t in_c, int64_t out_c,
                    bool input_grad) {
      g.push_back({kBatch * pixels, out_c, 9 * in_c, false, false});
      g.push_back({9 * in_c, out_c, kBatch * pixels, true, false});
      if (input_grad) g.push_back({kBatch * pixels, 9 * in_c, out_c, false, true});
    };
    conv(28 * 28, 1, 32, false);
    conv(14 * 14, 32, 64, true);
    dense(g, 7 * 7 * 64, 128, true);
    dense(g, 128, 10, true);
  }
  return g;
}

void Gemms(benchmark::State& state, const std::string& name) {
  Eigen::ThreadPool pool(kThreads);
  Eigen::ThreadPoolDevice device(&pool, kThreads);
  using Matrix = Eigen::Tensor<float, 2, Eigen::RowMajor>;
  struct Operands {
    Matrix a, b, c;
    Eigen::array<Eigen::IndexPair<int>, 1> dims;
  };
  std::vector<Operands> ops;
  for (const GemmShape& s : StepGemms(name)) {
    Operands o;
    o.a = Matrix(s.ta ? s.k : s.m, s.ta ? s.m : s.k);
    o.b = Matrix(s.tb ? s.n : s.k, s.tb ? s.k : s.n);
    o.c = Matrix(s.m, s.n);
    o.a.setRandom();
    o.b.setRandom();
    o.dims = {Eigen::IndexPair<int>(s.ta ? 0 : 1, s.tb ? 1 : 0)};
    ops.push_back(std::move(o));
  }
  for (auto _ : state) {
    for (Operands& o : ops) {
      o.c.device(device) = o.a.contract(o.b, o.dims);
      benchmark::DoNotOptimize(o.c.data());
    }
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}

BENCHMARK_CAPTURE(Step, linear, std::string("linear"))->UseRealTime();
BENCHMARK_CAPTURE(Gemms, linear, std::string("linear"))->UseRealTime();
BENCHMARK_CAPTURE(Step, dnn, std::string("dnn"))->UseRealTime();
BENCHMARK_CAPTURE(Gemms, dnn, std::string("dnn"))->UseRealTime();
BENCHMARK_CAPTURE(Step, cnn, std::string("cnn"))->UseRealTime();
BENCHMARK_CAPTURE(Gemms, cnn, std::string("cnn"))->UseRealTime();

}  // namespace
}  // namespace recflow::train
