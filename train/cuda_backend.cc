// The CUDA backend: cuBLAS for matrix products, cuDNN for convolutions,
// recflow's own kernels (cuda_kernels.cu) for the rest, all on one compute
// stream; input copied on a copy stream from pinned memory (the pipeline
// delivers batches in InputMemory(); other input is packed into a pinned
// buffer first); memory from a caching allocator (cuda_allocator.h).
//
// cuDNN 9 marks its descriptor-based convolution API deprecated in favour
// of the graph API, whose usable form is the cudnn-frontend C++ library (not
// packaged in Debian).  The descriptor API is still shipped and supported
// in cuDNN 9, so this file uses it and silences the deprecation warnings.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <fmt/format.h>
#ifndef RECFLOW_NCCL_BUILT
#define RECFLOW_NCCL_BUILT 0
#endif
#if RECFLOW_NCCL_BUILT
#include <nccl.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "train/backend.h"
#include "train/collective.h"
#include "train/cuda_allocator.h"
#include "train/cuda_kernels.h"

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace recflow::train {

bool CudaBuilt() { return true; }
bool NcclBuilt() { return RECFLOW_NCCL_BUILT != 0; }

namespace {

using cuda::CachingAllocator;

[[noreturn]] void Fail(int device, std::string_view what,
                       std::string_view why) {
  throw Error(fmt::format("cuda:{}: {}: {}", device, what, why));
}

void Check(cudaError_t e, int device, std::string_view what) {
  if (e != cudaSuccess) Fail(device, what, cudaGetErrorString(e));
}
void Check(cublasStatus_t s, int device, std::string_view what) {
  if (s != CUBLAS_STATUS_SUCCESS) Fail(device, what, cublasGetStatusString(s));
}
void Check(cudnnStatus_t s, int device, std::string_view what) {
  if (s != CUDNN_STATUS_SUCCESS) Fail(device, what, cudnnGetErrorString(s));
}
#if RECFLOW_NCCL_BUILT
// NCCL's code, and what its last error said on this thread (which names
// the peer or transport that failed, where the code alone does not).
void Check(ncclResult_t r, int device, std::string_view what) {
  if (r == ncclSuccess) return;
  const char* last = ncclGetLastError(nullptr);
  Fail(device, what,
       last != nullptr && *last != '\0'
           ? fmt::format("{} ({})", ncclGetErrorString(r), last)
           : std::string(ncclGetErrorString(r)));
}
#endif

cuda::Src SrcOf(DType d) {
  switch (d) {
    case DType::kFloat32:
      return cuda::Src::kF32;
    case DType::kFloat64:
      return cuda::Src::kF64;
    case DType::kInt32:
      return cuda::Src::kI32;
    case DType::kInt64:
      return cuda::Src::kI64;
    case DType::kUInt8:
      return cuda::Src::kU8;
    case DType::kBytes:
      break;
  }
  throw Error(
      "a bytes tensor cannot be used as numbers; decode it first "
      "(ops::DecodeRaw)");
}

size_t Align(size_t n) { return (n + 255) / 256 * 256; }

// `t` as the numeric host tensor a copy to the device takes: itself, or
// the uint8 form of fixed-length bytes (Tensor::BytesAsUInt8).  Throws
// Error for bytes of several lengths and for ragged tensors.
Tensor HostNumeric(const Tensor& t) {
  if (t.dtype() == DType::kBytes) return t.BytesAsUInt8();
  if (t.ragged()) {
    throw Error(
        "a ragged tensor cannot be copied to the GPU as one array; copy its "
        "values and row lengths");
  }
  return t;
}

struct ConvPlan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  std::array<cudnnConvolutionDescriptor_t, 3> conv{};  // fwd, bwd data, filter
  cudnnConvolutionFwdAlgo_t fwd_algo{};
  cudnnConvolutionBwdDataAlgo_t data_algo{};
  cudnnConvolutionBwdFilterAlgo_t filter_algo{};
  size_t fwd_ws = 0, data_ws = 0, filter_ws = 0;
  // TF's SAME padding puts an odd extra row/column at the bottom/right,
  // which cuDNN's symmetric padding cannot express: such inputs are
  // padded explicitly and convolved VALID.
  bool explicit_pad = false;
  int64_t pad_bottom = 0, pad_right = 0;
  int64_t cudnn_in_h = 0, cudnn_in_w = 0;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(int index, bool allow_tf32, bool autotune)
      : index_(index), tf32_(allow_tf32), autotune_(autotune) {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw CudaUnavailable(fmt::format(
          "no usable GPU for cuda:{}: {} (is the NVIDIA driver installed and "
          "a GPU visible?)",
          index, cudaGetErrorString(e)));
    }
    if (count == 0) {
      throw CudaUnavailable(
          fmt::format("no usable GPU for cuda:{}: CUDA sees no device", index));
    }
    if (index < 0 || index >= count) {
      throw CudaUnavailable(fmt::format(
          "cuda:{} does not exist: this machine has {} GPU{} (cuda:0{})", index,
          count, count == 1 ? "" : "s",
          count == 1 ? "" : fmt::format("..cuda:{}", count - 1)));
    }
    Check(cudaSetDevice(index), index, "cudaSetDevice");
    cudaDeviceProp props{};
    Check(cudaGetDeviceProperties(&props, index), index,
          "cudaGetDeviceProperties");
    device_name_ = props.name;
    unified_addressing_ = props.unifiedAddressing != 0;
    Check(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking), index,
          "creating the compute stream");
    Check(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking), index,
          "creating the copy stream");
    Check(cublasCreate(&cublas_), index, "cublasCreate");
    Check(cublasSetStream(cublas_, compute_), index, "cublasSetStream");
    Check(cublasSetMathMode(cublas_, tf32_ ? CUBLAS_TF32_TENSOR_OP_MATH
                                           : CUBLAS_PEDANTIC_MATH),
          index, "cublasSetMathMode");
    Check(cudnnCreate(&cudnn_), index, "cudnnCreate");
    Check(cudnnSetStream(cudnn_, compute_), index, "cudnnSetStream");
    device_alloc_ = std::make_shared<CachingAllocator>(
        pipeline::MemoryKind::kDevice, index);
    pinned_alloc_ = std::make_shared<CachingAllocator>(
        pipeline::MemoryKind::kPinnedHost, index);
    void* err = nullptr;
    Check(cudaHostAlloc(&err, sizeof(cuda::DeviceError), cudaHostAllocMapped),
          index, "allocating the error slot");
    err_host_ = static_cast<cuda::DeviceError*>(err);
    std::memset(err_host_, 0, sizeof(cuda::DeviceError));
    void* dev = nullptr;
    Check(cudaHostGetDevicePointer(&dev, err, 0), index,
          "mapping the error slot");
    err_dev_ = static_cast<cuda::DeviceError*>(dev);
    Check(cudaEventCreateWithFlags(&reused_, cudaEventDisableTiming), index,
          "cudaEventCreate");
    for (Slot& s : slots_) {
      Check(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming), index,
            "cudaEventCreate");
      Check(cudaEventCreateWithFlags(&s.consumed, cudaEventDisableTiming),
            index, "cudaEventCreate");
    }
    stage_alloc_ = std::make_shared<CachingAllocator>(
        pipeline::MemoryKind::kDevice, index);
    for (Slot& s : stage_slots_) {
      Check(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming), index,
            "cudaEventCreate");
      Check(cudaEventCreateWithFlags(&s.consumed, cudaEventDisableTiming),
            index, "cudaEventCreate");
      stage_free_.push_back(&s);
    }
  }

  ~CudaBackend() override {
    cudaSetDevice(index_);
    if (capturing_) {  // left by an error: nothing of it runs
      cudaGraph_t graph = nullptr;
      cudaStreamEndCapture(compute_, &graph);
      if (graph != nullptr) cudaGraphDestroy(graph);
      cudaGetLastError();
    }
    cudaStreamSynchronize(copy_);
    cudaStreamSynchronize(compute_);
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
#if RECFLOW_NCCL_BUILT
    // Unwinding from an error, the other ranks may never join a clean
    // teardown: abort the communicator (local, never waits) instead.
    if (nccl_ != nullptr) {
      if (std::uncaught_exceptions() > 0) {
        ncclCommAbort(nccl_);
      } else {
        ncclCommDestroy(nccl_);
      }
    }
#endif
    for (auto& [key, plan] : plans_) Destroy(plan);
    for (Slot& s : slots_) {
      cudaEventDestroy(s.copied);
      cudaEventDestroy(s.consumed);
    }
    for (Slot& s : stage_slots_) {
      cudaEventDestroy(s.copied);
      cudaEventDestroy(s.consumed);
    }
    for (InPlaceBatch& b : in_place_read_) cudaEventDestroy(b.read);
    for (cudaEvent_t e : in_place_events_) cudaEventDestroy(e);
    cudaEventDestroy(reused_);
    cudnnDestroy(cudnn_);
    cublasDestroy(cublas_);
    cudaStreamDestroy(copy_);
    cudaStreamDestroy(compute_);
    cudaFreeHost(err_host_);
  }

  Device device() const override { return Device::kCuda; }
  std::string name() const override {
    return fmt::format("cuda:{} ({}{})", index_, device_name_,
                       tf32_ ? ", TF32" : "");
  }
  std::string device_name() const override { return device_name_; }
  int threads() const override { return 1; }

  // --- Memory --------------------------------------------------------------

  Tensor Allocate(DType dtype, const Shape& shape) override {
    return Tensor::Allocate(dtype, shape, device_alloc_);
  }

  Tensor ToDevice(const Tensor& t) override {
    if (t.device() == Device::kCuda) return t;
    const Tensor h = HostNumeric(t);
    if (auto hit = FromSlots(h)) return *hit;
    Tensor out = Allocate(h.dtype(), h.shape());
    if (h.byte_size() == 0) return out;
    // A captured copy reads its source when the step's graph is launched
    // (at the step's end), and only pinned memory can be captured: a
    // pageable source (host values a model_fn made, as the feature
    // columns' ids) is first copied into pinned memory of its own.
    Tensor src = h;
    bool pinned = IsPinned(h.raw_data());
    if (capturing_ && !pinned) {
      src = h.CopyInto(pinned_alloc_);
      pinned = true;
    }
    Check(cudaMemcpyAsync(const_cast<char*>(out.raw_data()), src.raw_data(),
                          src.byte_size(), cudaMemcpyHostToDevice, compute_),
          index_, "copying input to the GPU");
    // From pageable memory the copy returns once the source is staged, so
    // `h` may go when this returns.  From pinned memory (InputMemory's, or
    // the copy above) it runs later: the source is held until the compute
    // stream has been waited for, so that its block is not reused and
    // rewritten before.  Not waited for within a capture (that would end
    // it): BeginStep waits when too many are held.
    if (pinned) {
      held_.push_back(std::move(src));
      if (!capturing_) LetGoOfHeldIfMany();
    }
    return out;
  }

  std::shared_ptr<pipeline::Allocator> InputMemory() override {
    return pinned_alloc_;
  }

  Tensor ToHost(const Tensor& t) override {
    if (t.device() == Device::kCpu) return t;
    StopCapture();
    if (t.dtype() == DType::kBytes) {
      throw Error("a device tensor holds numbers, never bytes");
    }
    Tensor out = Tensor::Allocate(t.dtype(), t.shape(), pinned_alloc_);
    if (t.byte_size() > 0) {
      Check(cudaMemcpyAsync(const_cast<char*>(out.raw_data()), t.raw_data(),
                            t.byte_size(), cudaMemcpyDefault, compute_),
            index_, "copying a result to the host");
    }
    Synchronize();
    return out;
  }

  void Prefetch(const pipeline::Element& element) override {
    StopCapture();  // its events and waits join the copy stream's work
    // The staged batch of the step before is free once the work queued so
    // far has run.
    ReleaseStaged();
    ReleaseInPlace();
    if (TakeInPlace(element)) return;
    if (TakeStaged(element)) return;
    // Everything the steps before this one read from their slots is
    // queued by now: the slot handed out last is free once that has run.
    if (next_slot_ > 0) {
      Slot& last = slots_[(next_slot_ - 1) % slots_.size()];
      Check(cudaEventRecord(last.consumed, compute_), index_,
            "cudaEventRecord");
    }
    Slot& slot = slots_[next_slot_++ % slots_.size()];
    // The slot's last copy (three prefetches ago) must be done before its
    // pinned buffer is refilled and the host tensors it copied from go.
    Check(cudaEventSynchronize(slot.copied), index_, "waiting for a copy");
    slot.entries.clear();
    size_t packed = 0;
    std::vector<Part> parts;
    const size_t total = CollectParts(element, &parts, &packed);
    if (total == 0) return;
    // A tensor handed out from this slot that someone still holds keeps
    // the old device buffer; the slot takes a new one.
    const bool still_held = slot.lease.use_count() > 1;
    if (slot.capacity < total || still_held) {
      slot.device = Tensor();
      const auto bytes =
          static_cast<int64_t>(Align(std::max(total * 5 / 4, slot.capacity)));
      slot.device = Allocate(DType::kUInt8, Shape{bytes});
      slot.capacity = static_cast<size_t>(bytes);
      // The caching allocator may hand out a block freed on the host while
      // kernels queued on the compute stream still read or write it: safe
      // for work on the compute stream (it runs after them), not for this
      // copy on the copy stream, so the copy waits for all the compute
      // stream has queued.
      Check(cudaEventRecord(reused_, compute_), index_, "cudaEventRecord");
      Check(cudaStreamWaitEvent(copy_, reused_, 0), index_,
            "ordering the input copy after the work before it");
    }
    slot.lease = std::make_shared<Tensor>(slot.device);
    // The device buffer may still be read by the step that used this slot
    // last; the copies wait for that, not for anything later.
    Check(cudaStreamWaitEvent(copy_, slot.consumed, 0), index_,
          "ordering the input copy");
    CopyParts(slot, parts, packed);
    slot.compute_waited = false;
  }

  // --- Input read in place (SetInputInPlace) ------------------------------

  void SetInputInPlace(bool on) override {
    in_place_ = on && unified_addressing_;
  }

  // Prefetch's: `element` read in place by the step, when every tensor of
  // it is in pinned memory and together they are small.
  bool TakeInPlace(const pipeline::Element& element) {
    if (!in_place_) return false;
    std::vector<Part> parts;
    size_t packed = 0;
    const size_t total = CollectParts(element, &parts, &packed);
    if (total == 0 || packed > 0 || total > kInPlaceMaxBytes) return false;
    for (Part& p : parts) in_place_current_.push_back(std::move(p.host));
    std::lock_guard<std::mutex> lock(stage_mu_);
    ++input_stats_.in_place;
    return true;
  }
  // Prefetch's: the batch the step before read in place is held until an
  // event recorded after everything queued so far has completed; batches
  // whose steps have run go back to the pipeline (at most kMaxInPlaceRead
  // wait: beyond, the oldest is waited for).
  void ReleaseInPlace() {
    if (!in_place_current_.empty()) {
      cudaEvent_t read = nullptr;
      if (in_place_events_.empty()) {
        Check(cudaEventCreateWithFlags(&read, cudaEventDisableTiming), index_,
              "cudaEventCreate");
      } else {
        read = in_place_events_.back();
        in_place_events_.pop_back();
      }
      in_place_read_.push_back({std::move(in_place_current_), read});
      in_place_current_.clear();
      Check(cudaEventRecord(read, compute_), index_, "cudaEventRecord");
    }
    while (!in_place_read_.empty()) {
      InPlaceBatch& oldest = in_place_read_.front();
      if (in_place_read_.size() > kMaxInPlaceRead) {
        Check(cudaEventSynchronize(oldest.read), index_,
              "waiting for a step that read its batch in place");
      } else {
        const cudaError_t e = cudaEventQuery(oldest.read);
        if (e == cudaErrorNotReady) {
          cudaGetLastError();  // not an error: not left for later calls
          break;
        }
        Check(e, index_, "a step that read its batch in place");
      }
      in_place_events_.push_back(oldest.read);
      in_place_read_.pop_front();
    }
  }
  // `t` (HostNumeric's form) as a device tensor viewing the host memory of
  // the batch read in place that holds it, if one does.
  std::optional<Tensor> InPlaceView(const Tensor& t) const {
    for (const Tensor& h : in_place_current_) {
      if (h.raw_data() == t.raw_data() && h.dtype() == t.dtype() &&
          h.shape() == t.shape()) {
        // Unified addressing: the kernels read it at its host address.
        return Tensor::View(h.dtype(), h.shape(), h.raw_data(),
                            std::make_shared<Tensor>(h), Device::kCuda);
      }
    }
    return std::nullopt;
  }

  // --- Input staged on the pipeline's thread (InputStager) ------------------

  std::function<void(const pipeline::Element&)> InputStager() override {
    const uint64_t generation =
        stage_generations_.fetch_add(1, std::memory_order_relaxed) + 1;
    return [this, generation](const pipeline::Element& element) {
      StageInput(element, generation);
    };
  }

  InputStats input_stats() const override {
    std::lock_guard<std::mutex> lock(stage_mu_);
    return input_stats_;
  }

  void Synchronize() override {
    StopCapture();
    Check(cudaStreamSynchronize(compute_), index_, "running the step");
    held_.clear();  // their copies have run
    // And the steps that read batches in place.
    for (InPlaceBatch& b : in_place_read_) in_place_events_.push_back(b.read);
    in_place_read_.clear();
    if (err_host_->code != 0) {
      const cuda::DeviceError e = *err_host_;
      std::memset(err_host_, 0, sizeof(cuda::DeviceError));
      if (e.code == cuda::kLabelOutOfRange) {
        throw Error(fmt::format(
            "label {} of row {} is outside [0, {}) (the logits' classes)",
            e.value, e.position, e.limit));
      }
      throw Error(fmt::format(
          "id {} at position {} is outside [0, {}) (the embedding's rows)",
          e.value, e.position, e.limit));
    }
  }

  // --- Data-parallel training ------------------------------------------------

  void AllReduceSum(Collective& world,
                    std::span<const std::span<float>> buffers) override {
#if RECFLOW_NCCL_BUILT
    ncclComm_t comm = Communicator(world);
    // One group: NCCL launches the group's all-reduces together, so small
    // gradients cost no launch each (what packing them does on the host).
    Check(ncclGroupStart(), index_, "ncclGroupStart");
    for (const std::span<float> b : buffers) {
      if (b.empty()) continue;
      Check(ncclAllReduce(b.data(), b.data(), b.size(), ncclFloat32, ncclSum,
                          comm, compute_),
            index_, fmt::format("all-reducing {} gradient values", b.size()));
    }
    Check(ncclGroupEnd(), index_, "all-reducing the gradients (ncclGroupEnd)");
#else
    Backend::AllReduceSum(world, buffers);  // says this build has no NCCL
#endif
  }

  // --- Library calls ---------------------------------------------------------

  void Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
            const float* a, const float* b, float beta, float* c) override {
    if (m == 0 || n == 0) return;
    Sgemm(ta, tb, m, n, k, alpha, a, b, beta, c);
    if (log_calls_) call_log_.push_back({Call::kGemm, {}, ta, tb, m, n, k});
  }

  void Conv2D(const Window2D& g, const float* x, const float* w,
              float* y) override {
    ConvPlan& p = Plan(g);
    const Tensor krsc = Krsc(g, w);
    Tensor padded;
    Tensor ws = Workspace(p.fwd_ws);
    CudnnForward(p, CudnnInput(g, p, x, &padded), krsc.data<float>(), y,
                 WsPtr(ws));
    if (log_calls_) call_log_.push_back({Call::kConvForward, g});
  }

  void Conv2DBackward(const Window2D& g, const float* x, const float* w,
                      const float* dy, float* dx, float* dw) override {
    ConvPlan& p = Plan(g);
    if (dx != nullptr) {
      const Tensor krsc = Krsc(g, w);
      Tensor ws = Workspace(p.data_ws);
      if (p.explicit_pad) {
        Tensor dpad = Scratch(g.batch * p.cudnn_in_h * p.cudnn_in_w * g.in_c);
        CudnnBackwardData(p, krsc.data<float>(), dy, 0.0f, Ptr(dpad),
                          WsPtr(ws));
        cuda::CropAccumulate(compute_, g.batch, g.in_h, g.in_w, g.in_c,
                             g.pad_top, p.pad_bottom, g.pad_left, p.pad_right,
                             dpad.data<float>(), dx);
      } else {
        // beta = 1: cuDNN adds into dx, as the contract says.
        CudnnBackwardData(p, krsc.data<float>(), dy, 1.0f, dx, WsPtr(ws));
      }
      if (log_calls_) call_log_.push_back({Call::kConvData, g});
    }
    if (dw != nullptr) {
      Tensor padded;
      Tensor dkrsc = Scratch(g.window_h * g.window_w * g.in_c * g.out_c);
      Tensor ws = Workspace(p.filter_ws);
      CudnnBackwardFilter(p, CudnnInput(g, p, x, &padded), dy, Ptr(dkrsc),
                          WsPtr(ws));
      cuda::KrscAccumulateHwio(compute_, g.window_h * g.window_w, g.in_c,
                               g.out_c, dkrsc.data<float>(), dw);
      if (log_calls_) call_log_.push_back({Call::kConvFilter, g});
    }
  }

  void Pool2D(Pooling kind, const Window2D& g, const float* x,
              float* y) override {
    cuda::Pool2D(compute_, kind == Pooling::kMax ? 0 : 1, PoolShapeOf(g), x, y);
  }
  void Pool2DBackward(Pooling kind, const Window2D& g, const float* x,
                      const float* y, const float* dy, float* dx) override {
    cuda::Pool2DBackward(compute_, kind == Pooling::kMax ? 0 : 1,
                         PoolShapeOf(g), x, y, dy, dx);
  }

  // --- Own kernels -----------------------------------------------------------

  void ActivationForward(Activation f, int64_t n, const float* x,
                         float* y) override {
    if (f == Activation::kLinear && x == y) return;
    cuda::ActivationForward(compute_, static_cast<int>(f), n, x, y);
  }
  void ActivationBackward(Activation f, int64_t n, const float* y,
                          const float* dy, float beta, float* dx) override {
    cuda::ActivationBackward(compute_, static_cast<int>(f), n, y, dy, beta, dx);
  }
  void Softmax(int64_t rows, int64_t cols, const float* x, float* y) override {
    cuda::Softmax(compute_, rows, cols, x, y);
  }
  void SoftmaxBackward(int64_t rows, int64_t cols, const float* y,
                       const float* dy, float* dx) override {
    cuda::SoftmaxBackward(compute_, rows, cols, y, dy, dx);
  }
  void SparseSoftmaxCrossEntropy(int64_t rows, int64_t cols,
                                 const float* logits, const int64_t* labels,
                                 float* losses, float* dlogits,
                                 float scale) override {
    cuda::SparseSoftmaxCrossEntropy(compute_, rows, cols, logits, labels,
                                    losses, dlogits, scale, err_dev_);
  }
  void SigmoidCrossEntropy(int64_t n, const float* logits, const float* targets,
                           float* losses, float* dlogits,
                           float scale) override {
    cuda::SigmoidCrossEntropy(compute_, n, logits, targets, losses, dlogits,
                              scale);
  }
  void Fill(int64_t n, float value, float* y) override {
    if (value == 0.0f && n > 0) {
      Check(cudaMemsetAsync(y, 0, static_cast<size_t>(n) * sizeof(float),
                            compute_),
            index_, "cudaMemsetAsync");
      return;
    }
    cuda::Fill(compute_, n, value, y);
  }
  void Copy(int64_t n, const float* x, float* y) override {
    if (n <= 0 || x == y) return;
    // Default: `x` may view host memory read in place (SetInputInPlace).
    Check(cudaMemcpyAsync(y, x, static_cast<size_t>(n) * sizeof(float),
                          cudaMemcpyDefault, compute_),
          index_, "cudaMemcpyAsync");
  }
  void Axpby(int64_t n, float alpha, const float* x, float beta,
             float* y) override {
    cuda::Axpby(compute_, n, alpha, x, beta, y);
  }
  void Multiply(int64_t n, const float* x, const float* y, float* z) override {
    cuda::Multiply(compute_, n, x, y, z);
  }
  void BiasAdd(int64_t rows, int64_t cols, const float* x, const float* b,
               float* y) override {
    cuda::BiasAdd(compute_, rows, cols, x, b, y);
  }
  void ColumnSum(int64_t rows, int64_t cols, const float* x, float beta,
                 float* out) override {
    Tensor partial = Scratch(cuda::ColumnSumScratch(rows, cols));
    cuda::ColumnSum(compute_, rows, cols, x, beta, out, Ptr(partial));
  }
  void Sum(int64_t n, const float* x, float scale, float* y) override {
    cuda::Sum(compute_, n, x, scale, y);
  }
  void AxpyScalar(int64_t n, const float* alpha, const float* x, float beta,
                  float* y) override {
    cuda::AxpyScalar(compute_, n, alpha, x, beta, y);
  }
  void Convert(DType dtype, int64_t n, const void* x, float scale,
               float* y) override {
    cuda::Convert(compute_, SrcOf(dtype), n, x, scale, y);
  }
  void ToInt64(DType dtype, int64_t n, const void* x, int64_t* y) override {
    if (dtype != DType::kInt64 && dtype != DType::kInt32 &&
        dtype != DType::kUInt8) {
      throw Error(fmt::format("ids must be integers, got {}",
                              pipeline::DTypeName(dtype)));
    }
    cuda::ToInt64(compute_, SrcOf(dtype), n, x, y);
  }
  void CopyBlock(int64_t rows, int64_t cols, const float* x, int64_t ldx,
                 float* y, int64_t ldy, bool accumulate) override {
    cuda::CopyBlock(compute_, rows, cols, x, ldx, y, ldy, accumulate);
  }
  void DropoutMask(int64_t n, float rate, uint64_t seed, float* mask) override {
    cuda::DropoutMask(compute_, n, rate, seed, mask);
  }
  void ArgMax(int64_t rows, int64_t cols, const float* x,
              int64_t* out) override {
    cuda::ArgMax(compute_, rows, cols, x, out);
  }
  void GreaterThan(int64_t n, const float* x, float threshold,
                   int64_t* out) override {
    cuda::GreaterThan(compute_, n, x, threshold, out);
  }
  void Gather(int64_t rows, int64_t dim, const float* table, int64_t n,
              const int64_t* ids, float* y) override {
    cuda::Gather(compute_, rows, dim, table, n, ids, y, err_dev_);
  }
  void ScatterAdd(int64_t dim, int64_t n, const int64_t* ids, const float* dy,
                  float* dtable) override {
    // Rows were checked by the forward Gather; out-of-range ids are skipped.
    cuda::ScatterAdd(compute_, std::numeric_limits<int64_t>::max(), dim, n, ids,
                     dy, dtable);
  }
  void BatchNormForward(int64_t rows, int64_t cols, const float* x,
                        const float* gamma, const float* beta, float epsilon,
                        bool training, float momentum, float* moving_mean,
                        float* moving_var, float* mean, float* inv_std,
                        float* y) override {
    if (training) {
      Tensor partial = Scratch(2 * cuda::ColumnSumScratch(rows, cols));
      cuda::BatchNormStats(compute_, rows, cols, x, epsilon, momentum,
                           moving_mean, moving_var, mean, inv_std,
                           Ptr(partial));
    } else {
      cuda::BatchNormInferenceStats(compute_, cols, epsilon, moving_mean,
                                    moving_var, mean, inv_std);
    }
    cuda::BatchNormApply(compute_, rows, cols, x, mean, inv_std, gamma, beta,
                         y);
  }
  void BatchNormBackward(int64_t rows, int64_t cols, bool training,
                         const float* x, const float* gamma, const float* mean,
                         const float* inv_std, const float* dy, float* dx,
                         float* dgamma, float* dbeta) override {
    Tensor partial = Scratch(2 * cuda::ColumnSumScratch(rows, cols) + 2 * cols +
                             rows * cols);
    cuda::BatchNormBackward(compute_, rows, cols, training, x, gamma, mean,
                            inv_std, dy, dx, dgamma, dbeta, Ptr(partial));
  }
  void SgdUpdate(int64_t n, float lr, const float* g, float* w) override {
    cuda::SgdUpdate(compute_, n, lr, g, w);
  }
  void MomentumUpdate(int64_t n, float lr, float momentum, bool nesterov,
                      const float* g, float* v, float* w) override {
    cuda::MomentumUpdate(compute_, n, lr, momentum, nesterov, g, v, w);
  }
  void AdamUpdate(int64_t n, float lr_t, float beta1, float beta2,
                  float epsilon, const float* g, float* m, float* v,
                  float* w) override {
    cuda::AdamUpdate(compute_, n, lr_t, beta1, beta2, epsilon, g, m, v, w);
  }
  // One launch per cuda::AdamBatch::kMax variables.
  void AdamUpdateAll(std::span<const AdamVariable> vars, float lr_t,
                     float beta1, float beta2, float epsilon) override {
    cuda::AdamBatch batch;
    for (size_t i = 0; i < vars.size(); ++i) {
      const AdamVariable& a = vars[i];
      const int k = batch.count++;
      batch.n[k] = a.n;
      batch.g[k] = a.g;
      batch.m[k] = a.m;
      batch.v[k] = a.v;
      batch.w[k] = a.w;
      if (batch.count == cuda::AdamBatch::kMax || i + 1 == vars.size()) {
        cuda::AdamUpdateAll(compute_, batch, lr_t, beta1, beta2, epsilon);
        batch.count = 0;
      }
    }
  }

  // --- Step graphs (Backend::BeginStep) -------------------------------------

  void SetStepGraphs(bool on) override {
    StopCapture();
    graphs_ = on;
    graph_steps_ = 0;
    ended_early_in_row_ = 0;
  }

  void BeginStep() override {
    if (!graphs_ || capturing_) return;
    if (graph_steps_++ < kWarmUpSteps) return;
    // Steps that keep ending their capture early (a model_fn that fetches
    // a value every step) would make a new graph each time: call by call.
    if (ended_early_in_row_ >= kMaxEndedEarlyInRow) return;
    step_captured_ = true;
    // The sources of the copies captured in the steps before (ToDevice).
    LetGoOfHeldIfMany();
    // The input this step reads was copied by Prefetch on the copy stream:
    // waited for here, outside the capture.
    for (Slot& s : slots_) WaitForCopy(s);
    Check(cudaStreamBeginCapture(compute_, cudaStreamCaptureModeRelaxed),
          index_, "capturing the step (cudaStreamBeginCapture)");
    capturing_ = true;
  }

  void EndStep() override {
    if (capturing_) {
      EndCapture();
      ended_early_in_row_ = 0;
    } else if (step_captured_) {
      ++ended_early_in_row_;
    }
    step_captured_ = false;
  }

  void AbortStep() override {
    step_captured_ = false;
    if (!capturing_) return;
    // The step failed: what it captured is dropped, not run.
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(compute_, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
  }

  StepGraphStats step_graph_stats() const override { return graph_stats_; }

  // --- Library-call log (train_bench) ----------------------------------------

  void StartCallLog() override {
    call_log_.clear();
    log_calls_ = true;
  }
  void StopCallLog() override { log_calls_ = false; }
  std::optional<double> TimeCallLog(int reps) override {
    StopCapture();
    log_calls_ = false;
    // Fresh buffers of the logged shapes: replaying on the step's own
    // pointers could overwrite live variables.
    std::vector<std::function<void()>> calls;
    std::vector<Tensor> keep;
    auto buffer = [&](int64_t n) {
      keep.push_back(Allocate(DType::kFloat32, Shape{std::max<int64_t>(n, 1)}));
      Fill(keep.back().num_elements(), 0.01f, Ptr(keep.back()));
      return Ptr(keep.back());
    };
    for (const LoggedCall& c : call_log_) {
      const Window2D& g = c.g;
      switch (c.kind) {
        case Call::kGemm: {
          float* a = buffer(c.m * c.k);
          float* b = buffer(c.k * c.n);
          float* o = buffer(c.m * c.n);
          calls.push_back(
              [=, this] { Sgemm(c.ta, c.tb, c.m, c.n, c.k, 1, a, b, 0, o); });
          break;
        }
        case Call::kConvForward:
        case Call::kConvData:
        case Call::kConvFilter: {
          ConvPlan& p = Plan(g);
          float* x = buffer(g.batch * p.cudnn_in_h * p.cudnn_in_w * g.in_c);
          float* w = buffer(g.window_h * g.window_w * g.in_c * g.out_c);
          float* y = buffer(g.batch * g.out_h * g.out_w * g.out_c);
          const size_t ws_bytes = c.kind == Call::kConvForward ? p.fwd_ws
                                  : c.kind == Call::kConvData  ? p.data_ws
                                                               : p.filter_ws;
          float* ws = buffer(static_cast<int64_t>(ws_bytes / 4 + 1));
          const Call kind = c.kind;
          calls.push_back([=, this, &p] {
            if (kind == Call::kConvForward) {
              CudnnForward(p, x, w, y, ws);
            } else if (kind == Call::kConvData) {
              CudnnBackwardData(p, w, y, 0.0f, x, ws);
            } else {
              CudnnBackwardFilter(p, x, y, w, ws);
            }
          });
          break;
        }
      }
    }
    for (auto& f : calls) f();  // warm up
    cudaEvent_t start, stop;
    Check(cudaEventCreate(&start), index_, "cudaEventCreate");
    Check(cudaEventCreate(&stop), index_, "cudaEventCreate");
    Check(cudaEventRecord(start, compute_), index_, "cudaEventRecord");
    for (int r = 0; r < reps; ++r) {
      for (auto& f : calls) f();
    }
    Check(cudaEventRecord(stop, compute_), index_, "cudaEventRecord");
    Synchronize();
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return ms / 1000.0 / std::max(reps, 1);
  }

  std::string MemoryReport() const override {
    const cuda::AllocatorStats s = device_alloc_->stats();
    const cuda::AllocatorStats staging = stage_alloc_->stats();
    return fmt::format(
        "{} allocations, {} cudaMalloc, {:.1f} MiB in use, {:.1f} MiB cached, "
        "peak {:.1f} MiB; input staging {:.1f} MiB in {} cudaMalloc",
        s.allocations, s.cuda_mallocs, s.in_use_bytes / 1048576.0,
        s.cached_bytes / 1048576.0, s.peak_in_use_bytes / 1048576.0,
        staging.in_use_bytes / 1048576.0, staging.cuda_mallocs);
  }
  uint64_t DeviceMallocs() const override {
    return device_alloc_->stats().cuda_mallocs +
           stage_alloc_->stats().cuda_mallocs;
  }
  std::vector<std::string> ConvolutionChoices() const override {
    std::vector<std::string> out;
    for (const auto& [key, p] : plans_) {
      // key: batch, in_h, in_w, in_c, window_h, window_w, ..., out_c
      out.push_back(fmt::format(
          "{}x{}x{}x{} k{}x{}->{}: fwd {} data {} filter {}", key[0], key[1],
          key[2], key[3], key[4], key[5], key[8], static_cast<int>(p.fwd_algo),
          static_cast<int>(p.data_algo), static_cast<int>(p.filter_algo)));
    }
    return out;
  }

 private:
  struct Slot {
    struct Entry {
      // What was staged (HostNumeric's form); it keeps the host storage,
      // and so the address ToDevice finds it by, alive.
      Tensor host;
      size_t offset;
    };
    Tensor pinned, device;
    std::shared_ptr<const void> lease;  // held by the views handed out
    size_t capacity = 0;                // of device
    size_t pinned_capacity = 0;         // of pinned
    cudaEvent_t copied = nullptr, consumed = nullptr;
    // Whether the compute stream has waited for `copied` as last recorded:
    // a step reading several of the slot's tensors waits once.
    bool compute_waited = true;
    std::vector<Entry> entries;
    // Staging slots (InputStager): the batch's KeyOf and its stager's.
    const void* key = nullptr;
    uint64_t generation = 0;
    uint64_t staged_at = 0;  // prefetches_ when it was staged
  };
  // Orders the compute stream after the slot's last input copy, once.
  void WaitForCopy(Slot& slot) {
    if (slot.compute_waited) return;
    Check(cudaStreamWaitEvent(compute_, slot.copied, 0), index_,
          "waiting for the input copy");
    slot.compute_waited = true;
  }
  // Recorded on the compute stream when a slot takes a new device buffer,
  // for the copy stream to wait for (Prefetch).
  cudaEvent_t reused_ = nullptr;

  // An element's tensors to copy: HostNumeric's form of each host
  // component that is one array, and whether it is in pinned memory.
  struct Part {
    Tensor host;
    bool pinned;
  };
  // The parts of `element`, and the aligned bytes of all of them (the
  // return value) and of those to pack into pinned memory first (`packed`).
  size_t CollectParts(const pipeline::Element& element,
                      std::vector<Part>* parts, size_t* packed) const {
    size_t total = 0;
    for (const auto& c : element.components) {
      std::optional<Tensor> h = PartOf(c.tensor);
      if (!h) continue;
      const bool pinned = IsPinned(h->raw_data());
      total += Align(h->byte_size());
      if (!pinned) *packed += Align(h->byte_size());
      parts->push_back({std::move(*h), pinned});
    }
    return total;
  }
  // `t` as a part to copy: HostNumeric's form of a host tensor that is one
  // non-empty array; nullopt for a device tensor, an empty one, or one not
  // copyable as one array (ragged: ToDevice will say why).
  static std::optional<Tensor> PartOf(const Tensor& t) {
    if (t.device() != Device::kCpu) return std::nullopt;
    try {
      Tensor h = HostNumeric(t);
      if (h.byte_size() == 0) return std::nullopt;
      return h;
    } catch (const Error&) {  // HostNumeric's: a ragged tensor
      return std::nullopt;
    }
  }
  // What tells a staged batch: the address of its first part (the slot's
  // entries keep that storage, so no other live tensor has it).
  static const void* KeyOf(const pipeline::Element& element) {
    for (const auto& c : element.components) {
      if (std::optional<Tensor> h = PartOf(c.tensor)) return h->raw_data();
    }
    return nullptr;
  }
  // Copies `parts` into the slot's device buffer on the copy stream (its
  // capacity and lease set, and the copy stream ordered after the step that
  // read it last): the pageable ones packed into the slot's pinned buffer
  // first and copied in one piece, [0, packed) of the device buffer, the
  // pinned ones from where they are; then records `copied`.
  void CopyParts(Slot& slot, std::vector<Part>& parts, size_t packed) {
    if (slot.pinned_capacity < packed) {
      slot.pinned = Tensor();
      const auto bytes = static_cast<int64_t>(Align(packed * 5 / 4));
      slot.pinned =
          Tensor::Allocate(DType::kUInt8, Shape{bytes}, pinned_alloc_);
      slot.pinned_capacity = static_cast<size_t>(bytes);
    }
    char* device = const_cast<char*>(slot.device.raw_data());
    size_t at = 0;
    for (Part& p : parts) {
      if (p.pinned) continue;
      const size_t bytes = p.host.byte_size();
      std::memcpy(const_cast<char*>(slot.pinned.raw_data()) + at,
                  p.host.raw_data(), bytes);
      slot.entries.push_back({std::move(p.host), at});
      at += Align(bytes);
    }
    if (packed > 0) {
      Check(cudaMemcpyAsync(device, slot.pinned.raw_data(), packed,
                            cudaMemcpyHostToDevice, copy_),
            index_, "copying input to the GPU");
    }
    for (Part& p : parts) {
      if (!p.pinned) continue;
      const size_t bytes = p.host.byte_size();
      Check(cudaMemcpyAsync(device + at, p.host.raw_data(), bytes,
                            cudaMemcpyHostToDevice, copy_),
            index_, "copying input to the GPU");
      slot.entries.push_back({std::move(p.host), at});
      at += Align(bytes);
    }
    Check(cudaEventRecord(slot.copied, copy_), index_, "cudaEventRecord");
  }

  // InputStager's function, on the pipeline's thread.  A staging slot goes
  // free -> (this thread) staged, ready -> (Prefetch) current -> (the next
  // Prefetch, its `consumed` recorded) free; the lists are under
  // stage_mu_, and a slot out of them belongs to the thread that took it.
  // Staging buffers come from an allocator of their own whose blocks only
  // staging slots use, each reused or freed only after the copy stream
  // waited for its slot's `consumed`: so, unlike Prefetch's slots, this
  // thread never needs the compute stream (which may be capturing a step).
  void StageInput(const pipeline::Element& element, uint64_t generation) {
    std::vector<Part> parts;
    size_t packed = 0;
    Check(cudaSetDevice(index_), index_, "choosing the GPU to stage input on");
    const size_t total = CollectParts(element, &parts, &packed);
    if (total == 0) return;
    const void* key = parts.front().host.raw_data();  // KeyOf(element)
    Slot* slot = nullptr;
    {
      std::lock_guard<std::mutex> lock(stage_mu_);
      if (generation > newest_generation_) {
        // A newer iterator stages: what older ones staged and nobody
        // took was read ahead by an iterator that is gone.
        newest_generation_ = generation;
        for (auto it = stage_ready_.begin(); it != stage_ready_.end();) {
          if ((*it)->generation < generation) {
            stage_free_.push_back(*it);
            it = stage_ready_.erase(it);
          } else {
            ++it;
          }
        }
      }
      // A free slot whose device buffer no tensor handed out still views,
      // the one freed last first: steady state then cycles through as few
      // buffers as it needs (two where the batches are staged in Next).
      for (auto it = stage_free_.rbegin(); it != stage_free_.rend(); ++it) {
        if ((*it)->lease.use_count() <= 1) {
          slot = *it;
          stage_free_.erase(std::next(it).base());
          break;
        }
      }
      if (slot == nullptr) {
        ++input_stats_.unstaged;
        return;
      }
    }
    try {
      // Its last copy has run (waited for below when it was staged), so
      // the host tensors it copied from may go; the copy stream waits for
      // the last step that read it.
      slot->entries.clear();
      Check(cudaStreamWaitEvent(copy_, slot->consumed, 0), index_,
            "ordering the input copy");
      if (slot->capacity < total) {
        slot->lease.reset();
        slot->device = Tensor();  // its block: after the wait above
        const auto bytes = static_cast<int64_t>(Align(total * 5 / 4));
        slot->device =
            Tensor::Allocate(DType::kUInt8, Shape{bytes}, stage_alloc_);
        slot->capacity = static_cast<size_t>(bytes);
      }
      slot->lease = std::make_shared<Tensor>(slot->device);
      CopyParts(*slot, parts, packed);
      // This thread waits for its copy, so that Prefetch, on the thread
      // that launches the steps, has no stream to order: a wait fewer on
      // that thread (H200, 2026-11-27: input-fed DNN steps with graphs
      // 1.136-1.137x the plain step's against 1.143-1.144x with the
      // compute stream waiting for the copy's event, docs/PERFORMANCE.md).
      Check(cudaEventSynchronize(slot->copied), index_,
            "waiting for the input copy");
    } catch (...) {
      // Copies it issued before the failure have run (or failed) before its
      // host tensors go: every free slot's copies are done.
      cudaStreamSynchronize(copy_);
      std::lock_guard<std::mutex> lock(stage_mu_);
      slot->entries.clear();
      stage_free_.push_back(slot);
      throw;
    }
    slot->key = key;
    slot->generation = generation;
    std::lock_guard<std::mutex> lock(stage_mu_);
    slot->staged_at = prefetches_;
    stage_ready_.push_back(slot);
    ++input_stats_.staged;
  }
  // Prefetch's: takes the staged slot of `element`, if one (its copy has
  // run, so the compute stream needs no wait); slots staged before it and not
  // taken (made ahead by an iterator that is gone) are let go.
  bool TakeStaged(const pipeline::Element& element) {
    const void* key = KeyOf(element);
    if (key == nullptr) return false;
    {
      std::lock_guard<std::mutex> lock(stage_mu_);
      ++prefetches_;
      auto it = std::find_if(stage_ready_.begin(), stage_ready_.end(),
                             [key](const Slot* s) { return s->key == key; });
      if (it == stage_ready_.end()) {
        // Staged and not taken within kStaleAfter batches: taken from the
        // iterator without a Prefetch (a consumer that skips some), so
        // never to be taken; let go, or they would hold every buffer.
        for (auto s = stage_ready_.begin(); s != stage_ready_.end();) {
          if ((*s)->staged_at + kStaleAfter < prefetches_) {
            stage_free_.push_back(*s);
            s = stage_ready_.erase(s);
          } else {
            ++s;
          }
        }
        return false;
      }
      stage_current_ = *it;
      stage_free_.insert(stage_free_.end(), stage_ready_.begin(), it);
      stage_ready_.erase(stage_ready_.begin(), it + 1);
      ++input_stats_.taken;
    }
    // Its copy has run: StageInput waited for it, so the compute stream
    // needs no wait (staged slots never meet WaitForCopy).
    return true;
  }
  // Prefetch's: the staged slot of the step before goes back to the free
  // list once its `consumed` is recorded after all the work queued so far.
  void ReleaseStaged() {
    if (stage_current_ == nullptr) return;
    Check(cudaEventRecord(stage_current_->consumed, compute_), index_,
          "cudaEventRecord");
    std::lock_guard<std::mutex> lock(stage_mu_);
    stage_free_.push_back(stage_current_);
    stage_current_ = nullptr;
  }

#if RECFLOW_NCCL_BUILT
  // The communicator of `world`'s ranks, made at the first call: rank 0
  // asks NCCL for a unique id and `world` broadcasts it (MPI's broadcast
  // under mpirun), then every rank joins with this backend's GPU.  A
  // backend sums over one world only.
  ncclComm_t Communicator(Collective& world) {
    if (nccl_ != nullptr) {
      if (&world != nccl_world_ || world.size() != nccl_ranks_) {
        Fail(index_, "all-reducing the gradients",
             fmt::format("this backend's NCCL communicator joins the {} "
                         "ranks of another world; one backend sums over one "
                         "world",
                         nccl_ranks_));
      }
      return nccl_;
    }
    StopCapture();  // joining waits for the other ranks
    ncclUniqueId id{};
    if (world.rank() == 0) {
      Check(ncclGetUniqueId(&id), index_, "ncclGetUniqueId");
    }
    std::string bytes(reinterpret_cast<const char*>(&id), sizeof id);
    world.Broadcast(bytes, 0);
    if (bytes.size() != sizeof id) {
      Fail(index_, "joining the NCCL communicator",
           fmt::format("rank 0 sent a unique id of {} bytes, not {}",
                       bytes.size(), sizeof id));
    }
    std::memcpy(&id, bytes.data(), sizeof id);
    Check(cudaSetDevice(index_), index_, "cudaSetDevice");
    ncclComm_t comm = nullptr;
    Check(ncclCommInitRank(&comm, world.size(), id, world.rank()), index_,
          fmt::format("joining the NCCL communicator as rank {} of {}",
                      world.rank(), world.size()));
    nccl_ = comm;
    nccl_world_ = &world;
    nccl_ranks_ = world.size();
    return nccl_;
  }
#endif

  enum class Call { kGemm, kConvForward, kConvData, kConvFilter };
  struct LoggedCall {
    Call kind;
    Window2D g;
    bool ta = false, tb = false;
    int64_t m = 0, n = 0, k = 0;
  };

  static float* Ptr(Tensor& t) { return t.mutable_data<float>(); }
  static void* WsPtr(Tensor& t) {
    return t.valid() && t.num_elements() > 0 ? const_cast<char*>(t.raw_data())
                                             : nullptr;
  }

  // The library calls themselves, for the ops above and TimeCallLog's
  // replay.  Row-major C = op(A) op(B) is column-major C^T = op(B)^T
  // op(A)^T.
  void Sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
             const float* a, const float* b, float beta, float* c) {
    Check(cublasSgemm(cublas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                      ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
                      static_cast<int>(m), static_cast<int>(k), &alpha, b,
                      static_cast<int>(tb ? k : n), a,
                      static_cast<int>(ta ? m : k), &beta, c,
                      static_cast<int>(n)),
          index_, "cublasSgemm");
  }
  // Filters in cuDNN's KRSC layout; `ws` holds the plan's workspace.
  void CudnnForward(ConvPlan& p, const float* x, const float* krsc, float* y,
                    void* ws) {
    const float one = 1.0f, zero = 0.0f;
    Check(cudnnConvolutionForward(cudnn_, &one, p.x, x, p.w, krsc, p.conv[0],
                                  p.fwd_algo, ws, p.fwd_ws, &zero, p.y, y),
          index_, "cudnnConvolutionForward");
  }
  void CudnnBackwardData(ConvPlan& p, const float* krsc, const float* dy,
                         float beta, float* dx, void* ws) {
    const float one = 1.0f;
    Check(cudnnConvolutionBackwardData(cudnn_, &one, p.w, krsc, p.y, dy,
                                       p.conv[1], p.data_algo, ws, p.data_ws,
                                       &beta, p.x, dx),
          index_, "cudnnConvolutionBackwardData");
  }
  void CudnnBackwardFilter(ConvPlan& p, const float* x, const float* dy,
                           float* dkrsc, void* ws) {
    const float one = 1.0f, zero = 0.0f;
    Check(cudnnConvolutionBackwardFilter(cudnn_, &one, p.x, x, p.y, dy,
                                         p.conv[2], p.filter_algo, ws,
                                         p.filter_ws, &zero, p.w, dkrsc),
          index_, "cudnnConvolutionBackwardFilter");
  }

  // `w` (HWIO) in cuDNN's KRSC layout, in scratch memory.
  Tensor Krsc(const Window2D& g, const float* w) {
    Tensor krsc = Scratch(g.window_h * g.window_w * g.in_c * g.out_c);
    cuda::HwioToKrsc(compute_, g.window_h * g.window_w, g.in_c, g.out_c, w,
                     Ptr(krsc));
    return krsc;
  }
  // `x` as cuDNN convolves it: itself, or padded into `*keep` where the
  // plan pads explicitly.
  const float* CudnnInput(const Window2D& g, const ConvPlan& p, const float* x,
                          Tensor* keep) {
    if (!p.explicit_pad) return x;
    *keep = Scratch(g.batch * p.cudnn_in_h * p.cudnn_in_w * g.in_c);
    cuda::Pad(compute_, g.batch, g.in_h, g.in_w, g.in_c, g.pad_top,
              p.pad_bottom, g.pad_left, p.pad_right, x, Ptr(*keep));
    return keep->data<float>();
  }

  Tensor Scratch(int64_t floats) {
    return Allocate(DType::kFloat32, Shape{std::max<int64_t>(floats, 1)});
  }
  Tensor Workspace(size_t bytes) {
    if (bytes == 0) return Tensor();
    return Allocate(DType::kUInt8, Shape{static_cast<int64_t>(bytes)});
  }

  // Ends the capture of the step and launches the graph it made, into the
  // executable graph of the steps before when only parameters changed
  // (cudaGraphExecUpdate: in-flight launches keep theirs), else into a new
  // one.  Throws Error (and runs call by call from then on) when the
  // capture was invalidated: nothing of it ran.
  void EndCapture() {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point ending = Clock::now();
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    const cudaError_t e = cudaStreamEndCapture(compute_, &graph);
    if (e != cudaSuccess || graph == nullptr) {
      cudaGetLastError();
      if (graph != nullptr) cudaGraphDestroy(graph);
      graphs_ = false;
      Fail(index_, "capturing the step into a CUDA graph",
           fmt::format("{}; the step's work since it began is lost, and "
                       "steps run call by call from now on (train without "
                       "--cuda-graphs)",
                       cudaGetErrorString(e)));
    }
    std::unique_ptr<CUgraph_st, decltype(&cudaGraphDestroy)> owned(
        graph, &cudaGraphDestroy);
    size_t nodes = 0;
    Check(cudaGraphGetNodes(graph, nullptr, &nodes), index_,
          "cudaGraphGetNodes");
    if (nodes == 0) return;
    graph_stats_.nodes = nodes;
    const Clock::time_point updating = Clock::now();
    graph_stats_.end_capture_seconds +=
        std::chrono::duration<double>(updating - ending).count();
    bool updated = false;
    if (exec_ != nullptr) {
      cudaGraphExecUpdateResultInfo info{};
      updated = cudaGraphExecUpdate(exec_, graph, &info) == cudaSuccess;
      if (!updated) cudaGetLastError();  // another topology: made anew
    }
    if (!updated) {
      if (exec_ != nullptr) {
        cudaGraphExecDestroy(exec_);
        exec_ = nullptr;
      }
      Check(cudaGraphInstantiate(&exec_, graph, 0), index_,
            "cudaGraphInstantiate");
      ++graph_stats_.instantiations;
    }
    const Clock::time_point launching = Clock::now();
    graph_stats_.update_seconds +=
        std::chrono::duration<double>(launching - updating).count();
    Check(cudaGraphLaunch(exec_, compute_), index_, "cudaGraphLaunch");
    graph_stats_.launch_seconds +=
        std::chrono::duration<double>(Clock::now() - launching).count();
    ++graph_stats_.launches;
  }

  // Before a call that cannot be captured: the step so far is launched,
  // and the rest of it runs call by call.
  void StopCapture() {
    if (!capturing_) return;
    ++graph_stats_.ended_early;
    EndCapture();
  }

  // More than kMaxHeld copy sources held: waits for the compute stream,
  // whose copies have then all run, and lets them go.  Never within a
  // capture (a wait would end it).
  void LetGoOfHeldIfMany() {
    if (held_.size() <= kMaxHeld) return;
    Check(cudaStreamSynchronize(compute_), index_, "copying input");
    held_.clear();
  }

  // Whether `p` is page-locked host memory, which the GPU copies from
  // asynchronously (InputMemory()'s, or pinned by anyone else).  Our own
  // pinned blocks (every batch the pipeline delivers) are told by the
  // allocator's lookup; only other memory costs a driver call.
  bool IsPinned(const void* p) const {
    return pinned_alloc_->Owns(p) || PinnedElsewhere(p);
  }
  static bool PinnedElsewhere(const void* p) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();  // clears the error it leaves
      return false;
    }
    return a.type == cudaMemoryTypeHost;
  }

  // `t` (in HostNumeric's form) as Prefetch staged it: a view of the slot's
  // device buffer, once the compute stream has waited for the input copy.  The
  // view holds the slot's lease, so a slot whose tensors are still held gets a
  // new buffer instead of being overwritten.
  std::optional<Tensor> FromSlots(const Tensor& t) {
    if (auto view = InPlaceView(t)) return view;
    // The staged batch's copy was waited for when Prefetch took it.
    if (stage_current_ != nullptr) {
      if (auto view = ViewIn(*stage_current_, t)) return view;
    }
    for (Slot& slot : slots_) {
      if (auto view = ViewIn(slot, t)) {
        // Captured steps waited for every slot's copy in BeginStep: a
        // captured wait for an event recorded outside is not allowed.
        if (!capturing_) WaitForCopy(slot);
        return view;
      }
    }
    return std::nullopt;
  }
  // The view of the slot's device buffer that holds `t`, if it copied `t`.
  static std::optional<Tensor> ViewIn(const Slot& slot, const Tensor& t) {
    for (const Slot::Entry& e : slot.entries) {
      if (e.host.raw_data() == t.raw_data() && e.host.dtype() == t.dtype() &&
          e.host.shape() == t.shape()) {
        return Tensor::View(e.host.dtype(), e.host.shape(),
                            slot.device.raw_data() + e.offset, slot.lease,
                            Device::kCuda);
      }
    }
    return std::nullopt;
  }

  static cuda::PoolShape PoolShapeOf(const Window2D& g) {
    return {g.batch,    g.in_h,     g.in_w,     g.in_c,
            g.out_h,    g.out_w,    g.window_h, g.window_w,
            g.stride_h, g.stride_w, g.pad_top,  g.pad_left};
  }

  ConvPlan& Plan(const Window2D& g) {
    const std::array<int64_t, 12> key{
        g.batch,    g.in_h,     g.in_w,     g.in_c,
        g.window_h, g.window_w, g.stride_h, g.stride_w,
        g.out_c,    g.pad_top,  g.pad_left, static_cast<int64_t>(g.padding)};
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    StopCapture();  // finding the algorithms runs and waits for the GPU
    ConvPlan p;
    // cuDNN's output size with symmetric padding pad_top/pad_left.
    const int64_t sym_h =
        (g.in_h + 2 * g.pad_top - g.window_h) / g.stride_h + 1;
    const int64_t sym_w =
        (g.in_w + 2 * g.pad_left - g.window_w) / g.stride_w + 1;
    p.explicit_pad = sym_h != g.out_h || sym_w != g.out_w;
    int64_t pad_h = g.pad_top, pad_w = g.pad_left;
    p.cudnn_in_h = g.in_h;
    p.cudnn_in_w = g.in_w;
    if (p.explicit_pad) {
      p.pad_bottom = std::max<int64_t>(
          (g.out_h - 1) * g.stride_h + g.window_h - g.in_h - g.pad_top, 0);
      p.pad_right = std::max<int64_t>(
          (g.out_w - 1) * g.stride_w + g.window_w - g.in_w - g.pad_left, 0);
      p.cudnn_in_h = g.in_h + g.pad_top + p.pad_bottom;
      p.cudnn_in_w = g.in_w + g.pad_left + p.pad_right;
      pad_h = pad_w = 0;
    }
    const std::string what = fmt::format(
        "planning a {}x{} convolution of [{}, {}, {}, {}] into {} channels",
        g.window_h, g.window_w, g.batch, g.in_h, g.in_w, g.in_c, g.out_c);
    Check(cudnnCreateTensorDescriptor(&p.x), index_, what);
    Check(cudnnCreateTensorDescriptor(&p.y), index_, what);
    Check(cudnnCreateFilterDescriptor(&p.w), index_, what);
    Check(cudnnSetTensor4dDescriptor(p.x, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT,
                                     int(g.batch), int(g.in_c),
                                     int(p.cudnn_in_h), int(p.cudnn_in_w)),
          index_, what);
    Check(cudnnSetTensor4dDescriptor(p.y, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT,
                                     int(g.batch), int(g.out_c), int(g.out_h),
                                     int(g.out_w)),
          index_, what);
    Check(cudnnSetFilter4dDescriptor(p.w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC,
                                     int(g.out_c), int(g.in_c), int(g.window_h),
                                     int(g.window_w)),
          index_, what);
    for (auto& c : p.conv) {
      Check(cudnnCreateConvolutionDescriptor(&c), index_, what);
      Check(cudnnSetConvolution2dDescriptor(
                c, int(pad_h), int(pad_w), int(g.stride_h), int(g.stride_w), 1,
                1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
            index_, what);
      Check(cudnnSetConvolutionMathType(
                c, tf32_ ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH),
            index_, what);
    }
    int n = 0, h = 0, w = 0, c = 0;
    Check(cudnnGetConvolution2dForwardOutputDim(p.conv[0], p.x, p.w, &n, &c, &h,
                                                &w),
          index_, what);
    if (h != g.out_h || w != g.out_w || c != g.out_c) {
      Fail(index_, what,
           fmt::format("cuDNN computes a {}x{}x{} output, TensorFlow {}x{}x{}",
                       h, w, c, g.out_h, g.out_w, g.out_c));
    }
    // The fastest algorithm cuDNN measures for each pass, once per shape
    // (the workspace comes from the caching allocator); without autotune,
    // cuDNN's heuristics' first choice, measured by nothing, so the same
    // on every backend and run.
    const auto fwd = Choose<cudnnConvolutionFwdAlgoPerf_t>(
        [&](int n, int* found, auto* perf) {
          return autotune_
                     ? cudnnFindConvolutionForwardAlgorithm(
                           cudnn_, p.x, p.w, p.conv[0], p.y, n, found, perf)
                     : cudnnGetConvolutionForwardAlgorithm_v7(
                           cudnn_, p.x, p.w, p.conv[0], p.y, n, found, perf);
        },
        p.conv[0], what);
    p.fwd_algo = fwd.algo;
    p.fwd_ws = fwd.memory;
    const auto data = Choose<cudnnConvolutionBwdDataAlgoPerf_t>(
        [&](int n, int* found, auto* perf) {
          return autotune_
                     ? cudnnFindConvolutionBackwardDataAlgorithm(
                           cudnn_, p.w, p.y, p.conv[1], p.x, n, found, perf)
                     : cudnnGetConvolutionBackwardDataAlgorithm_v7(
                           cudnn_, p.w, p.y, p.conv[1], p.x, n, found, perf);
        },
        p.conv[1], what);
    p.data_algo = data.algo;
    p.data_ws = data.memory;
    const auto filter = Choose<cudnnConvolutionBwdFilterAlgoPerf_t>(
        [&](int n, int* found, auto* perf) {
          return autotune_
                     ? cudnnFindConvolutionBackwardFilterAlgorithm(
                           cudnn_, p.x, p.y, p.conv[2], p.w, n, found, perf)
                     : cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                           cudnn_, p.x, p.y, p.conv[2], p.w, n, found, perf);
        },
        p.conv[2], what);
    p.filter_algo = filter.algo;
    p.filter_ws = filter.memory;
    if (!autotune_) {
      // A heuristic's workspace figure is an estimate: asked for exactly,
      // with the math type Choose set.
      Check(cudnnGetConvolutionForwardWorkspaceSize(cudnn_, p.x, p.w, p.conv[0],
                                                    p.y, p.fwd_algo, &p.fwd_ws),
            index_, what);
      Check(cudnnGetConvolutionBackwardDataWorkspaceSize(
                cudnn_, p.w, p.y, p.conv[1], p.x, p.data_algo, &p.data_ws),
            index_, what);
      Check(cudnnGetConvolutionBackwardFilterWorkspaceSize(
                cudnn_, p.x, p.y, p.conv[2], p.w, p.filter_algo, &p.filter_ws),
            index_, what);
    }
    return plans_.emplace(key, p).first->second;
  }

  // The first algorithm `find` (a cudnnFind*Algorithm call, fastest
  // first, or a cudnnGet*Algorithm_v7 call, cuDNN's heuristics' order)
  // lists that fits the workspace limit and the math allowed; `conv`
  // takes its math type.
  template <typename Perf, typename Find>
  Perf Choose(const Find& find, cudnnConvolutionDescriptor_t conv,
              const std::string& what) {
    constexpr int kAlgos = 8;
    constexpr size_t kMaxWorkspace = size_t{1} << 30;
    Perf perf[kAlgos];
    int found = 0;
    Check(find(kAlgos, &found, perf), index_, what);
    for (int i = 0; i < found; ++i) {
      if (perf[i].status == CUDNN_STATUS_SUCCESS &&
          perf[i].memory <= kMaxWorkspace &&
          (tf32_ || perf[i].mathType != CUDNN_TENSOR_OP_MATH)) {
        Check(cudnnSetConvolutionMathType(conv, perf[i].mathType), index_,
              what);
        return perf[i];
      }
    }
    Fail(index_, what, "cuDNN found no algorithm");
  }

  static void Destroy(ConvPlan& p) {
    cudnnDestroyTensorDescriptor(p.x);
    cudnnDestroyTensorDescriptor(p.y);
    cudnnDestroyFilterDescriptor(p.w);
    for (auto& c : p.conv) cudnnDestroyConvolutionDescriptor(c);
  }

  const int index_;
  const bool tf32_;
  const bool autotune_;  // cudnnFind (measured) or heuristics (not)
  std::string device_name_;
  cudaStream_t compute_ = nullptr, copy_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  std::shared_ptr<CachingAllocator> device_alloc_, pinned_alloc_;
  // Step graphs: on; the compute stream is capturing; steps begun since
  // they were turned on; the executable graph of the last captured step.
  bool graphs_ = false;
  bool capturing_ = false;
  bool step_captured_ = false;  // this step began a capture
  int ended_early_in_row_ = 0;  // steps whose capture a call ended early
  static constexpr int kMaxEndedEarlyInRow = 3;
  int64_t graph_steps_ = 0;
  cudaGraphExec_t exec_ = nullptr;
  StepGraphStats graph_stats_;
  // Pinned sources of ToDevice's copies that may not have run yet: held
  // until the compute stream is next waited for (at most kMaxHeld).
  static constexpr size_t kMaxHeld = 64;
  std::vector<Tensor> held_;
  cuda::DeviceError* err_host_ = nullptr;
  cuda::DeviceError* err_dev_ = nullptr;
  std::array<Slot, 3> slots_;
  uint64_t next_slot_ = 0;
  // Staging (InputStager): two batches in a Prefetch(2)'s buffer, one in
  // its driver's hands, the step's and the step before's (its `consumed`
  // recorded when the next is taken), and one to spare.
  static constexpr size_t kStageSlots = 6;
  std::array<Slot, kStageSlots> stage_slots_;
  std::shared_ptr<CachingAllocator> stage_alloc_;  // their device buffers
  std::atomic<uint64_t> stage_generations_{0};     // stagers made
  mutable std::mutex stage_mu_;
  std::deque<Slot*> stage_free_;    // guarded by stage_mu_
  std::deque<Slot*> stage_ready_;   // guarded: staged, in order, not taken
  uint64_t newest_generation_ = 0;  // guarded
  // Prefetch calls that looked for a staged batch (guarded); a batch
  // still not taken kStaleAfter of them after it was staged never will be
  // (a Prefetch buffer deeper than that only loses staging).
  uint64_t prefetches_ = 0;
  static constexpr uint64_t kStaleAfter = 64;
  InputStats input_stats_;         // guarded
  Slot* stage_current_ = nullptr;  // the training thread's: Prefetch took
  // Input read in place (the training thread's): the batch of the step
  // being built, and those of steps queued before, each with the event
  // recorded after it; events to reuse.
  struct InPlaceBatch {
    std::vector<Tensor> hosts;
    cudaEvent_t read = nullptr;
  };
  static constexpr size_t kInPlaceMaxBytes = size_t{1} << 20;
  static constexpr size_t kMaxInPlaceRead = 8;
  bool unified_addressing_ = false;
  bool in_place_ = false;
  std::vector<Tensor> in_place_current_;
  std::deque<InPlaceBatch> in_place_read_;
  std::vector<cudaEvent_t> in_place_events_;
  std::map<std::array<int64_t, 12>, ConvPlan> plans_;
  bool log_calls_ = false;
  std::vector<LoggedCall> call_log_;
#if RECFLOW_NCCL_BUILT
  ncclComm_t nccl_ = nullptr;
  const Collective* nccl_world_ = nullptr;  // compared, never used
  int nccl_ranks_ = 0;
#endif
};

}  // namespace

std::unique_ptr<Backend> MakeCudaBackend(int index, bool allow_tf32,
                                         bool autotune) {
  return std::make_unique<CudaBackend>(index, allow_tf32, autotune);
}

}  // namespace recflow::train
