// What the CUDA calls on the input path cost the thread that launches a
// step (built with the CUDA backend; run on a GPU):
//
//   PointerAttributes/<pinned|pageable>: cudaPointerGetAttributes, which
//     the backend used to ask for every tensor of every batch, next to
//   AllocatorOwns: the pinned allocator's own lookup that replaced it.
//   EventRecord, StreamWaitEvent, EventSynchronizeDone (an event already
//     reached), MemcpyPinned/<bytes> (issuing an asynchronous copy from
//     pinned memory: a Fashion-MNIST batch's labels and its uint8 images).
//   Prefetch/<image_label|image>/<to_device|alone>: Backend::Prefetch of a
//     batch already in InputMemory() (128 uint8 images of 784 bytes, and
//     their int64 labels) and the step's ToDevice calls that take them
//     (to_device), or Prefetch alone: what the training thread pays per
//     step for input that arrives as the Estimator asks.  On the H200
//     (2026-11-26) image_label/to_device took 13.2 us where the calls it
//     makes, priced above, add up to ~6: the variants split the rest.
//   Prefetch/image_label/staged/<beside|before>: the same with the batch
//     staged first by InputStager, on a second thread beside this one or
//     before each call on this one (PrefetchStaged below).
//
// Each reports the CPU time of the call alone (manual time); the stream
// is drained outside the timed part, so the copies never queue up.  The
// DNN's step is ~150 us on an H200 (docs/PERFORMANCE.md): every 1.5 us
// on this path is 1% of its input-fed throughput.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "pipeline/tensor.h"
#include "train/backend.h"
#include "train/cuda_allocator.h"

namespace recflow::train {
namespace {

using Clock = std::chrono::steady_clock;

bool HaveGpu(benchmark::State& state) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    state.SkipWithError("no CUDA device on this machine");
    return false;
  }
  return true;
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Times `call` alone, `per_sync` calls between drains of `stream`.
template <typename F>
void TimeCalls(benchmark::State& state, cudaStream_t stream, F call,
               int per_sync = 32) {
  int since_sync = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    call();
    const auto t1 = Clock::now();
    state.SetIterationTime(Seconds(t0, t1));
    if (++since_sync == per_sync) {
      cudaStreamSynchronize(stream);
      since_sync = 0;
    }
  }
  cudaStreamSynchronize(stream);
}

void PointerAttributes(benchmark::State& state, bool pinned) {
  if (!HaveGpu(state)) return;
  void* p = nullptr;
  std::vector<char> pageable(1 << 20);
  if (pinned) {
    cudaHostAlloc(&p, 1 << 20, cudaHostAllocPortable);
  } else {
    p = pageable.data();
  }
  int host = 0;
  TimeCalls(state, nullptr, [&] {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, static_cast<char*>(p) + 4096) !=
        cudaSuccess) {
      cudaGetLastError();
    }
    host += a.type == cudaMemoryTypeHost;
  });
  benchmark::DoNotOptimize(host);
  if (pinned) cudaFreeHost(p);
}

void AllocatorOwns(benchmark::State& state) {
  if (!HaveGpu(state)) return;
  cuda::CachingAllocator pinned(pipeline::MemoryKind::kPinnedHost, 0);
  // As many blocks as a pipeline's batches in flight hold, and more.
  std::vector<void*> blocks;
  for (int i = 0; i < 64; ++i) blocks.push_back(pinned.Allocate(100352));
  int owned = 0;
  size_t i = 0;
  TimeCalls(state, nullptr, [&] {
    owned += pinned.Owns(static_cast<char*>(blocks[i++ % blocks.size()]) + 7);
  });
  benchmark::DoNotOptimize(owned);
  for (void* p : blocks) pinned.Deallocate(p, 100352);
}

void EventCalls(benchmark::State& state, int which) {
  if (!HaveGpu(state)) return;
  cudaStream_t a = nullptr, b = nullptr;
  cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
  cudaEvent_t e = nullptr;
  cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  cudaEventRecord(e, a);
  cudaStreamSynchronize(a);
  TimeCalls(state, a, [&] {
    switch (which) {
      case 0:
        cudaEventRecord(e, a);
        break;
      case 1:
        cudaStreamWaitEvent(b, e, 0);
        break;
      default:
        cudaEventSynchronize(e);
    }
  });
  cudaStreamSynchronize(b);
  cudaEventDestroy(e);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

void MemcpyPinned(benchmark::State& state) {
  if (!HaveGpu(state)) return;
  const auto bytes = static_cast<size_t>(state.range(0));
  void* host = nullptr;
  void* device = nullptr;
  cudaHostAlloc(&host, bytes, cudaHostAllocPortable);
  cudaMalloc(&device, bytes);
  cudaStream_t s = nullptr;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  TimeCalls(
      state, s,
      [&] { cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, s); },
      8);
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
  cudaStreamDestroy(s);
  cudaFree(device);
  cudaFreeHost(host);
}

// Eight Fashion-MNIST-shaped batches (128 uint8 images of 784 bytes and,
// with_label, their int64 labels) in the backend's InputMemory(), each in
// blocks of its own, as the pipeline delivers them; cycled by the callers.
std::vector<pipeline::Element> PinnedBatches(Backend& be, bool with_label) {
  const std::shared_ptr<pipeline::Allocator> pinned = be.InputMemory();
  std::vector<pipeline::Element> batches(8);
  for (auto& e : batches) {
    pipeline::Tensor image = pipeline::Tensor::Allocate(
        pipeline::DType::kUInt8, pipeline::Shape{128, 784}, pinned);
    std::fill_n(image.mutable_data<uint8_t>(), 128 * 784, uint8_t{7});
    e.Set("image", image);
    if (with_label) {
      pipeline::Tensor label = pipeline::Tensor::Allocate(
          pipeline::DType::kInt64, pipeline::Shape{128}, pinned);
      std::fill_n(label.mutable_data<int64_t>(), 128, int64_t{3});
      e.Set("label", label);
    }
  }
  return batches;
}

void Prefetch(benchmark::State& state, bool with_label, bool to_device) {
  if (!HaveGpu(state)) return;
  const std::unique_ptr<Backend> be = MakeCudaBackend(0);
  const std::vector<pipeline::Element> batches = PinnedBatches(*be, with_label);
  size_t i = 0;
  for (auto _ : state) {
    const pipeline::Element& e = batches[i++ % batches.size()];
    const auto t0 = Clock::now();
    be->Prefetch(e);
    pipeline::Tensor image, label;
    if (to_device) {
      image = be->ToDevice(e["image"]);
      if (with_label) label = be->ToDevice(e["label"]);
    }
    const auto t1 = Clock::now();
    state.SetIterationTime(Seconds(t0, t1));
    benchmark::DoNotOptimize(image.raw_data());
    benchmark::DoNotOptimize(label.raw_data());
    if (i % 32 == 0) be->Synchronize();
  }
  be->Synchronize();
}

// Prefetch/image_label/staged/<beside|before>: the same batches staged
// by the backend's InputStager (the Estimator's default since 4e98ca5),
// then Prefetch and the step's ToDevice calls timed on this thread: with
// the stager on a second thread staging up to two batches ahead while
// this one runs (beside: as the pipeline's prefetch thread does, whose
// CUDA calls may contend with this thread's in the driver), or called
// on this thread, untimed, before each (before: the calls alone).  On
// the H200 (2026-11-27) Prefetch cost a captured DNN step 3.8 us where
// its two CUDA calls (an event record and a stream wait) price at ~0.8.
void PrefetchStaged(benchmark::State& state, bool beside) {
  if (!HaveGpu(state)) return;
  const std::unique_ptr<Backend> be = MakeCudaBackend(0);
  const std::vector<pipeline::Element> batches = PinnedBatches(*be, true);
  const std::function<void(const pipeline::Element&)> stage = be->InputStager();
  // Beside: batch indexes staged and not yet taken, at most two.
  std::mutex mu;
  std::condition_variable cv;
  std::deque<size_t> staged;
  bool stop = false;
  std::thread stager;
  if (beside) {
    stager = std::thread([&] {
      for (size_t next = 0;; ++next) {
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return stop || staged.size() < 2; });
          if (stop) return;
        }
        stage(batches[next % batches.size()]);
        std::lock_guard<std::mutex> lock(mu);
        staged.push_back(next % batches.size());
        cv.notify_all();
      }
    });
  }
  size_t i = 0;
  for (auto _ : state) {
    size_t at = i++ % batches.size();
    if (beside) {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return !staged.empty(); });
      at = staged.front();
      staged.pop_front();
      cv.notify_all();
    } else {
      stage(batches[at]);
    }
    const pipeline::Element& e = batches[at];
    const auto t0 = Clock::now();
    be->Prefetch(e);
    const pipeline::Tensor image = be->ToDevice(e["image"]);
    const pipeline::Tensor label = be->ToDevice(e["label"]);
    const auto t1 = Clock::now();
    state.SetIterationTime(Seconds(t0, t1));
    benchmark::DoNotOptimize(image.raw_data());
    benchmark::DoNotOptimize(label.raw_data());
    if (i % 32 == 0) be->Synchronize();
  }
  if (beside) {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    stager.join();
  }
  be->Synchronize();
  const Backend::InputStats s = be->input_stats();
  state.counters["taken_staged"] = static_cast<double>(s.taken);
  state.counters["not_staged"] = static_cast<double>(s.unstaged);
}

void Register() {
  const auto add = [](const char* name, auto fn, auto... args) {
    return benchmark::RegisterBenchmark(name, fn, args...)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  };
  add("PointerAttributes/pinned", PointerAttributes, true);
  add("PointerAttributes/pageable", PointerAttributes, false);
  add("AllocatorOwns", AllocatorOwns);
  add("EventRecord", EventCalls, 0);
  add("StreamWaitEvent", EventCalls, 1);
  add("EventSynchronizeDone", EventCalls, 2);
  add("MemcpyPinned", MemcpyPinned)->Arg(1024)->Arg(128 * 784);
  add("Prefetch/image_label/to_device", Prefetch, true, true);
  add("Prefetch/image_label/alone", Prefetch, true, false);
  add("Prefetch/image/to_device", Prefetch, false, true);
  add("Prefetch/image/alone", Prefetch, false, false);
  add("Prefetch/image_label/staged/beside", PrefetchStaged, true);
  add("Prefetch/image_label/staged/before", PrefetchStaged, false);
}

}  // namespace
}  // namespace recflow::train

int main(int argc, char** argv) {
  recflow::train::Register();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
