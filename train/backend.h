// The kernels a training step needs, behind one interface, so that a model
// runs unchanged on the Eigen CPU backend (cpu_backend.cc) and on the
// CUDA backend (cuBLAS / cuDNN) that implements the same calls.
//
// Conventions, as TensorFlow's: float32; dense matrices are row-major;
// images are NHWC and convolution filters HWIO ([height, width, in, out]).
// Every pointer is to memory of the backend's device().  "Accumulates"
// means the result is added to what the output holds (gradients of a
// value used twice add up); otherwise the output is overwritten.
//
// Memory: Allocate() gives tensors in the backend's memory (host for the
// CPU backend, the GPU's for CUDA).  Host tensors enter with ToDevice()
// (a no-op on the CPU) and leave with ToHost(); nothing copies implicitly.
//
// Ordering: calls are ordered as made.  The CPU backend finishes each call
// before returning; the CUDA backend enqueues it on its compute stream and
// returns, so a result may be read on the host only through ToHost() (or
// after Synchronize()).  Errors found on the device (a label out of range)
// are reported by the next ToHost()/Synchronize() with the same message the
// CPU backend throws at once.
//
// Thread safety: one caller thread (the training loop); a backend may use
// its own threads or streams inside a call.
#ifndef RECFLOW_TRAIN_BACKEND_H_
#define RECFLOW_TRAIN_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "pipeline/dataset_base.h"
#include "pipeline/tensor.h"
#include "train/error.h"

namespace recflow::train {

using pipeline::Device;
using pipeline::DType;
using pipeline::Shape;
using pipeline::Tensor;

class Collective;  // train/collective.h

enum class Activation : uint8_t { kLinear, kRelu, kSigmoid, kTanh };
// "linear", "relu", "sigmoid", "tanh"; throws Error for other names.
Activation ActivationFromName(std::string_view name);
std::string_view ActivationName(Activation a);

enum class Padding : uint8_t { kSame, kValid };

// The shapes of a 2-D convolution or pooling window over NHWC input.
// Output sizes follow TensorFlow: SAME gives ceil(in / stride) with the
// padding split as TF does (the extra row/column at the bottom/right);
// VALID gives ceil((in - window + 1) / stride).
struct Window2D {
  int64_t batch = 0, in_h = 0, in_w = 0, in_c = 0;
  int64_t window_h = 0, window_w = 0;
  int64_t stride_h = 1, stride_w = 1;
  Padding padding = Padding::kValid;
  int64_t out_c = 0;  // convolutions: filters; pooling: in_c

  // Fills out_h, out_w, pad_top, pad_left; throws Error when the window
  // does not fit.
  void Resolve();
  int64_t out_h = 0, out_w = 0, pad_top = 0, pad_left = 0;
};

enum class Pooling : uint8_t { kMax, kAverage };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  // "cpu (2 threads; products: OpenBLAS 0.3.21 Zen)"
  virtual std::string name() const = 0;
  virtual int threads() const = 0;
  // What runs the kernels, for reports: the GPU's name ("NVIDIA H100 80GB
  // HBM3") or the CPU backend's name.
  virtual std::string device_name() const { return name(); }

  // --- Memory -------------------------------------------------------------
  // Fresh uninitialised numeric storage in this backend's memory.
  virtual Tensor Allocate(DType dtype, const Shape& shape) = 0;
  // `t` in this backend's memory: `t` itself when it is there already; a
  // bytes tensor whose values all have one length (decode_raw's input)
  // becomes its uint8 form (Tensor::BytesAsUInt8; other bytes: Error).
  // Input that Prefetch() staged is not copied again.
  virtual Tensor ToDevice(const Tensor& t) = 0;
  // A host copy of `t` (waits for the work that computes it); `t` itself
  // when it is on the host.
  virtual Tensor ToHost(const Tensor& t) = 0;
  // Starts copying `element`'s numeric components (and fixed-length bytes)
  // to the device while earlier calls compute, so that a later ToDevice of
  // the same tensors finds them there (TF's prefetch_to_device).  Host
  // backends ignore it.
  virtual void Prefetch(const pipeline::Element& element) { (void)element; }
  // Host memory the input should arrive in, for the pipeline's
  // IteratorOptions::output_memory: the CUDA backend's pinned memory, from
  // which Prefetch and ToDevice copy without packing the tensors into a
  // pinned buffer first (so the pipeline's threads make the one host copy,
  // not the thread that launches the step).  Null (the default): any host
  // memory serves.
  virtual std::shared_ptr<pipeline::Allocator> InputMemory() { return nullptr; }
  // A function for the pipeline's IteratorOptions::prepare: called with
  // each batch on the thread that made it (the Iterator's last Prefetch's
  // driver; TF's prefetch_to_device), it copies the batch to the device
  // there and waits for the copy, so that Prefetch() of that batch on the
  // training thread finds it on the device and only takes it, instead of
  // issuing the copies itself.  Each call of InputStager
  // makes a function for one Iterator: batches staged by an Iterator made
  // before it and never delivered are let go once it stages.  Thread-safe
  // against every other call of the backend; the backend must outlive the
  // Iterators made with it.  A batch it cannot stage (its staging buffers
  // all taken or still held) is copied by Prefetch as without it; a staged
  // batch not given to Prefetch within 64 calls (taken from the iterator
  // and not trained on) is let go.  Null (the default): host backends,
  // nothing to stage.
  virtual std::function<void(const pipeline::Element&)> InputStager() {
    return nullptr;
  }
  // Batches Prefetch is given from then on, when all their tensors are in
  // pinned host memory (InputMemory's) and small (at most 1 MiB together),
  // are read by the step's kernels where they are instead of being copied
  // to the device first (zero-copy: the GPU reads them over the bus, once,
  // in the first kernel that takes them): no copy, event or stream wait on
  // any thread but one event recorded after the step, which tells when the
  // batch's host memory may go back to the pipeline.  For small batches of
  // launch-bound steps, where every call on the host counts; larger ones
  // are copied (InputStager, or in Prefetch) as before.  ToDevice of such
  // a tensor returns a device tensor that views its host memory and holds
  // it.  The CUDA backend only, on devices with unified addressing (every
  // 64-bit one); others ignore it.
  virtual void SetInputInPlace(bool /*on*/) {}
  // Batches staged by InputStager functions, taken staged by Prefetch, not
  // staged (no free staging buffer), and read in place (SetInputInPlace):
  // 0 on host backends.
  struct InputStats {
    uint64_t staged = 0;
    uint64_t taken = 0;
    uint64_t unstaged = 0;
    uint64_t in_place = 0;
  };
  virtual InputStats input_stats() const { return {}; }
  // Waits for every call made so far; throws a pending device error.
  virtual void Synchronize() {}

  // C[m, n] = alpha * op(A) op(B) + beta * C, row-major; op(A) is A
  // ([m, k]) or, with transpose_a, the transpose of A stored as [k, m].
  virtual void Gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n,
                    int64_t k, float alpha, const float* a, const float* b,
                    float beta, float* c) = 0;

  // y = conv(x, w): x [batch, in_h, in_w, in_c], w [wh, ww, in_c, out_c],
  // y [batch, out_h, out_w, out_c].
  virtual void Conv2D(const Window2D& g, const float* x, const float* w,
                      float* y) = 0;
  // Accumulates dL/dx and dL/dw from dy.  Either output may be null.
  virtual void Conv2DBackward(const Window2D& g, const float* x, const float* w,
                              const float* dy, float* dx, float* dw) = 0;
  // Pooling (TensorFlow's: average over the window's cells inside the
  // input; max ignores padding).
  virtual void Pool2D(Pooling kind, const Window2D& g, const float* x,
                      float* y) = 0;
  // Accumulates dx.  Max pooling routes each dy to the first maximum of
  // its window.
  virtual void Pool2DBackward(Pooling kind, const Window2D& g, const float* x,
                              const float* y, const float* dy, float* dx) = 0;

  // The same gradient written into dx rather than added (every value of
  // dx is set), for a dx nothing has added to yet: the pass that zeroes a
  // fresh gradient is saved.  The default zeroes dx, then Pool2DBackward.
  virtual void Pool2DBackwardWrite(Pooling kind, const Window2D& g,
                                   const float* x, const float* y,
                                   const float* dy, float* dx);

  // y = f(x) over n values (y may be x).
  virtual void ActivationForward(Activation f, int64_t n, const float* x,
                                 float* y) = 0;
  // dx = f'(.) * dy + beta * dx given the forward output y; beta is 0 (dx
  // is written, never read) or 1 (it accumulates).
  virtual void ActivationBackward(Activation f, int64_t n, const float* y,
                                  const float* dy, float beta, float* dx) = 0;
  // Row-wise softmax of x [rows, cols].
  virtual void Softmax(int64_t rows, int64_t cols, const float* x,
                       float* y) = 0;
  // Accumulates dx = y * (dy - sum_c(dy * y)) per row.
  virtual void SoftmaxBackward(int64_t rows, int64_t cols, const float* y,
                               const float* dy, float* dx) = 0;
  // Sparse softmax cross-entropy from logits [rows, cols] and labels in
  // [0, cols): losses[rows] and, when dlogits is not null, writes
  // scale * (softmax - onehot) into it.  Throws Error naming the row of a
  // label out of range.
  virtual void SparseSoftmaxCrossEntropy(int64_t rows, int64_t cols,
                                         const float* logits,
                                         const int64_t* labels, float* losses,
                                         float* dlogits, float scale) = 0;
  // Sigmoid cross-entropy from logits against targets in [0, 1] (TF's
  // numerically stable form): losses[n]; writes scale * (sigmoid - target)
  // into dlogits when not null.
  virtual void SigmoidCrossEntropy(int64_t n, const float* logits,
                                   const float* targets, float* losses,
                                   float* dlogits, float scale) = 0;

  // The epilogue of a dense or convolution layer, in place over y [rows,
  // cols]: y = f(y + b[c]) (no bias when b is null).  The default is
  // BiasAdd then ActivationForward; a backend may do it in one pass.
  virtual void BiasActivation(int64_t rows, int64_t cols, const float* b,
                              Activation f, float* y);
  // A dense layer's forward: C[m, n] = f(A B + b) with A [m, k] and B
  // [k, n] row-major (b null: no bias).  The default is Gemm then
  // BiasActivation; a backend may apply the epilogue to each block of C
  // while the block is still in the cache of the thread that computed it.
  virtual void GemmBiasActivation(int64_t m, int64_t n, int64_t k,
                                  const float* a, const float* b,
                                  const float* bias, Activation f, float* c);
  // Its gradient: dz = f'(.) * dy from the epilogue's output y, written
  // (not accumulated; dz may be dy only when f is linear), and, when db is
  // not null, db[c] += sum_r dz[r, c].
  virtual void BiasActivationBackward(int64_t rows, int64_t cols, Activation f,
                                      const float* y, const float* dy,
                                      float* dz, float* db);

  // Elementwise and reductions.
  virtual void Fill(int64_t n, float value, float* y) = 0;
  virtual void Copy(int64_t n, const float* x, float* y) = 0;
  // y = alpha * x + beta * y
  virtual void Axpby(int64_t n, float alpha, const float* x, float beta,
                     float* y) = 0;
  // z = x * y elementwise (z may alias either).
  virtual void Multiply(int64_t n, const float* x, const float* y,
                        float* z) = 0;
  // y[r, c] = x[r, c] + b[c]
  virtual void BiasAdd(int64_t rows, int64_t cols, const float* x,
                       const float* b, float* y) = 0;
  // out[c] = sum_r x[r, c] + beta * out[c]
  virtual void ColumnSum(int64_t rows, int64_t cols, const float* x, float beta,
                         float* out) = 0;
  // y[0] = scale * (sum of n values of x), y in backend memory.
  virtual void Sum(int64_t n, const float* x, float scale, float* y) = 0;
  // y[i] = alpha[0] * x[i] + beta * y[i], with alpha[0] alone where x is
  // null; alpha in backend memory (a gradient that never visits the host).
  // beta is 0 (y is written, never read) or 1 (it accumulates).
  virtual void AxpyScalar(int64_t n, const float* alpha, const float* x,
                          float beta, float* y) = 0;
  // y[i] = scale * float(x[i]) for x of numeric `dtype` (not bytes).
  virtual void Convert(DType dtype, int64_t n, const void* x, float scale,
                       float* y) = 0;
  // ids[i] = int64(x[i]) for x of integer `dtype` (int32, int64, uint8).
  virtual void ToInt64(DType dtype, int64_t n, const void* x, int64_t* y) = 0;
  // Copies a [rows, cols] block: y[r * ldy + c] (+)= x[r * ldx + c].
  virtual void CopyBlock(int64_t rows, int64_t cols, const float* x,
                         int64_t ldx, float* y, int64_t ldy,
                         bool accumulate) = 0;
  // Inverted-dropout mask: mask[i] = 0 with probability `rate`, else
  // 1 / (1 - rate), from DropoutBits(seed, i) alone (the same mask on
  // every backend).
  virtual void DropoutMask(int64_t n, float rate, uint64_t seed,
                           float* mask) = 0;
  // Row-wise argmax of x [rows, cols] (the first maximum), as int64.
  virtual void ArgMax(int64_t rows, int64_t cols, const float* x,
                      int64_t* out) = 0;
  // out[i] = x[i] > threshold ? 1 : 0, as int64.
  virtual void GreaterThan(int64_t n, const float* x, float threshold,
                           int64_t* out) = 0;

  // Rows of a table: y[i] = table[ids[i]] for rows of `dim` floats; ids
  // are checked against `rows` (Error names the position).
  virtual void Gather(int64_t rows, int64_t dim, const float* table, int64_t n,
                      const int64_t* ids, float* y) = 0;
  // Accumulates dtable[ids[i]] += dy[i].
  virtual void ScatterAdd(int64_t dim, int64_t n, const int64_t* ids,
                          const float* dy, float* dtable) = 0;

  // Batch normalisation over all but the last dimension ([rows, cols]).
  // Training: normalises with the batch's mean and variance, writes them
  // to mean/inv_std, and updates moving averages with `momentum` (TF's
  // Keras default 0.99).  Inference: uses moving_mean/moving_var.
  virtual void BatchNormForward(int64_t rows, int64_t cols, const float* x,
                                const float* gamma, const float* beta,
                                float epsilon, bool training, float momentum,
                                float* moving_mean, float* moving_var,
                                float* mean, float* inv_std, float* y) = 0;
  // Accumulates dx, dgamma, dbeta (each may be null) for a forward in
  // the same mode; mean/inv_std are what that forward wrote.  In inference
  // mode the map is affine per channel: dx = dy gamma inv_std.
  virtual void BatchNormBackward(int64_t rows, int64_t cols, bool training,
                                 const float* x, const float* gamma,
                                 const float* mean, const float* inv_std,
                                 const float* dy, float* dx, float* dgamma,
                                 float* dbeta) = 0;

  // Optimizer updates (TensorFlow's formulas, applied in place).
  virtual void SgdUpdate(int64_t n, float lr, const float* g, float* w) = 0;
  // v = momentum * v + g; w -= lr * v (nesterov: w -= lr * (g + momentum *
  // v)).
  virtual void MomentumUpdate(int64_t n, float lr, float momentum,
                              bool nesterov, const float* g, float* v,
                              float* w) = 0;
  // m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; w -= lr_t m / (sqrt(v) +
  // eps) with lr_t = lr sqrt(1-b2^t) / (1-b1^t) computed by the caller.
  virtual void AdamUpdate(int64_t n, float lr_t, float beta1, float beta2,
                          float epsilon, const float* g, float* m, float* v,
                          float* w) = 0;
  // One variable of AdamUpdateAll: n values of gradient, moments, weights.
  struct AdamVariable {
    int64_t n = 0;
    float* g = nullptr;
    float* m = nullptr;
    float* v = nullptr;
    float* w = nullptr;
  };
  // AdamUpdate on every variable with the same lr_t, each gradient then
  // set to zero (the next step accumulates into it): one pass over each
  // variable's memory instead of two, and one call for all the variables
  // (one launch on a GPU, where the per-variable updates and zeroings were
  // a third of a small model's launches).  The default calls AdamUpdate
  // and Fill per variable.
  virtual void AdamUpdateAll(std::span<const AdamVariable> vars, float lr_t,
                             float beta1, float beta2, float epsilon);

  // --- Data-parallel training ----------------------------------------------
  // Sums each of `buffers` (floats in this backend's memory) over the ranks
  // of `world`, in place: every rank gets the sums.  Every rank calls it
  // with buffers of the same sizes in the same order (the collective's
  // contract), and it is ordered after the calls made so far.
  // Host memory (the default): `world`'s own all-reduce, a buffer of
  // kInPlaceAllReduceValues floats or more where it is, the smaller ones
  // packed into one buffer so that together they cost one collective's
  // latency (Horovod's fusion buffer).  The CUDA backend: NCCL on its
  // compute stream, the buffers in one NCCL group, over a communicator
  // made at the first call from a unique id that `world` broadcasts (one
  // GPU per rank; every later call must pass the same world).  A device
  // backend without a device all-reduce (a CUDA build without NCCL)
  // throws Error saying so.
  static constexpr int64_t kInPlaceAllReduceValues = 16384;
  virtual void AllReduceSum(Collective& world,
                            std::span<const std::span<float>> buffers);

  // --- Steps ----------------------------------------------------------------
  // A training step's calls come between BeginStep and EndStep (the
  // Estimator brackets each training step so; AbortStep ends one that an
  // exception left).  A backend may run them as one unit.  The CUDA
  // backend with step graphs on (SetStepGraphs) captures the step's work
  // on its compute stream into a CUDA graph and launches it at EndStep:
  // one launch for the step's kernels, library calls and copies, whose
  // own launches cost a small model more than the kernels themselves.
  // The executable graph of the step before is updated in place when only
  // kernel parameters changed (pointers, step sizes), and made anew when
  // the work changed (another batch shape).  A call that needs the host to
  // wait or to copy from pageable memory (ToHost, Synchronize, Prefetch, a
  // ToDevice of input Prefetch did not stage, a first convolution plan or
  // NCCL communicator) ends the capture: what was captured is launched
  // and the rest of the step runs call by call (after three such steps in
  // a row, every step does).  The first kWarmUpSteps steps after
  // SetStepGraphs(true) run call by call (plans, variables).
  // Results are those of the same calls made one by one.  Host backends
  // ignore all of this.
  virtual void BeginStep() {}
  virtual void EndStep() {}
  virtual void AbortStep() {}
  virtual void SetStepGraphs(bool on) { (void)on; }
  static constexpr int kWarmUpSteps = 2;
  // Steps run as one launched graph so far, and of them the graphs made
  // anew (the rest updated the graph before).
  struct StepGraphStats {
    uint64_t launches = 0;
    uint64_t instantiations = 0;
    uint64_t ended_early = 0;  // captures a waiting call ended mid-step
    // The launching thread's seconds in EndStep's graph calls: ending the
    // capture, updating (or instantiating) the executable graph, launching.
    double end_capture_seconds = 0;
    double update_seconds = 0;
    double launch_seconds = 0;
    uint64_t nodes = 0;  // of the graph captured last
  };
  virtual StepGraphStats step_graph_stats() const { return {}; }

  // --- Measurement (train_bench) -------------------------------------------
  // Logs the library calls (cuBLAS GEMMs, cuDNN convolutions) made between
  // StartCallLog and StopCallLog; TimeCallLog(reps) replays exactly those
  // calls alone, on fresh buffers of the same shapes, and returns the
  // seconds one replay takes (nullopt: this backend keeps no log).
  virtual void StartCallLog() {}
  virtual void StopCallLog() {}
  virtual std::optional<double> TimeCallLog(int reps) {
    (void)reps;
    return std::nullopt;
  }
  // The algorithms chosen for each convolution shape planned so far, one
  // entry per shape in the shapes' order ("8x28x28x1 k5x5->32: fwd 1 data
  // 1 filter 0"; none for host backends): two backends that trained the
  // same model on the same shapes differ here only where their choices
  // did (cudnnFind measures, with the noise of any measurement).  Not
  // thread-safe against the backend's steps.
  virtual std::vector<std::string> ConvolutionChoices() const { return {}; }
  // One line on the backend's memory ("" for host memory).
  virtual std::string MemoryReport() const { return ""; }
  // How often the device allocator had to ask the driver for memory.
  virtual uint64_t DeviceMallocs() const { return 0; }

 protected:
  // Throws Error when dz aliases dy for an activation other than linear
  // (BiasActivationBackward's contract, checked by every implementation).
  static void CheckEpilogueAliasing(Activation f, const float* dy,
                                    const float* dz);
};

// The bits behind DropoutMask: a counter-based hash of (seed, i), so any
// backend draws element i's mask without drawing the ones before it.
inline uint64_t DropoutBits(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The CPU backend: Eigen's GEMM kernels and loops of its own, split over a
// team of `threads` threads (0: the machine's cores) when an operation is
// large enough to gain.  Results are the same on every run with the same
// `threads`; another thread count may differ in the last bits.
std::unique_ptr<Backend> MakeCpuBackend(int threads = 0);

// Which backend a RunConfig.device / --device string names: "cpu",
// "cuda" (GPU 0) or "cuda:N".  Throws Error for anything else.
struct DeviceSpec {
  Device device = Device::kCpu;
  int index = 0;
  // "cuda:N" named the GPU; "cuda" did not (GPU 0 alone; one GPU per local
  // rank under MPI, the Estimator's choice).
  bool index_given = false;
  std::string ToString() const;  // "cpu", "cuda:0"
};
DeviceSpec ParseDevice(std::string_view text);

// Whether this build has the CUDA backend (RECFLOW_CUDA) .
bool CudaBuilt();
// Whether its gradients can be all-reduced across ranks: the CUDA backend
// built with NCCL (found next to the CUDA toolkit or in the system's
// include and library directories).
bool NcclBuilt();
// The CUDA backend on GPU `index`: cuBLAS, cuDNN and kernels of its own on
// one compute stream and one copy stream, with a caching device allocator
// and pinned staging for input.  `allow_tf32`: matrix products and
// convolutions may use TF32 tensor cores (TensorFlow's default on Ampere
// and later; false: full float32, as the parity tests run).  Throws
// CudaUnavailable (one line: no driver, no such GPU, or a build without
// CUDA) when it cannot run.  `autotune`: each convolution shape's
// algorithms are the fastest cuDNN measures (cudnnFind*, the default, as
// TensorFlow's autotune); false: cuDNN's heuristics' first choice, measured
// by nothing, so the same on every backend and run (as
// TF_CUDNN_USE_AUTOTUNE=0).
std::unique_ptr<Backend> MakeCudaBackend(int index = 0, bool allow_tf32 = true,
                                         bool autotune = true);
// A backend for `spec` (threads: the CPU backend's threads).  For a GPU,
// RECFLOW_CUDA_TF32=0 turns TF32 off and RECFLOW_CUDNN_AUTOTUNE=0 autotune
// (MakeCudaBackend's allow_tf32 and autotune).
std::unique_ptr<Backend> MakeBackend(const DeviceSpec& spec, int threads = 0);

// No usable GPU: the CLI prints what() as one line and exits with code 2.
class CudaUnavailable : public Error {
 public:
  using Error::Error;
};

}  // namespace recflow::train

#endif  // RECFLOW_TRAIN_BACKEND_H_
