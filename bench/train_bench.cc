// Training throughput per model, next to the same GEMMs called directly
// through Eigen in the same run (the issue's baseline): how much of a step
// is the matrix products, and what the rest (im2col, activations, losses,
// the optimizer, the tape) costs.
//
//   build/bench/train_bench --benchmark_repetitions=3
//   build/bench/train_bench --device cuda   # the CUDA backend (issue: GPU)
//
// On the CPU each benchmark runs at 1, 2 and all threads (/threads:N):
//   Step/<model>: model_fn + backward + Adam; counters split the step by
//     backend call (gemm_conv_%, elementwise_%, pooling_%, optimizer_%,
//     allocation_%; other_% is the tape and model code).
//   StepFromFiles/<model>/threads:N/input_threads:M: Step with its batches
//     read from a TFRecord file through the pipeline as `recflow train`
//     reads them, the pipeline on every core (M = 0) or on M threads; the
//     split adds input_wait_% (the training thread in it.Next()).
//   Gemms/<model>: the step's products as Eigen tensor contractions on a
//     ThreadPoolDevice (the old backend's way); BackendGemms/<model>: the
//     same products through the CPU backend's Gemm.
//   Kernel/<op>/threads:N/n:M: single calls at a size, where splitting a
//     loop over the team starts to pay.
//   Conv/conv<1|2>_<forward|backward>/threads:N: the CNN's convolutions
//     alone, layer by layer (conv1, one channel in: the direct loops;
//     conv2: im2col + product).
//   Overhead/<model>: the step with every kernel call returning at once:
//     the framework's own host work per step (model_fn, tape, optimizer
//     loop, allocation) and the kernel calls a step makes (a GPU step
//     launches one each).
//   Ceiling/<model>/threads:N: N independent one-thread steps at once,
//     what N threads of this machine can give at all (DNN and linear).
//   Product/<eigen|openblas>/shape:S/op:O: one product of the step's
//     shapes on one thread through Eigen and through OpenBLAS (GFLOP/s).
//
// With --device cuda the benchmarks are, per model (batch 128, Adam):
//   CudaStep/<model>: steps on a batch already on the device, 50 steps per
//     iteration and one synchronisation; counters: library_ms (the step's
//     cuBLAS/cuDNN calls replayed alone, same shapes, same run) and
//     library_share (library_ms / step time): what is outside the library
//     kernels is launch and framework overhead.
//   CudaStepGraph/<model>: CudaStep with each step captured into a CUDA
//     graph and launched as one (RunConfig::cuda_graphs); counters
//     graph_launches, graph_instantiations (graphs made anew, not
//     updated) and captures_ended_early, over all its steps.
//   CudaStepNccl/<model>: CudaStep with the gradients all-reduced by NCCL
//     every step, over a one-rank communicator (one GPU: what a launched
//     job of one rank runs); against CudaStep, what the all-reduce's path
//     adds to a step.
//   CudaPipeline/<model>: the same steps fed by the input pipeline from a
//     TFRecord file (shuffle, repeat, batch, parse, prefetch) with the
//     backend's Prefetch copying each batch on its copy stream, the
//     batches delivered in the backend's pinned memory (InputMemory(), as
//     the Estimator asks); with /input_threads:N, the pipeline on N
//     threads instead of one per core (cores - 1: a core left to the
//     training thread; 2); /pageable: the batches in ordinary memory,
//     which Prefetch packs into pinned memory on the training thread;
//     /graphs: each step launched as one CUDA graph; /staged: each batch's
//     copy made on the pipeline's prefetch thread as it is made
//     (Backend::InputStager, the Estimator's default), leaving Prefetch
//     only to take it (counters staged, taken_staged, not_staged and
//     staged_share: batches staged, taken staged by Prefetch, and copied
//     by Prefetch itself; also on CudaPaired's staged variants).
//   CudaPaired/<model>/<nccl|graphs|pipeline|pipeline2|staged>: one of the
//     variants above (pipeline2: the pipeline on 2 threads; pipeline copies
//     in Prefetch on the training thread, staged on the pipeline's thread)
//     against CudaStep in alternating blocks of 50 steps (two backends on
//     one GPU); counter variant_over_plain, the median of the blocks'
//     time ratios, which a shared machine's drift between runs does not
//     move (plain_step_ms and variant_step_ms beside it).
//     graphs_pipeline, graphs_staged and graphs_rotate: both sides with
//     step graphs, the variant fed by the pipeline (copied in Prefetch, or
//     staged), or from three batches on the device in
//     turn (what changes from step to step when the input comes through
//     Prefetch's three slots, without the pipeline or the copies).
//
// Each Step benchmark runs model_fn + backward + Adam update on an
// in-memory batch of 128 Fashion-MNIST-shaped examples (random pixels), so
// it measures compute alone; `recflow train` reports the same with the
// input pipeline in front.  The Gemm benchmarks run exactly the products
// that step runs (forward, dW, dX) on a ThreadPoolDevice of the same size.
#define EIGEN_USE_THREADS
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <random>
#include <string_view>
#include <thread>
#include <unsupported/Eigen/CXX11/Tensor>
#include <utility>

#include "pipeline/dataset.h"
#include "pipeline/process.h"
#include "records/example_builder.h"
#include "records/feature_spec.h"
#include "records/tfrecord_writer.h"
#include "train/canned.h"
#include "train/collective.h"
#include "train/forwarding_backend.h"
#include "train/layers.h"
#include "train/thread_team.h"

namespace recflow::train {
namespace {

constexpr int64_t kBatch = 128;

// As `recflow` does: large step tensors reuse freed memory instead of
// fresh pages from the kernel each step.
const bool kTuned = [] {
  pipeline::TuneAllocatorForBatches();
  return true;
}();
// 1, 2 and every core of this machine (once when they coincide).
std::vector<int> ThreadCounts() {
  const int all = std::max(1u, std::thread::hardware_concurrency());
  std::vector<int> counts{1};
  if (all >= 2) counts.push_back(2);
  if (all > 2) counts.push_back(all);
  return counts;
}
void ThreadArgs(benchmark::internal::Benchmark* b) {
  for (int threads : ThreadCounts()) b->Arg(threads);
  b->ArgName("threads")->UseRealTime();
}

// A Backend that forwards every call to `inner` and, while profiling, adds
// each call's wall time to its category: where a step's time goes.  The
// CPU backend finishes each call before returning, so a call's time is
// its work; what no call accounts for is the tape, the model function and
// the framework ("other").
class ProfilingBackend final : public ForwardingBackend {
 public:
  enum Category { kGemmConv, kElementwise, kPooling, kOptimizer, kAllocation };
  static constexpr int kCategories = 5;
  static constexpr const char* kNames[kCategories] = {
      "gemm_conv", "elementwise", "pooling", "optimizer", "allocation"};

  explicit ProfilingBackend(std::unique_ptr<Backend> inner)
      : ForwardingBackend(std::move(inner)) {}
  void set_profiling(bool on) {
    profiling_ = on;
    if (on) seconds_.fill(0);
  }
  double seconds(int c) const { return seconds_[c]; }
  // Off: every kernel call returns at once (memory is still allocated):
  // what is left of a step is the framework's own host work (Overhead).
  void set_kernels(bool on) { kernels_ = on; }
  // Kernel calls made so far: what a GPU step launches (each a kernel or
  // a library call there).
  uint64_t calls() const { return calls_; }

  template <typename Fn>
  auto Time(Category c, const Fn& fn) {
    if (!profiling_) return fn();
    const auto start = std::chrono::steady_clock::now();
    struct Add {
      double& to;
      std::chrono::steady_clock::time_point start;
      ~Add() {
        to += std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                            start)
                  .count();
      }
    } add{seconds_[c], start};
    return fn();
  }

  Tensor Allocate(DType d, const Shape& s) override {
    return Time(kAllocation, [&] { return ForwardingBackend::Allocate(d, s); });
  }
  Tensor ToDevice(const Tensor& t) override {
    return Time(kElementwise, [&] { return ForwardingBackend::ToDevice(t); });
  }
  void Around(CallKind kind, const Call& call) override {
    ++calls_;
    if (!kernels_) return;
    Time(CategoryOf(kind), call);
  }

 private:
  static Category CategoryOf(CallKind kind) {
    switch (kind) {
      case CallKind::kGemmConv:
        return kGemmConv;
      case CallKind::kPooling:
        return kPooling;
      case CallKind::kOptimizer:
        return kOptimizer;
      case CallKind::kElementwise:
        break;
    }
    return kElementwise;
  }

  bool profiling_ = false;
  bool kernels_ = true;
  uint64_t calls_ = 0;
  std::array<double, kCategories> seconds_{};
};

// What the steps' hooks fetch: nothing (the Estimator's default hooks
// read the loss and the step), so the classifier head computes no
// probabilities or classes, as in `recflow train`.
const std::vector<std::string> kNoFetches;

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

// Training steps of `name`'s model on the CPU backend (behind a
// ProfilingBackend) over one in-memory batch: Step and Overhead.
struct CpuSteps {
  CpuSteps(const std::string& name, int threads)
      : backend(MakeCpuBackend(threads)), fn(Model(name)) {
    labels = f["label"];
    f.components.pop_back();
  }
  void Run() { Run(f, labels); }
  void Run(const Features& batch, const Tensor& batch_labels) {
    ModelContext ctx(backend, vars, metrics, Mode::kTrain, &step, 1);
    ctx.set_fetches(&kNoFetches);
    EstimatorSpec spec = fn(batch, &batch_labels, Mode::kTrain, ctx);
    spec.train_op();
    benchmark::DoNotOptimize(spec.loss.value().raw_data());
  }
  ProfilingBackend backend;
  VariableStore vars{1};
  MetricSet metrics;
  int64_t step = 0;
  Features f = Batch();
  Tensor labels;
  const ModelFn fn;
};

// The split of kProfiledSteps more steps (run_step runs one) into the
// backend's call categories, the input wait (`*input_seconds`, what
// run_step adds to it; null: no input) and the rest, as counters: from
// steps apart from the timed ones, so that the clock reads do not slow
// those.
template <typename RunStep>
void SplitCounters(benchmark::State& state, ProfilingBackend& backend,
                   const RunStep& run_step, const double* input_seconds) {
  constexpr int kProfiledSteps = 20;
  const double input_before = input_seconds ? *input_seconds : 0;
  backend.set_profiling(true);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kProfiledSteps; ++i) run_step();
  const double total =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  backend.set_profiling(false);
  double known = 0;
  for (int c = 0; c < ProfilingBackend::kCategories; ++c) {
    known += backend.seconds(c);
    state.counters[std::string(ProfilingBackend::kNames[c]) + "_%"] =
        100 * backend.seconds(c) / total;
  }
  if (input_seconds) {
    const double input = *input_seconds - input_before;
    known += input;
    state.counters["input_wait_%"] = 100 * input / total;
  }
  state.counters["other_%"] = 100 * std::max(0.0, total - known) / total;
}

void Step(benchmark::State& state, const std::string& name) {
  CpuSteps steps(name, static_cast<int>(state.range(0)));
  steps.Run();  // first-step variable creation and allocator warm-up
  for (auto _ : state) steps.Run();
  state.SetItemsProcessed(state.iterations() * kBatch);
  SplitCounters(
      state, steps.backend, [&] { steps.Run(); }, nullptr);
}

// A file of 8,000 Fashion-MNIST-shaped Examples (random pixels, a label)
// for the benchmarks that read their batches through the pipeline; its
// spec; and that pipeline, as `recflow train` builds it: shuffle(10,000),
// repeat, batch, parse, prefetch(2).
std::string WriteBenchRecords() {
  const std::string path =
      (std::filesystem::temp_directory_path() / "recflow_train_bench.tfrecord")
          .string();
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
  return path;
}
pipeline::Dataset BenchInput(const std::string& path) {
  const records::FeatureSpec spec = records::FeatureSpec::FromJsonText(
      R"({"features": {
        "image": {"kind": "fixed", "dtype": "bytes", "shape": []},
        "label": {"kind": "fixed", "dtype": "int64", "shape": []}}})");
  pipeline::ParseOptions parse;
  parse.num_parallel_calls = pipeline::kAutotune;
  return pipeline::Dataset::FromTFRecords({path})
      .Shuffle(10000, 1)
      .Repeat()
      .Batch(kBatch, true)
      .Parse(spec, parse)
      .Prefetch(2);
}

// Step with its batches read from a TFRecord file through the pipeline,
// as `recflow train` trains: the backend on N threads and, at once, the
// pipeline on every core (/input_threads:0, the Estimator's default) or
// on M threads.  The split adds input_wait_%: the training thread's time
// in it.Next(), waiting for a batch the pipeline has not made yet.
void StepFromFiles(benchmark::State& state, const std::string& name) {
  CpuSteps steps(name, static_cast<int>(state.range(0)));
  const std::string path = WriteBenchRecords();
  pipeline::Iterator it = BenchInput(path).MakeIterator(
      {.threads = static_cast<int>(state.range(1))});
  state.counters["input_threads"] = it.context().threads();
  double input_seconds = 0;
  pipeline::Element e;
  Features f;
  const auto run_step = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    if (!it.Next(&e)) throw Error("the bench's input ended");
    input_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    f.Set("image", e["image"]);
    steps.Run(f, e["label"]);
  };
  run_step();  // variables, allocator and the pipeline's first batches
  input_seconds = 0;
  for (auto _ : state) run_step();
  state.SetItemsProcessed(state.iterations() * kBatch);
  SplitCounters(state, steps.backend, run_step, &input_seconds);
  std::filesystem::remove(path);
}

// The step's own host work, with every kernel call returning at once
// (memory still allocated): model_fn, the tape, the backward pass's
// bookkeeping, the optimizer's loop, allocation.  A GPU step whose kernels
// are short is launch-bound: its host thread pays this plus a launch per
// call (calls_per_step) before the device has work; this part is
// measurable on any CPU.  One thread (the training thread).
void Overhead(benchmark::State& state, const std::string& name) {
  CpuSteps steps(name, 1);
  ProfilingBackend& backend = steps.backend;
  steps.Run();  // variables made and initialised, with the kernels on
  backend.set_kernels(false);
  const uint64_t before = backend.calls();
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) steps.Run();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  const auto calls = static_cast<double>(backend.calls() - before);
  state.counters["calls_per_step"] =
      calls / static_cast<double>(state.iterations());
  state.counters["us_per_call"] = calls > 0 ? seconds / calls * 1e6 : 0;
}

// The ceiling of any split of the step over N threads on this machine: N
// independent one-thread steps of the whole batch at once (own variables,
// own backend), started together each iteration.  items/s over
// Step/<model>/threads:1's is the most N threads can give this model here
// now (cores that share caches, memory bandwidth or, on a VM, a loaded
// host give less than N x): Step/<model>/threads:N's next to it.  Not for
// the CNN: its 13 MB tensors, allocated on a second thread, come from a
// glibc arena that hands them back to the kernel every step (page faults
// the training thread, the main arena, never pays; with MALLOC_ARENA_MAX=1
// two CNN steps at once take 1.01x one).
void Ceiling(benchmark::State& state, const std::string& name) {
  const int threads = static_cast<int>(state.range(0));
  struct Worker {
    std::unique_ptr<Backend> backend = MakeCpuBackend(1);
    VariableStore vars{1};
    MetricSet metrics;
    int64_t step = 0;
  };
  std::vector<Worker> workers(static_cast<size_t>(threads));
  Features f = Batch();
  const Tensor labels = f["label"];
  f.components.pop_back();
  const ModelFn fn = Model(name);
  ThreadTeam team(threads);
  auto all_step = [&] {
    team.Run(threads, [&](int64_t t) {
      Worker& w = workers[static_cast<size_t>(t)];
      ModelContext ctx(*w.backend, w.vars, w.metrics, Mode::kTrain, &w.step, 1);
      ctx.set_fetches(&kNoFetches);
      EstimatorSpec spec = fn(f, &labels, Mode::kTrain, ctx);
      spec.train_op();
      benchmark::DoNotOptimize(spec.loss.value().data<float>()[0]);
    });
  };
  all_step();
  for (auto _ : state) all_step();
  state.SetItemsProcessed(state.iterations() * kBatch * threads);
}

// ThreadArgs, each with the pipeline on every core (0) and on one thread.
void ThreadAndInputArgs(benchmark::internal::Benchmark* b) {
  for (int threads : ThreadCounts()) b->Args({threads, 0})->Args({threads, 1});
  b->ArgNames({"threads", "input_threads"})->UseRealTime();
}

// ThreadArgs but 1 (one independent step is Step/<model>/threads:1).
void CeilingArgs(benchmark::internal::Benchmark* b) {
  for (int threads : ThreadCounts()) {
    if (threads > 1) b->Arg(threads);
  }
  b->ArgName("threads")->UseRealTime();
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
  const int threads = static_cast<int>(state.range(0));
  Eigen::ThreadPool pool(threads);
  Eigen::ThreadPoolDevice device(&pool, threads);
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

// The same products through the CPU backend's Gemm (blocks of the output
// on its thread team): what the step's products cost on their own.
void BackendGemms(benchmark::State& state, const std::string& name) {
  auto backend = MakeCpuBackend(static_cast<int>(state.range(0)));
  struct Operands {
    GemmShape s;
    std::vector<float> a, b, c;
  };
  std::vector<Operands> ops;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (const GemmShape& s : StepGemms(name)) {
    Operands o{s, std::vector<float>(s.m * s.k), std::vector<float>(s.k * s.n),
               std::vector<float>(s.m * s.n)};
    for (float& v : o.a) v = u(rng);
    for (float& v : o.b) v = u(rng);
    ops.push_back(std::move(o));
  }
  for (auto _ : state) {
    for (Operands& o : ops) {
      backend->Gemm(o.s.ta, o.s.tb, o.s.m, o.s.n, o.s.k, 1.0f, o.a.data(),
                    o.b.data(), 0.0f, o.c.data());
      benchmark::DoNotOptimize(o.c.data());
    }
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}

// Single backend calls at a size, 1 and 2 threads: where splitting a loop
// over the team starts to pay (the thresholds in cpu_backend.cc).
void Kernel(benchmark::State& state, const std::string& kind) {
  const int threads = static_cast<int>(state.range(0));
  const int64_t n = state.range(1);
  auto backend = MakeCpuBackend(threads);
  std::vector<float> a(n, 0.5f), b(n, 0.25f), c(n, 0.125f), d(n, 1.0f);
  for (auto _ : state) {
    if (kind == "adam") {
      backend->AdamUpdate(n, 1e-3f, 0.9f, 0.999f, 1e-7f, a.data(), b.data(),
                          c.data(), d.data());
    } else if (kind == "axpby") {
      backend->Axpby(n, 1.0f, a.data(), 1.0f, b.data());
    } else {
      backend->BiasActivationBackward(n / 128, 128, Activation::kRelu, a.data(),
                                      b.data(), c.data(), d.data());
    }
    benchmark::DoNotOptimize(b.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}
void KernelArgs(benchmark::internal::Benchmark* b) {
  for (int64_t n : {1 << 12, 1 << 14, 1 << 16, 1 << 18}) {
    b->Args({1, n});
    b->Args({2, n});
  }
  b->ArgNames({"threads", "n"})->UseRealTime();
}
BENCHMARK_CAPTURE(Kernel, adam, std::string("adam"))->Apply(KernelArgs);
BENCHMARK_CAPTURE(Kernel, axpby, std::string("axpby"))->Apply(KernelArgs);
BENCHMARK_CAPTURE(Kernel, bias_relu_grad, std::string("bias_relu_grad"))
    ->Apply(KernelArgs);

// The canned CNN's two convolutions (3x3 SAME, batch 128), forward and
// backward (dW, and dX for the second: the first layer's input needs no
// gradient), on the CPU backend: where a CNN step's convolution time goes.
void Conv(benchmark::State& state, int layer, bool backward) {
  const int threads = static_cast<int>(state.range(0));
  auto backend = MakeCpuBackend(threads);
  Window2D g;
  g.batch = kBatch;
  g.in_h = g.in_w = layer == 1 ? 28 : 14;
  g.in_c = layer == 1 ? 1 : 32;
  g.out_c = layer == 1 ? 32 : 64;
  g.window_h = g.window_w = 3;
  g.padding = Padding::kSame;
  g.Resolve();
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  auto random = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& f : v) f = u(rng);
    return v;
  };
  const auto x = random(g.batch * g.in_h * g.in_w * g.in_c);
  const auto w = random(9 * g.in_c * g.out_c);
  auto y = random(g.batch * g.out_h * g.out_w * g.out_c);
  std::vector<float> dx(x.size()), dw(w.size());
  for (auto _ : state) {
    if (backward) {
      backend->Conv2DBackward(g, x.data(), w.data(), y.data(),
                              layer == 1 ? nullptr : dx.data(), dw.data());
    } else {
      backend->Conv2D(g, x.data(), w.data(), y.data());
    }
    benchmark::DoNotOptimize(dw.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}
void ConvArgs(benchmark::internal::Benchmark* b) {
  b->Arg(1)->Arg(2)->ArgName("threads")->UseRealTime()->Unit(
      benchmark::kMicrosecond);
}
BENCHMARK_CAPTURE(Conv, conv1_forward, 1, false)->Apply(ConvArgs);
BENCHMARK_CAPTURE(Conv, conv1_backward, 1, true)->Apply(ConvArgs);
BENCHMARK_CAPTURE(Conv, conv2_forward, 2, false)->Apply(ConvArgs);
BENCHMARK_CAPTURE(Conv, conv2_backward, 2, true)->Apply(ConvArgs);

// One thread, one product, two libraries: Eigen's GEBP kernels (what the
// CPU backend's products were until 2026-11-24) against OpenBLAS's sgemm
// (what they are now), on the step's shapes.  state.range(0) picks the
// shape, range(1) the operation: 0 y = x W (NN), 1 dW = x^T dy (TN),
// 2 dx = dy W^T (NT); counter GFLOP/s.
struct ProductShape {
  int64_t m, k, n;  // x [m, k], W [k, n]
};
constexpr ProductShape kProductShapes[] = {
    {128, 784, 256},  // DNN layer 1
    {128, 256, 128},  // DNN layer 2
    {3136, 288, 64},  // CNN conv2, im2col of 16 images
    {128, 3136, 128}  // CNN dense
};

void Product(benchmark::State& state, bool openblas) {
  const ProductShape s = kProductShapes[state.range(0)];
  const int op = static_cast<int>(state.range(1));
  using Matrix =
      Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Matrix x = Matrix::Random(s.m, s.k), w = Matrix::Random(s.k, s.n),
               dy = Matrix::Random(s.m, s.n);
  Matrix out(op == 1 ? s.k : s.m, op == 2 ? s.k : s.n);
  const auto m = static_cast<int>(s.m), k = static_cast<int>(s.k),
             n = static_cast<int>(s.n);
  // One thread, as the CPU backend sets it (and only when not already:
  // asking again restarts the pool the backend shut down).
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
  for (auto _ : state) {
    if (!openblas) {
      if (op == 0) out.noalias() = x * w;
      if (op == 1) out.noalias() = x.transpose() * dy;
      if (op == 2) out.noalias() = dy * w.transpose();
    } else if (op == 0) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f,
                  x.data(), k, w.data(), n, 0.0f, out.data(), n);
    } else if (op == 1) {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, k, n, m, 1.0f,
                  x.data(), k, dy.data(), n, 0.0f, out.data(), n);
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, k, n, 1.0f,
                  dy.data(), n, w.data(), n, 0.0f, out.data(), k);
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * s.m * s.k * s.n * static_cast<double>(state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
}

void ProductArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"shape", "op"});
  for (int64_t shape = 0; shape < 4; ++shape) {
    for (int64_t op = 0; op < 3; ++op) b->Args({shape, op});
  }
}
BENCHMARK_CAPTURE(Product, eigen, false)->Apply(ProductArgs);
BENCHMARK_CAPTURE(Product, openblas, true)->Apply(ProductArgs);

// ---- CUDA ------------------------------------------------------------------

std::string g_device = "cpu";

std::shared_ptr<Backend> CudaBackend() {
  static std::shared_ptr<Backend> backend =
      MakeBackend(ParseDevice(g_device == "cpu" ? "cuda" : g_device));
  return backend;
}

constexpr int kStepsPerIteration = 50;

// A launched job of one rank, without MPI: the gradients take the
// all-reduce's path (NCCL's on the GPU) and stay as they are.
class OneRankWorld final : public Collective {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::string name() const override { return "one rank"; }
  bool launched() const override { return true; }
  void AllReduce(std::span<float>, ReduceOp) override {}
  void AllReduce(std::span<double>, ReduceOp) override {}
  void AllReduce(std::span<int64_t>, ReduceOp) override {}
  void Broadcast(std::string&, int) override {}
  void Barrier() override {}
  void Abort(int code) override { std::exit(code); }
};

// One model's training steps on one backend, as the Estimator runs them:
// `world` null, or the world whose all-reduce every step runs; `graphs`:
// each step bracketed by BeginStep/EndStep with step graphs on
// (RunConfig::cuda_graphs).
class CudaStepper {
 public:
  CudaStepper(Backend& be, const std::string& name, Collective* world,
              bool graphs)
      : be_(be), vars_(1, &be), fn_(Model(name)), world_(world) {
    be_.SetStepGraphs(graphs);
  }
  ~CudaStepper() { be_.SetStepGraphs(false); }
  CudaStepper(const CudaStepper&) = delete;
  CudaStepper& operator=(const CudaStepper&) = delete;

  // The launching thread's seconds in each part of the steps: taking the
  // batch (next_batch: the pipeline's Next and Prefetch, where it has
  // them), BeginStep, building the step (model_fn and train_op: its calls
  // launched or captured), EndStep (a graph's end of capture, update and
  // launch), and letting the step's tensors go.
  struct StepTimes {
    double input = 0, begin = 0, build = 0, end = 0, drop = 0;
    double launch() const { return begin + build + end; }
  };
  // One step on `next_batch()`'s batch, queued (no synchronisation).
  template <typename NextBatch>
  void Step(NextBatch& next_batch) {
    using Clock = std::chrono::steady_clock;
    const auto add = [](double& to, Clock::time_point from) {
      const Clock::time_point now = Clock::now();
      to += std::chrono::duration<double>(now - from).count();
      return now;
    };
    Clock::time_point t = Clock::now();
    {
      Features f = next_batch();
      const Tensor labels = f["label"];
      f.components.erase(f.components.begin() + 1);
      t = add(times_.input, t);
      be_.BeginStep();
      t = add(times_.begin, t);
      ModelContext ctx(be_, vars_, metrics_, Mode::kTrain, &step_, 1, world_);
      ctx.set_fetches(&kNoFetches);
      EstimatorSpec spec = fn_(f, &labels, Mode::kTrain, ctx);
      spec.train_op();
      t = add(times_.build, t);
      be_.EndStep();
      t = add(times_.end, t);
    }
    add(times_.drop, t);
  }
  // The times since the last call.
  StepTimes TakeTimes() { return std::exchange(times_, StepTimes{}); }
  // `steps` steps and one synchronisation: their seconds.
  template <typename NextBatch>
  double Run(int steps, NextBatch& next_batch) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) Step(next_batch);
    be_.Synchronize();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                         start)
        .count();
  }

 private:
  Backend& be_;
  VariableStore vars_;
  MetricSet metrics_;
  int64_t step_ = 0;
  ModelFn fn_;
  Collective* world_;
  StepTimes times_;
};

// A CudaStepper's times as counters `<prefix><part>_us` a step, and
// `<prefix>launch_share`: BeginStep to EndStep's share of the `seconds`
// the steps took (near 1: the device waits on the launching thread).
void TimesCounters(benchmark::State& state, const std::string& prefix,
                   const CudaStepper::StepTimes& t, double seconds,
                   int64_t steps) {
  const double n = static_cast<double>(std::max<int64_t>(steps, 1));
  state.counters[prefix + "input_us"] = t.input / n * 1e6;
  state.counters[prefix + "begin_us"] = t.begin / n * 1e6;
  state.counters[prefix + "build_us"] = t.build / n * 1e6;
  state.counters[prefix + "end_us"] = t.end / n * 1e6;
  state.counters[prefix + "drop_us"] = t.drop / n * 1e6;
  state.counters[prefix + "launch_share"] =
      t.launch() / std::max(seconds, 1e-12);
}
// EndStep's graph calls between two of a backend's stats, us a launch.
void GraphCallCounters(benchmark::State& state, const std::string& prefix,
                       const Backend::StepGraphStats& before,
                       const Backend::StepGraphStats& after) {
  const double n = static_cast<double>(
      std::max<uint64_t>(after.launches - before.launches, 1));
  state.counters[prefix + "end_capture_us"] =
      (after.end_capture_seconds - before.end_capture_seconds) / n * 1e6;
  state.counters[prefix + "update_us"] =
      (after.update_seconds - before.update_seconds) / n * 1e6;
  state.counters[prefix + "graph_launch_us"] =
      (after.launch_seconds - before.launch_seconds) / n * 1e6;
  state.counters[prefix + "graph_nodes"] = static_cast<double>(after.nodes);
}

// Runs kStepsPerIteration steps per iteration on `next_batch`'s batches
// and synchronises once; reports manual time.  `world` and `graphs` as
// CudaStepper's.
template <typename NextBatch>
void RunCudaSteps(benchmark::State& state, const std::string& name,
                  NextBatch next_batch, Collective* world = nullptr,
                  bool graphs = false) {
  Backend& be = *CudaBackend();
  const Backend::StepGraphStats graphs_before = be.step_graph_stats();
  double seconds = 0;
  CudaStepper stepper(be, name, world, graphs);
  stepper.Run(20, next_batch);  // plans, allocator, warm-up
  stepper.TakeTimes();
  for (auto _ : state) {
    const double s = stepper.Run(kStepsPerIteration, next_batch);
    state.SetIterationTime(s);
    seconds += s;
  }
  const double per_step = seconds / (state.iterations() * kStepsPerIteration);
  TimesCounters(state, "", stepper.TakeTimes(), seconds,
                state.iterations() * kStepsPerIteration);
  if (graphs) {
    const Backend::StepGraphStats g = be.step_graph_stats();
    // Of all the steps run (warm-up included): launched as one graph, and
    // graphs made anew rather than updated.
    state.counters["graph_launches"] =
        static_cast<double>(g.launches - graphs_before.launches);
    state.counters["graph_instantiations"] =
        static_cast<double>(g.instantiations - graphs_before.instantiations);
    state.counters["captures_ended_early"] =
        static_cast<double>(g.ended_early - graphs_before.ended_early);
    GraphCallCounters(state, "", graphs_before, g);
  }
  // One more step, call by call, its library calls logged.
  be.SetStepGraphs(false);
  be.StartCallLog();
  stepper.Step(next_batch);
  be.StopCallLog();
  if (auto library = be.TimeCallLog(200)) {
    state.counters["library_ms"] = *library * 1e3;
    state.counters["library_share"] = *library / per_step;
  }
  state.counters["step_ms"] = per_step * 1e3;
  state.SetItemsProcessed(state.iterations() * kStepsPerIteration * kBatch);
  state.SetLabel(be.device_name());
}

// A batch already on `be`'s device: the image as uint8 rows, the label.
Features DeviceBatch(Backend& be) {
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
  return f;
}

// The step on a batch already on the device.  `nccl`: every step's
// gradients through NCCL (CudaStepNccl); `graphs`: each step launched as
// one CUDA graph (CudaStepGraph).
void CudaStep(benchmark::State& state, const std::string& name, bool nccl,
              bool graphs) {
  Backend& be = *CudaBackend();
  const Features f = DeviceBatch(be);
  if (!nccl) {
    RunCudaSteps(
        state, name, [&] { return f; }, nullptr, graphs);
    return;
  }
  if (!NcclBuilt()) {
    state.SkipWithError("this build has no NCCL (nccl.h, libnccl)");
    return;
  }
  // The backend keeps the communicator of the first world it sums over.
  static OneRankWorld world;
  RunCudaSteps(
      state, name, [&] { return f; }, &world);
}

// Batches the backend's InputStager staged, and of those Prefetch took
// staged, as shares of the batches Prefetch was given: what shows that
// the copies ran on the pipeline's thread.
// Since `before` (the backend's stats when the benchmark began).
void StagedCounters(benchmark::State& state, const Backend& be,
                    const Backend::InputStats& before = {}) {
  const Backend::InputStats now = be.input_stats();
  const double staged = static_cast<double>(now.staged - before.staged);
  const double taken = static_cast<double>(now.taken - before.taken);
  const double unstaged = static_cast<double>(now.unstaged - before.unstaged);
  state.counters["staged"] = staged;
  state.counters["taken_staged"] = taken;
  state.counters["not_staged"] = unstaged;
  if (taken + unstaged > 0) {
    state.counters["staged_share"] = taken / (taken + unstaged);
  }
}

// A variant of the step against the plain step (call by call, batch on
// the device), in alternating blocks of kStepsPerIteration steps on two
// backends of the same GPU: `nccl` (gradients through a one-rank NCCL
// communicator), `graphs` (step graphs) or `pipeline` (batches from
// TFRecord files through the fused pipeline into pinned memory, copied
// by Prefetch; `pipeline2`: the same on 2 input threads instead of one
// per core, which leaves the cores to the thread that launches the
// kernels: whether the input's threads slow that thread; `staged`: copied
// on the pipeline's thread, InputStager; `in_place`: read where the
// pipeline made them, SetInputInPlace; `rotate`, `busy`, `busy_staged`:
// below).  A shared machine's
// drift (25% between two calls of CudaStep, docs/PERFORMANCE.md) hits both
// blocks of a pair alike, so the ratio is the median of the pairs'
// (`variant_over_plain`: the variant's time over the plain step's; 1.05 is 5%
// slower), not of two runs apart.
void CudaPaired(benchmark::State& state, const std::string& name,
                const std::string& variant, int input_threads) {
  // graphs_<input>: step graphs on both sides, <input> on the variant's.
  const bool both_graphs = variant.starts_with("graphs_");
  const std::string input = both_graphs ? variant.substr(7) : variant;
  Backend& plain_be = *CudaBackend();
  if (variant == "nccl" && !NcclBuilt()) {
    state.SkipWithError("this build has no NCCL (nccl.h, libnccl)");
    return;
  }
  const std::unique_ptr<Backend> other =
      MakeBackend(ParseDevice(g_device == "cpu" ? "cuda" : g_device));
  const Features on_plain = DeviceBatch(plain_be);
  const std::vector<Features> on_other = {
      DeviceBatch(*other), DeviceBatch(*other), DeviceBatch(*other)};
  // rotate: three batches on the device in turn (the step's input
  // addresses change, as the pipeline's do, and nothing else).
  size_t turn = 0;
  std::function<Features()> plain_batch = [&] { return on_plain; };
  std::function<Features()> variant_batch = [&] {
    return on_other[input == "rotate" ? turn++ % on_other.size() : 0];
  };
  std::string path;
  std::optional<pipeline::Iterator> it;
  // busy, busy_staged: the pipeline's batches taken (and, staged, given
  // to Prefetch) as for `pipeline` and `staged`, but the steps train on a
  // batch already on the device: what the input's work beside and before
  // the step costs it, apart from the step reading the batch it staged.
  const bool busy = input == "busy" || input == "busy_staged";
  const bool staged = input == "staged" || input == "busy_staged";
  // in_place: the pipeline's batches read by the step where they are
  // (Backend::SetInputInPlace), nothing staged.
  const bool in_place = input == "in_place";
  other->SetInputInPlace(in_place);
  if (input == "pipeline" || input == "pipeline2" || staged || busy ||
      in_place) {
    path = WriteBenchRecords();
    it.emplace(BenchInput(path).MakeIterator(
        {.threads = input == "pipeline2" ? 2 : input_threads,
         .output_memory = other->InputMemory(),
         .prepare = staged ? other->InputStager() : nullptr,
         .prefetch_polls = true}));  // as the Estimator's on a GPU
    // One element for every batch, as the Estimator's loop keeps (a take
    // gives the batch it replaces back to the Prefetch's driver).
    variant_batch = [&, e = pipeline::Element()]() mutable {
      it->Next(&e);
      if (!busy || staged) other->Prefetch(e);  // as the Estimator does
      if (busy) return on_other[0];
      Features f;
      f.Set("image", e["image"]);
      f.Set("label", e["label"]);
      return f;
    };
  }
  OneRankWorld world;
  {
    CudaStepper plain(plain_be, name, nullptr, both_graphs);
    CudaStepper varied(*other, name, variant == "nccl" ? &world : nullptr,
                       both_graphs || variant == "graphs");
    plain.Run(20, plain_batch);
    varied.Run(20, variant_batch);
    plain.TakeTimes();
    varied.TakeTimes();
    const Backend::StepGraphStats plain_graphs = plain_be.step_graph_stats();
    const Backend::StepGraphStats variant_graphs = other->step_graph_stats();
    // The variant's takes that woke its Prefetch's driver (a system call
    // on the launching thread; StageStats::wakes), over the timed steps.
    const auto input_wakes = [&] {
      uint64_t wakes = 0;
      if (it) {
        for (const pipeline::StageStats& s : it->Stats()) wakes += s.wakes;
      }
      return wakes;
    };
    const uint64_t wakes_before = input_wakes();
    std::vector<double> ratios;
    double plain_seconds = 0, variant_seconds = 0;
    for (auto _ : state) {
      const double a = plain.Run(kStepsPerIteration, plain_batch);
      const double b = varied.Run(kStepsPerIteration, variant_batch);
      state.SetIterationTime(a + b);
      ratios.push_back(b / a);
      plain_seconds += a;
      variant_seconds += b;
    }
    std::sort(ratios.begin(), ratios.end());
    const double steps =
        static_cast<double>(state.iterations()) * kStepsPerIteration;
    state.counters["variant_over_plain"] = ratios[ratios.size() / 2];
    state.counters["plain_step_ms"] = plain_seconds / steps * 1e3;
    state.counters["variant_step_ms"] = variant_seconds / steps * 1e3;
    if (it) {
      state.counters["variant_wakes_per_step"] =
          static_cast<double>(input_wakes() - wakes_before) / steps;
    }
    // Where each side's launching thread spent its steps (RunCudaSteps').
    const auto n = static_cast<int64_t>(steps);
    TimesCounters(state, "plain_", plain.TakeTimes(), plain_seconds, n);
    TimesCounters(state, "variant_", varied.TakeTimes(), variant_seconds, n);
    if (both_graphs || variant == "graphs") {
      GraphCallCounters(state, "plain_", plain_graphs,
                        plain_be.step_graph_stats());
      GraphCallCounters(state, "variant_", variant_graphs,
                        other->step_graph_stats());
    }
  }
  // Both sides' convolution algorithms: each backend measured its own
  // (cudnnFind), and where they chose differently the CNN's ratio
  // compares the algorithms too (RECFLOW_CUDNN_AUTOTUNE=0: cuDNN's
  // heuristics', the same on both).  The plain backend is shared by the
  // benchmarks, so it may hold other models' shapes too: compared are the
  // variant's shapes.
  const std::vector<std::string> plain_convs = plain_be.ConvolutionChoices();
  std::vector<std::string> differ;
  for (const std::string& c : other->ConvolutionChoices()) {
    if (std::find(plain_convs.begin(), plain_convs.end(), c) ==
        plain_convs.end()) {
      differ.push_back(c);
    }
  }
  state.counters["convs_differ"] = differ.empty() ? 0 : 1;
  if (!differ.empty()) {
    fmt::print(
        stderr, "{}/{}: the variant's convolutions [{}], the plain's [{}]\n",
        name, variant, fmt::join(differ, "; "), fmt::join(plain_convs, "; "));
  }
  if (staged) StagedCounters(state, *other);
  if (in_place) {
    // Of the batches Prefetch was given, those read in place.
    state.counters["in_place"] =
        static_cast<double>(other->input_stats().in_place);
  }
  it.reset();
  if (!path.empty()) std::filesystem::remove(path);
  state.SetItemsProcessed(state.iterations() * 2 * kStepsPerIteration * kBatch);
  state.SetLabel(plain_be.device_name());
}

// The same steps from a TFRecord file through the pipeline.
// `input_threads`: the pipeline's threads (0: one per core, as the
// Estimator's default).
void CudaPipeline(benchmark::State& state, const std::string& name, bool fused,
                  int input_threads, bool pinned_input, bool graphs,
                  bool staged) {
  Backend& be = *CudaBackend();
  const std::string path = WriteBenchRecords();
  const Backend::InputStats before = be.input_stats();
  pipeline::Iterator it = BenchInput(path).MakeIterator(
      {.threads = input_threads,
       .optimize = fused,
       .output_memory = pinned_input ? be.InputMemory() : nullptr,
       .prepare = staged ? be.InputStager() : nullptr,
       .prefetch_polls = true});  // as the Estimator's on a GPU
  state.counters["input_threads"] = it.context().threads();
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
  // What the timed steps themselves spend on the training thread waiting
  // for the next batch and staging it, per step: whether the input keeps
  // up while the device computes (the alone-figures above are its rate
  // when nothing else runs).
  double next_seconds = 0;
  double prefetch_seconds = 0;
  int64_t batches = 0;
  RunCudaSteps(
      state, name,
      // One element for every batch, as the Estimator's loop keeps.
      [&, e = pipeline::Element()]() mutable {
        const auto t0 = std::chrono::steady_clock::now();
        it.Next(&e);
        const auto t1 = std::chrono::steady_clock::now();
        // As the Estimator does: start the copy, then build the step.
        be.Prefetch(e);
        const auto t2 = std::chrono::steady_clock::now();
        next_seconds += std::chrono::duration<double>(t1 - t0).count();
        prefetch_seconds += std::chrono::duration<double>(t2 - t1).count();
        ++batches;
        Features f;
        f.Set("image", e["image"]);
        f.Set("label", e["label"]);
        return f;
      },
      nullptr, graphs);
  if (batches > 0) {
    state.counters["next_in_step_us"] = next_seconds / batches * 1e6;
    state.counters["prefetch_in_step_us"] = prefetch_seconds / batches * 1e6;
  }
  if (staged) StagedCounters(state, be, before);
  std::filesystem::remove(path);
}

void RegisterCuda() {
  const auto add = [](const std::string& name, auto fn, auto... args) {
    benchmark::RegisterBenchmark(name.c_str(), fn, args...)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  };
  for (const char* c : {"linear", "dnn", "cnn"}) {
    const std::string m = c;
    add("CudaStep/" + m, CudaStep, m, false, false);
    add("CudaStepGraph/" + m, CudaStep, m, false, true);
    add("CudaStepNccl/" + m, CudaStep, m, true, false);
    add("CudaPipeline/" + m, CudaPipeline, m, true, 0, true, false, false);
    add("CudaPipeline/" + m + "/staged", CudaPipeline, m, true, 0, true, false,
        true);
    add("CudaPipeline/" + m + "/pageable", CudaPipeline, m, true, 0, false,
        false, false);
    add("CudaPipeline/" + m + "/graphs", CudaPipeline, m, true, 0, true, true,
        false);
    add("CudaPipeline/" + m + "/graphs_staged", CudaPipeline, m, true, 0, true,
        true, true);
    add("CudaPipelineUnfused/" + m, CudaPipeline, m, false, 0, true, false,
        false);
    for (const char* variant :
         {"nccl", "graphs", "pipeline", "pipeline2", "staged",
          "graphs_pipeline", "graphs_staged", "graphs_rotate", "graphs_busy",
          "graphs_busy_staged", "in_place", "graphs_in_place"}) {
      add("CudaPaired/" + m + "/" + variant, CudaPaired, m,
          std::string(variant), 0);
    }
    // Staged with fewer input threads than cores: whether the input's
    // threads take time from the thread that launches the steps.
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    for (int threads : {cores - 1, 4}) {
      if (threads < 1 || threads >= cores) continue;
      for (const char* variant : {"staged", "graphs_staged"}) {
        add(fmt::format("CudaPaired/{}/{}/threads:{}", m, variant, threads),
            CudaPaired, m, std::string(variant), threads);
      }
    }
    // One input thread per core and the training thread make one thread
    // more than cores: while the input refills its prefetch buffer it can
    // take the core of the thread that launches the GPU's work.  The same
    // with a core left to that thread, and with 2 input threads.
    for (int threads : {cores - 1, 2}) {
      if (threads < 1 || threads >= cores) continue;
      add(fmt::format("CudaPipeline/{}/input_threads:{}", m, threads),
          CudaPipeline, m, true, threads, true, false, false);
    }
  }
}

BENCHMARK_CAPTURE(Overhead, linear, std::string("linear"));
BENCHMARK_CAPTURE(Overhead, dnn, std::string("dnn"));
BENCHMARK_CAPTURE(Overhead, cnn, std::string("cnn"));
BENCHMARK_CAPTURE(Step, linear, std::string("linear"))->Apply(ThreadArgs);
BENCHMARK_CAPTURE(Ceiling, linear, std::string("linear"))->Apply(CeilingArgs);
BENCHMARK_CAPTURE(Gemms, linear, std::string("linear"))->Apply(ThreadArgs);
BENCHMARK_CAPTURE(BackendGemms, linear, std::string("linear"))
    ->Apply(ThreadArgs);
BENCHMARK_CAPTURE(Step, dnn, std::string("dnn"))->Apply(ThreadArgs);
BENCHMARK_CAPTURE(StepFromFiles, dnn, std::string("dnn"))
    ->Apply(ThreadAndInputArgs);
BENCHMARK_CAPTURE(Ceiling, dnn, std::string("dnn"))->Apply(CeilingArgs);
BENCHMARK_CAPTURE(Gemms, dnn, std::string("dnn"))->Apply(ThreadArgs);
BENCHMARK_CAPTURE(BackendGemms, dnn, std::string("dnn"))->Apply(ThreadArgs);
BENCHMARK_CAPTURE(Step, cnn, std::string("cnn"))->Apply(ThreadArgs);
BENCHMARK_CAPTURE(StepFromFiles, cnn, std::string("cnn"))
    ->Apply(ThreadAndInputArgs);
BENCHMARK_CAPTURE(Gemms, cnn, std::string("cnn"))->Apply(ThreadArgs);
BENCHMARK_CAPTURE(BackendGemms, cnn, std::string("cnn"))->Apply(ThreadArgs);

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
  // The products' library and the kernels it chose for this CPU, in the
  // report's header: a per-core rate far from another machine's is read
  // against it first.
  benchmark::AddCustomContext("cpu_backend",
                              recflow::train::MakeCpuBackend(1)->name());
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
