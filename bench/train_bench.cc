// Training throughput per model, next to the same GEMMs called directly
// through Eigen in the same run (the issue's baseline): how much of a step
// is the matrix products, and what the rest (im2col, activations, losses,
// the optimizer, the tape) costs.
//
//   build/bench/train_bench --benchmark_repetitions=3
//   build/bench/train_bench --device cuda   # the CUDA backend (issue: GPU)
//
// With --device cuda the benchmarks are, per model (batch 128, Adam):
//   CudaStep/<model>: steps on a batch already on the device, 50 steps per
//     iteration and one synchronisation; counters: library_ms (the step's
//     cuBLAS/cuDNN calls replayed alone, same shapes, same run) and
//     library_share (library_ms / step time): what is outside the library
//     kernels is launch and framework overhead.
//   CudaPipeline/<model>: the same steps fed by the input pipeline from a
//     TFRecord file (shuffle, repeat, batch, parse, prefetch) with the
//     backend's Prefetch copying each batch on its copy stream.
//
// Each Step benchmark runs model_fn + backward + Adam update on an
// in-memory batch of 128 Fashion-MNIST-shaped examples (random pixels), so
// it measures compute alone; `recflow train` reports the same with the
// input pipeline in front.  The Gemm benchmarks run exactly the products
// that step runs (forward, dW, dX) on a ThreadPoolDevice of the same size.
#define EIGEN_USE_THREADS
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string_view>
#include <unsupported/Eigen/CXX11/Tensor>

#include "pipeline/dataset.h"
#include "pipeline/io.h"
#include "records/example_builder.h"
#include "records/feature_spec.h"
#include "records/tfrecord_writer.h"
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
    g.push_back({kBatch, out, in, false, false});                 // y = x W
    g.push_back({in, out, kBatch, true, false});                  // dW = x^T dy
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
      if (input_grad)
        g.push_back({kBatch * pixels, 9 * in_c, out_c, false, true});
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

// ---- CUDA ------------------------------------------------------------------

std::string g_device = "cpu";

std::shared_ptr<Backend> CudaBackend() {
  static std::shared_ptr<Backend> backend =
      MakeBackend(ParseDevice(g_device == "cpu" ? "cuda" : g_device));
  return backend;
}

constexpr int kStepsPerIteration = 50;

// Runs kStepsPerIteration steps per iteration on `next_batch`'s batches
// and synchronises once; reports manual time.
template <typename NextBatch>
void RunCudaSteps(benchmark::State& state, const std::string& name,
                  NextBatch next_batch) {
  Backend& be = *CudaBackend();
  VariableStore vars(1, &be);
  MetricSet metrics;
  int64_t step = 0;
  const ModelFn fn = Model(name);
  auto one_step = [&] {
    Features f = next_batch();
    const Tensor labels = f["label"];
    f.components.erase(f.components.begin() + 1);
    ModelContext ctx(be, vars, metrics, Mode::kTrain, &step, 1);
    EstimatorSpec spec = fn(f, &labels, Mode::kTrain, ctx);
    spec.train_op();
  };
  for (int i = 0; i < 20; ++i) one_step();  // plans, allocator, warm-up
  be.Synchronize();
  double seconds = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kStepsPerIteration; ++i) one_step();
    be.Synchronize();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    state.SetIterationTime(s);
    seconds += s;
  }
  const double per_step = seconds / (state.iterations() * kStepsPerIteration);
  be.StartCallLog();
  one_step();
  be.StopCallLog();
  if (auto library = be.TimeCallLog(200)) {
    state.counters["library_ms"] = *library * 1e3;
    state.counters["library_share"] = *library / per_step;
  }
  state.counters["step_ms"] = per_step * 1e3;
  state.SetItemsProcessed(state.iterations() * kStepsPerIteration * kBatch);
  state.SetLabel(be.device_name());
}

// A batch already on the device: the image as uint8 rows, the label.
void CudaStep(benchmark::State& state, const std::string& name) {
  Backend& be = *CudaBackend();
  const Features host = Batch();
  std::vector<uint8_t> pixels;
  for (int64_t i = 0; i < kBatch; ++i) {
    const std::string_view v = host["image"].bytes(i);
    pixels.insert(pixels.end(), v.begin(), v.end());
  }
  Features f;
  f.Set("image",
        be.ToDevice(Tensor::FromValues<uint8_t>(pixels, Shape{kBatch, 784})));
  f.Set("label", be.ToDevice(host["label"]));
  RunCudaSteps(state, name, [&] { return f; });
}

// The same steps from a TFRecord file through the pipeline.
void CudaPipeline(benchmark::State& state, const std::string& name,
                  bool fused) {
  Backend& be = *CudaBackend();
  const std::string path =
      (std::filesystem::temp_directory_path() / "recflow_train_bench.tfrecord")
          .string();
  {
    records::TFRecordWriter writer(path, records::WriterOptions{});
    records::ExampleBuilder b;
    std::mt19937 rng(2);
    std::string image(784, '\0');
    for (int i = 0; i < 8000; ++i) {
      for (char& c : image) c = static_cast<char>(rng() & 0xff);
      b.Clear();
      b.AddBytes("image", image).AddInt64("label", rng() % 10);
      writer.Write(b.Serialize());
    }
    writer.Close();
  }
  const records::FeatureSpec spec = records::FeatureSpec::FromJsonText(
      R"({"features": {
        "image": {"kind": "fixed", "dtype": "bytes", "shape": []},
        "label": {"kind": "fixed", "dtype": "int64", "shape": []}}})");
  pipeline::ParseOptions parse;
  parse.num_parallel_calls = pipeline::kAutotune;
  pipeline::Iterator it = pipeline::Dataset::FromTFRecords({path})
                              .Shuffle(10000, 1)
                              .Repeat()
                              .Batch(kBatch, true)
                              .Parse(spec, parse)
                              .Prefetch(2)
                              .MakeIterator({.optimize = fused});
  // The input alone on the training thread (next batch + its copy), per
  // batch, in the same run: what the steps below pay for their input.
  {
    pipeline::Element e;
    for (int i = 0; i < 50; ++i) it.Next(&e);
    const auto start = std::chrono::steady_clock::now();
    double prefetch = 0;
    constexpr int kBatches = 300;
    for (int i = 0; i < kBatches; ++i) {
      it.Next(&e);
      const auto p = std::chrono::steady_clock::now();
      be.Prefetch(e);
      prefetch +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - p)
              .count();
    }
    const double total =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    state.counters["input_us"] = total / kBatches * 1e6;
    state.counters["prefetch_us"] = prefetch / kBatches * 1e6;
  }
  RunCudaSteps(state, name, [&] {
    pipeline::Element e;
    it.Next(&e);
    // As the Estimator does: start the copy, then build the step.
    be.Prefetch(e);
    Features f;
    f.Set("image", e["image"]);
    f.Set("label", e["label"]);
    return f;
  });
  std::filesystem::remove(path);
}

void RegisterCuda() {
  for (const char* m : {"linear", "dnn", "cnn"}) {
    benchmark::RegisterBenchmark((std::string("CudaStep/") + m).c_str(),
                                 CudaStep, std::string(m))
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((std::string("CudaPipeline/") + m).c_str(),
                                 CudaPipeline, std::string(m), true)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(
        (std::string("CudaPipelineUnfused/") + m).c_str(), CudaPipeline,
        std::string(m), false)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
}

BENCHMARK_CAPTURE(Step, linear, std::string("linear"))->UseRealTime();
BENCHMARK_CAPTURE(Gemms, linear, std::string("linear"))->UseRealTime();
BENCHMARK_CAPTURE(Step, dnn, std::string("dnn"))->UseRealTime();
BENCHMARK_CAPTURE(Gemms, dnn, std::string("dnn"))->UseRealTime();
BENCHMARK_CAPTURE(Step, cnn, std::string("cnn"))->UseRealTime();
BENCHMARK_CAPTURE(Gemms, cnn, std::string("cnn"))->UseRealTime();

}  // namespace
}  // namespace recflow::train

// --device cuda[:N] runs the CUDA benchmarks instead of the CPU ones (a
// plain benchmark filter still applies).
int main(int argc, char** argv) {
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--device" && i + 1 < argc) {
      recflow::train::g_device = argv[++i];
    } else if (a.starts_with("--device=")) {
      recflow::train::g_device = std::string(a.substr(9));
    } else {
      args.push_back(argv[i]);
    }
  }
  std::string filter = "--benchmark_filter=^Cuda";
  if (recflow::train::g_device != "cpu") {
    try {
      recflow::train::CudaBackend();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "train_bench: %s\n", e.what());
      return 2;
    }
    recflow::train::RegisterCuda();
    bool has_filter = false;
    for (char* a : args) {
      if (std::string_view(a).starts_with("--benchmark_filter"))
        has_filter = true;
    }
    if (!has_filter) args.push_back(filter.data());
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
