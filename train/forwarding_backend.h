// A Backend that forwards every call to another one: the base of backends
// that watch a training step's calls without changing them (train_bench's
// profiler times them by kind; tests record them).  Every kernel call goes
// through Around(kind, call), which runs it by default; a subclass may time
// it, count it or skip it, and may override any other call, calling the
// ForwardingBackend's to forward it.
//
// Ownership: shares the inner backend.  Thread safety: the inner
// backend's (one caller thread).
#ifndef RECFLOW_TRAIN_FORWARDING_BACKEND_H_
#define RECFLOW_TRAIN_FORWARDING_BACKEND_H_

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "train/backend.h"

namespace recflow::train {

class ForwardingBackend : public Backend {
 public:
  // What a kernel call computes, for Around.
  enum class CallKind { kGemmConv, kElementwise, kPooling, kOptimizer };

  // A reference to the call Around runs (valid during Around only): no
  // allocation per call, which a profiler of host overhead must not add.
  class Call {
   public:
    template <typename F>
    explicit Call(const F& f)
        : fn_(&f), run_([](const void* g) { (*static_cast<const F*>(g))(); }) {}
    void operator()() const { run_(fn_); }

   private:
    const void* fn_;
    void (*run_)(const void*);
  };

  explicit ForwardingBackend(std::shared_ptr<Backend> inner)
      : inner_(std::move(inner)) {}
  Backend& inner() { return *inner_; }

  // Runs a kernel call of `kind`.  The default runs it.
  virtual void Around(CallKind kind, const Call& call) {
    (void)kind;
    call();
  }

  Device device() const override { return inner_->device(); }
  std::string name() const override { return inner_->name(); }
  int threads() const override { return inner_->threads(); }
  std::string device_name() const override { return inner_->device_name(); }

  Tensor Allocate(DType dtype, const Shape& shape) override {
    return inner_->Allocate(dtype, shape);
  }
  Tensor ToDevice(const Tensor& t) override { return inner_->ToDevice(t); }
  Tensor ToHost(const Tensor& t) override { return inner_->ToHost(t); }
  void Prefetch(const pipeline::Element& element) override {
    inner_->Prefetch(element);
  }
  std::shared_ptr<pipeline::Allocator> InputMemory() override {
    return inner_->InputMemory();
  }
  std::function<void(const pipeline::Element&)> InputStager() override {
    return inner_->InputStager();
  }
  void SetInputInPlace(bool on) override { inner_->SetInputInPlace(on); }
  InputStats input_stats() const override { return inner_->input_stats(); }
  void Synchronize() override { inner_->Synchronize(); }

#define RECFLOW_FORWARD(kind, method, params, args)             \
  void method params override {                                 \
    Around(CallKind::kind, Call([&] { inner_->method args; })); \
  }
  RECFLOW_FORWARD(kGemmConv, Gemm,
                  (bool ta, bool tb, int64_t m, int64_t n, int64_t k, float al,
                   const float* a, const float* b, float be, float* c),
                  (ta, tb, m, n, k, al, a, b, be, c))
  RECFLOW_FORWARD(kGemmConv, GemmBiasActivation,
                  (int64_t m, int64_t n, int64_t k, const float* a,
                   const float* b, const float* bias, Activation f, float* c),
                  (m, n, k, a, b, bias, f, c))
  RECFLOW_FORWARD(kGemmConv, Conv2D,
                  (const Window2D& g, const float* x, const float* w, float* y),
                  (g, x, w, y))
  RECFLOW_FORWARD(kGemmConv, Conv2DBackward,
                  (const Window2D& g, const float* x, const float* w,
                   const float* dy, float* dx, float* dw),
                  (g, x, w, dy, dx, dw))
  RECFLOW_FORWARD(kPooling, Pool2D,
                  (Pooling k, const Window2D& g, const float* x, float* y),
                  (k, g, x, y))
  RECFLOW_FORWARD(kPooling, Pool2DBackward,
                  (Pooling k, const Window2D& g, const float* x, const float* y,
                   const float* dy, float* dx),
                  (k, g, x, y, dy, dx))
  RECFLOW_FORWARD(kPooling, Pool2DBackwardWrite,
                  (Pooling k, const Window2D& g, const float* x, const float* y,
                   const float* dy, float* dx),
                  (k, g, x, y, dy, dx))
  RECFLOW_FORWARD(kElementwise, ActivationForward,
                  (Activation f, int64_t n, const float* x, float* y),
                  (f, n, x, y))
  RECFLOW_FORWARD(kElementwise, ActivationBackward,
                  (Activation f, int64_t n, const float* y, const float* dy,
                   float b, float* dx),
                  (f, n, y, dy, b, dx))
  RECFLOW_FORWARD(kElementwise, BiasActivation,
                  (int64_t r, int64_t c, const float* b, Activation f,
                   float* y),
                  (r, c, b, f, y))
  RECFLOW_FORWARD(kElementwise, BiasActivationBackward,
                  (int64_t r, int64_t c, Activation f, const float* y,
                   const float* dy, float* dz, float* db),
                  (r, c, f, y, dy, dz, db))
  RECFLOW_FORWARD(kElementwise, Softmax,
                  (int64_t r, int64_t c, const float* x, float* y),
                  (r, c, x, y))
  RECFLOW_FORWARD(kElementwise, SoftmaxBackward,
                  (int64_t r, int64_t c, const float* y, const float* dy,
                   float* dx),
                  (r, c, y, dy, dx))
  RECFLOW_FORWARD(kElementwise, SparseSoftmaxCrossEntropy,
                  (int64_t r, int64_t c, const float* z, const int64_t* l,
                   float* losses, float* dz, float s),
                  (r, c, z, l, losses, dz, s))
  RECFLOW_FORWARD(kElementwise, SigmoidCrossEntropy,
                  (int64_t n, const float* z, const float* t, float* losses,
                   float* dz, float s),
                  (n, z, t, losses, dz, s))
  RECFLOW_FORWARD(kElementwise, Fill, (int64_t n, float v, float* y), (n, v, y))
  RECFLOW_FORWARD(kElementwise, Copy, (int64_t n, const float* x, float* y),
                  (n, x, y))
  RECFLOW_FORWARD(kElementwise, Axpby,
                  (int64_t n, float a, const float* x, float b, float* y),
                  (n, a, x, b, y))
  RECFLOW_FORWARD(kElementwise, Multiply,
                  (int64_t n, const float* x, const float* y, float* z),
                  (n, x, y, z))
  RECFLOW_FORWARD(kElementwise, BiasAdd,
                  (int64_t r, int64_t c, const float* x, const float* b,
                   float* y),
                  (r, c, x, b, y))
  RECFLOW_FORWARD(kElementwise, ColumnSum,
                  (int64_t r, int64_t c, const float* x, float b, float* o),
                  (r, c, x, b, o))
  RECFLOW_FORWARD(kElementwise, Sum,
                  (int64_t n, const float* x, float s, float* y), (n, x, s, y))
  RECFLOW_FORWARD(kElementwise, AxpyScalar,
                  (int64_t n, const float* a, const float* x, float b,
                   float* y),
                  (n, a, x, b, y))
  RECFLOW_FORWARD(kElementwise, Convert,
                  (DType d, int64_t n, const void* x, float s, float* y),
                  (d, n, x, s, y))
  RECFLOW_FORWARD(kElementwise, ToInt64,
                  (DType d, int64_t n, const void* x, int64_t* y), (d, n, x, y))
  RECFLOW_FORWARD(kElementwise, CopyBlock,
                  (int64_t r, int64_t c, const float* x, int64_t lx, float* y,
                   int64_t ly, bool acc),
                  (r, c, x, lx, y, ly, acc))
  RECFLOW_FORWARD(kElementwise, DropoutMask,
                  (int64_t n, float rate, uint64_t seed, float* m),
                  (n, rate, seed, m))
  RECFLOW_FORWARD(kElementwise, ArgMax,
                  (int64_t r, int64_t c, const float* x, int64_t* o),
                  (r, c, x, o))
  RECFLOW_FORWARD(kElementwise, GreaterThan,
                  (int64_t n, const float* x, float t, int64_t* o),
                  (n, x, t, o))
  RECFLOW_FORWARD(kElementwise, Gather,
                  (int64_t r, int64_t d, const float* t, int64_t n,
                   const int64_t* ids, float* y),
                  (r, d, t, n, ids, y))
  RECFLOW_FORWARD(kElementwise, ScatterAdd,
                  (int64_t d, int64_t n, const int64_t* ids, const float* dy,
                   float* dt),
                  (d, n, ids, dy, dt))
  RECFLOW_FORWARD(kElementwise, BatchNormForward,
                  (int64_t r, int64_t c, const float* x, const float* g,
                   const float* b, float eps, bool tr, float mom, float* mm,
                   float* mv, float* mean, float* is, float* y),
                  (r, c, x, g, b, eps, tr, mom, mm, mv, mean, is, y))
  RECFLOW_FORWARD(kElementwise, BatchNormBackward,
                  (int64_t r, int64_t c, bool tr, const float* x,
                   const float* g, const float* mean, const float* is,
                   const float* dy, float* dx, float* dg, float* db),
                  (r, c, tr, x, g, mean, is, dy, dx, dg, db))
  RECFLOW_FORWARD(kOptimizer, SgdUpdate,
                  (int64_t n, float lr, const float* g, float* w),
                  (n, lr, g, w))
  RECFLOW_FORWARD(kOptimizer, MomentumUpdate,
                  (int64_t n, float lr, float mom, bool nest, const float* g,
                   float* v, float* w),
                  (n, lr, mom, nest, g, v, w))
  RECFLOW_FORWARD(kOptimizer, AdamUpdate,
                  (int64_t n, float lr, float b1, float b2, float eps,
                   const float* g, float* m, float* v, float* w),
                  (n, lr, b1, b2, eps, g, m, v, w))
  RECFLOW_FORWARD(kOptimizer, AdamUpdateAll,
                  (std::span<const AdamVariable> vars, float lr, float b1,
                   float b2, float eps),
                  (vars, lr, b1, b2, eps))
#undef RECFLOW_FORWARD

  void AllReduceSum(Collective& world,
                    std::span<const std::span<float>> buffers) override {
    inner_->AllReduceSum(world, buffers);
  }

  void BeginStep() override { inner_->BeginStep(); }
  void EndStep() override { inner_->EndStep(); }
  void AbortStep() override { inner_->AbortStep(); }
  void SetStepGraphs(bool on) override { inner_->SetStepGraphs(on); }
  StepGraphStats step_graph_stats() const override {
    return inner_->step_graph_stats();
  }

  void StartCallLog() override { inner_->StartCallLog(); }
  void StopCallLog() override { inner_->StopCallLog(); }
  std::optional<double> TimeCallLog(int reps) override {
    return inner_->TimeCallLog(reps);
  }
  std::string MemoryReport() const override { return inner_->MemoryReport(); }
  uint64_t DeviceMallocs() const override { return inner_->DeviceMallocs(); }

 private:
  std::shared_ptr<Backend> inner_;
};

}  // namespace recflow::train

#endif  // RECFLOW_TRAIN_FORWARDING_BACKEND_H_
