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
// Thread safety: a Backend runs one call at a time per caller thread and
// may use its own threads inside a call; the training loop is its only
// caller.  Calls are synchronous.
#ifndef RECFLOW_TRAIN_BACKEND_H_
#define RECFLOW_TRAIN_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "pipeline/tensor.h"
#include "train/error.h"

namespace recflow::train {

using pipeline::Device;

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
  virtual std::string name() const = 0;  // "eigen-cpu (2 threads)"
  virtual int threads() const = 0;

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

  // y = f(x) over n values (y may be x).
  virtual void ActivationForward(Activation f, int64_t n, const float* x,
                                 float* y) = 0;
  // Accumulates dx = f'(.) * dy given the forward output y.
  virtual void ActivationBackward(Activation f, int64_t n, const float* y,
                                  const float* dy, float* dx) = 0;
  // Row-wise softmax of x [rows, cols].
  virtual void Softmax(int64_t rows, int64_t cols, const float* x,
                       float* y) = 0;
  // Sparse softmax cross-entropy from logits [rows, cols] and labels in
  // [0, cols): losses[rows] and, when dlogits is not null, accumulates
  // scale * (softmax - onehot) into it.  Throws Error naming the row of a
  // label out of range.
  virtual void SparseSoftmaxCrossEntropy(int64_t rows, int64_t cols,
                                         const float* logits,
                                         const int64_t* labels, float* losses,
                                         float* dlogits, float scale) = 0;
  // Sigmoid cross-entropy from logits against targets in [0, 1] (TF's
  // numerically stable form): losses[n]; accumulates scale * (sigmoid -
  // target) into dlogits when not null.
  virtual void SigmoidCrossEntropy(int64_t n, const float* logits,
                                   const float* targets, float* losses,
                                   float* dlogits, float scale) = 0;

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
  // sum of n values
  virtual double Sum(int64_t n, const float* x) = 0;

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
  // Accumulates dx, dgamma, dbeta for a training-mode forward.
  virtual void BatchNormBackward(int64_t rows, int64_t cols, const float* x,
                                 const float* gamma, const float* mean,
                                 const float* inv_std, const float* dy,
                                 float* dx, float* dgamma, float* dbeta) = 0;

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
};

// The Eigen backend: Eigen's tensor contractions and a thread pool of
// `threads` (0: the machine's cores).
std::unique_ptr<Backend> MakeCpuBackend(int threads = 0);

}  // namespace recflow::train

#endif  // RECFLOW_TRAIN_BACKEND_H_
