// Differentiable operations on a tape: what layers, losses and models are
// written with.
//
// A Var is a value computed in this step plus how to pass a gradient back
// to its inputs.  Ops compute eagerly on a Backend; Backward(loss) walks the
// graph of Vars that led to `loss` in reverse and accumulates dL/dx into
// every Var that requires a gradient, ending in the Variables' grad
// tensors, which an Optimizer then applies.
//
//   Var h = ops::Activate(b, ops::BiasAdd(b, ops::MatMul(b, x, w), bias),
//                         Activation::kRelu);
//   Var loss = ops::SparseSoftmaxCrossEntropy(b, logits, labels);
//   ops::Backward(b, loss);
//
// Ownership: a Var shares its value (a float32 pipeline::Tensor) and keeps
// its inputs alive until it is destroyed; a step's graph is freed when its
// last Var goes.  Values of Vars are never modified once computed.
// Thread safety: a graph belongs to one thread.
#ifndef RECFLOW_TRAIN_OPS_H_
#define RECFLOW_TRAIN_OPS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "pipeline/tensor.h"
#include "train/backend.h"

namespace recflow::train {

using pipeline::DType;
using pipeline::Shape;
using pipeline::Tensor;

struct Variable;

// One value of the graph.  Internal to ops.cc and the optimizers.
struct Node {
  Tensor value;  // float32
  Tensor grad;   // dL/dvalue, allocated (zeroed) on first accumulation
  std::vector<std::shared_ptr<Node>> inputs;
  // Adds this node's gradient into its inputs' gradients.
  std::function<void(Node& self)> backward;
  bool requires_grad = false;
  Variable* variable = nullptr;  // set for reads of a Variable
};

class Var {
 public:
  Var() = default;
  explicit Var(std::shared_ptr<Node> node) : node_(std::move(node)) {}

  bool valid() const { return node_ != nullptr; }
  const Tensor& value() const { return node_->value; }
  const Shape& shape() const { return node_->value.shape(); }
  // In the backend's memory (a device pointer on a GPU backend).
  const float* data() const { return node_->value.data<float>(); }
  bool requires_grad() const { return node_->requires_grad; }
  // The gradient after Backward() (invalid when none reached this Var).
  const Tensor& grad() const { return node_->grad; }
  Node* node() const { return node_.get(); }
  const std::shared_ptr<Node>& shared() const { return node_; }

 private:
  std::shared_ptr<Node> node_;
};

// Fresh float32 storage in the backend's memory, uninitialised / zeroed.
Tensor NewFloat(Backend& b, const Shape& shape);
Tensor Zeros(Backend& b, const Shape& shape);

namespace ops {

// A value that needs no gradient (inputs, labels), brought into the
// backend's memory (Backend::ToDevice: input the backend prefetched is not
// copied again).  Non-float32 tensors (uint8 pixels, int64 ids, float64)
// are converted to float32 and multiplied by `scale` (1/255 turns bytes
// into [0, 1]).  A bytes tensor is taken as raw uint8 values
// (tf.io.decode_raw) of `shape` per element.
Var Constant(Backend& be, const Tensor& t, float scale = 1.0f);
Var DecodeRaw(Backend& be, const Tensor& bytes, const Shape& per_element,
              float scale);

// a [m, k] x b [k, n]; transposes as Backend::Gemm.
Var MatMul(Backend& be, const Var& a, const Var& b, bool transpose_a = false,
           bool transpose_b = false);
// x [..., n] + bias [n].
Var BiasAdd(Backend& be, const Var& x, const Var& bias);
Var Add(Backend& be, const Var& a, const Var& b);  // same shapes
Var Multiply(Backend& be, const Var& a, const Var& b);
Var Scale(Backend& be, const Var& x, float s);
Var Activate(Backend& be, const Var& x, Activation f);
Var Softmax(Backend& be, const Var& x);  // over the last dimension
Var Reshape(Backend& be, const Var& x, const Shape& shape);
// [batch, ...] -> [batch, rest]
Var Flatten(Backend& be, const Var& x);
// Along the last dimension; all inputs [rows, *].
Var Concat(Backend& be, std::span<const Var> parts);
// Sum / mean of all values, a scalar.
Var ReduceSum(Backend& be, const Var& x);
Var ReduceMean(Backend& be, const Var& x);

// The layers' fused forms, as TensorFlow's grappler rewrites them
// (_FusedMatMul, _FusedConv2D): f(x w + bias) and f(conv(x, filter) +
// bias) in one op, so the product's output gets its bias and activation in
// one pass and the step keeps one activation-sized tensor (and gradient)
// per layer instead of three.  `bias` may be invalid (no bias).  Same
// values and gradients as MatMul/Conv2D, BiasAdd and Activate in turn.
Var FusedMatMul(Backend& be, const Var& x, const Var& w, const Var& bias,
                Activation f);
Var FusedConv2D(Backend& be, const Var& x, const Var& filter, const Var& bias,
                Activation f, int stride_h, int stride_w, Padding padding);

// NHWC input, HWIO filter.
Var Conv2D(Backend& be, const Var& x, const Var& filter, int stride_h,
           int stride_w, Padding padding);
Var Pool2D(Backend& be, Pooling kind, const Var& x, int window_h, int window_w,
           int stride_h, int stride_w, Padding padding);
// Inverted dropout: zeroes each value with probability `rate` and scales
// the rest by 1/(1-rate); the mask comes from `seed` alone.
Var Dropout(Backend& be, const Var& x, float rate, uint64_t seed);
// Normalises over all but the last dimension.  `moving_mean`/`moving_var`
// are updated in training mode.
Var BatchNorm(Backend& be, const Var& x, const Var& gamma, const Var& beta,
              float* moving_mean, float* moving_var, bool training,
              float momentum, float epsilon);
// Rows `ids` (int64 of any shape) of `table` [rows, dim]: ids.shape + [dim].
Var Gather(Backend& be, const Var& table, const Tensor& ids);

// Losses, each the mean over the batch (a scalar).
// logits [batch, classes], labels int64 [batch] (or [batch, 1]).
Var SparseSoftmaxCrossEntropy(Backend& be, const Var& logits,
                              const Tensor& labels);
// Same shapes (labels converted to float32).
Var SigmoidCrossEntropy(Backend& be, const Var& logits, const Tensor& labels);
Var MeanSquaredError(Backend& be, const Var& predictions, const Tensor& labels);

// seed * dL/d(every Var leading to loss); loss must be a scalar.
// Accumulates into the gradients already there (Variables' grads are zeroed
// by the optimizer after each update).  A seed of 1/N gives the share of a
// mean over N data-parallel ranks (exactly the gradient divided by N when N
// is a power of two).
void Backward(Backend& be, const Var& loss, float seed = 1.0f);

}  // namespace ops
}  // namespace recflow::train

#endif  // RECFLOW_TRAIN_OPS_H_
