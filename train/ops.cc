#include "train/ops.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "pipeline/dataset_base.h"
#include "train/variables.h"

namespace recflow::train {

Tensor NewFloat(Backend& b, const Shape& shape) {
  return b.Allocate(DType::kFloat32, shape);
}

Tensor Zeros(Backend& b, const Shape& shape) {
  Tensor t = NewFloat(b, shape);
  b.Fill(t.num_elements(), 0.0f, t.mutable_data<float>());
  return t;
}

namespace {

using NodePtr = std::shared_ptr<Node>;

// Whether nothing has added to n's gradient yet (Grad would zero it).
bool Fresh(const Node& n) {
  return !n.grad.valid() || n.grad.num_elements() != n.value.num_elements();
}

// The gradient buffer of `n`, zeroed on first use.
float* Grad(Backend& be, Node& n) {
  if (Fresh(n)) {
    n.grad = Zeros(be, n.value.shape());
  }
  return n.grad.mutable_data<float>();
}

// The gradient buffer of `n` for a contribution that sets every value:
// when nothing has added to it yet it is allocated and not zeroed, and
// *beta is 0 (the contribution writes it: one pass, and on a GPU one
// launch, instead of a zeroing and an add); otherwise *beta is 1 (it adds).
float* GradToWrite(Backend& be, Node& n, float* beta) {
  if (Fresh(n)) {
    n.grad = NewFloat(be, n.value.shape());
    *beta = 0.0f;
  } else {
    *beta = 1.0f;
  }
  return n.grad.mutable_data<float>();
}

const float* GradIn(const Node& n) { return n.grad.data<float>(); }

// A node computed from `inputs`; requires a gradient when any input does.
NodePtr MakeNode(Tensor value, std::vector<NodePtr> inputs) {
  auto n = std::make_shared<Node>();
  n->value = std::move(value);
  for (const NodePtr& in : inputs) n->requires_grad |= in->requires_grad;
  n->inputs = std::move(inputs);
  return n;
}

void CheckRank(const Var& x, int rank, const char* op) {
  if (x.shape().rank() != rank) {
    throw Error(fmt::format("{}: expected a rank-{} input, got shape {}", op,
                            rank, x.shape().ToString()));
  }
}

int64_t LastDim(const Shape& s) { return s.rank() == 0 ? 1 : s[s.rank() - 1]; }

// Any numeric tensor, in the backend's memory, as float32 times `scale`.
Tensor ToFloat(Backend& be, const Tensor& t, float scale) {
  if (t.dtype() == DType::kBytes) {
    throw Error(
        "a bytes tensor cannot be used as numbers; decode it first "
        "(ops::DecodeRaw)");
  }
  Tensor in = be.ToDevice(t);
  if (in.dtype() == DType::kFloat32 && scale == 1.0f) return in;
  Tensor out = NewFloat(be, t.shape());
  be.Convert(in.dtype(), in.num_elements(), in.raw_data(), scale,
             out.mutable_data<float>());
  return out;
}

// Ids or labels as int64 [rows] in the backend's memory (accepts [rows] or
// [rows, 1] of any integer type).
Tensor AsInt64(Backend& be, const Tensor& labels, int64_t rows,
               const char* op) {
  if (labels.num_elements() != rows) {
    throw Error(fmt::format("{}: {} labels for a batch of {} (labels shape {})",
                            op, labels.num_elements(), rows,
                            labels.shape().ToString()));
  }
  switch (labels.dtype()) {
    case DType::kInt64:
    case DType::kInt32:
    case DType::kUInt8:
      break;
    default:
      throw Error(fmt::format("{}: labels must be integers, got {}", op,
                              pipeline::DTypeName(labels.dtype())));
  }
  Tensor in = be.ToDevice(labels);
  if (in.dtype() == DType::kInt64) return in;
  Tensor out = be.Allocate(DType::kInt64, Shape{rows});
  be.ToInt64(in.dtype(), rows, in.raw_data(), out.mutable_data<int64_t>());
  return out;
}

// sum(losses) * scale (scale = 1/n: the mean) as a scalar Var whose
// backward passes `dlogits` (the backend computed it, already scaled, with
// the forward pass) on to `logits`.
Var MeanLoss(Backend& be, const Var& logits, const Tensor& losses, float scale,
             Tensor dlogits) {
  Tensor y = NewFloat(be, Shape{});
  be.Sum(losses.num_elements(), losses.data<float>(), scale,
         y.mutable_data<float>());
  auto node = MakeNode(std::move(y), {logits.shared()});
  node->backward = [&be, dlogits = std::move(dlogits)](Node& self) {
    if (!self.inputs[0]->requires_grad) return;
    float beta = 1.0f;
    float* d = GradToWrite(be, *self.inputs[0], &beta);
    be.AxpyScalar(dlogits.num_elements(), GradIn(self), dlogits.data<float>(),
                  beta, d);
  };
  return Var(std::move(node));
}

// The window of a convolution of x [batch, h, w, in] by filter [wh, ww,
// in, out].
Window2D ConvWindow(const Var& x, const Var& filter, int stride_h, int stride_w,
                    Padding padding) {
  CheckRank(x, 4, "conv2d");
  CheckRank(filter, 4, "conv2d filter");
  if (filter.shape()[2] != x.shape()[3]) {
    throw Error(fmt::format(
        "conv2d: filter {} expects {} input channels, the input {} has {}",
        filter.shape().ToString(), filter.shape()[2], x.shape().ToString(),
        x.shape()[3]));
  }
  Window2D g;
  g.batch = x.shape()[0];
  g.in_h = x.shape()[1];
  g.in_w = x.shape()[2];
  g.in_c = x.shape()[3];
  g.window_h = filter.shape()[0];
  g.window_w = filter.shape()[1];
  g.out_c = filter.shape()[3];
  g.stride_h = stride_h;
  g.stride_w = stride_w;
  g.padding = padding;
  g.Resolve();
  return g;
}

// [m, n] = op(a) [m, k] x op(b) [k, n]; throws Error when they do not fit.
struct Dims {
  int64_t m, n, k;
};
Dims MatMulDims(const Var& a, const Var& b, bool ta, bool tb) {
  CheckRank(a, 2, "matmul");
  CheckRank(b, 2, "matmul");
  const int64_t k = ta ? a.shape()[0] : a.shape()[1];
  if ((tb ? b.shape()[1] : b.shape()[0]) != k) {
    throw Error(fmt::format("matmul: shapes {} and {} do not fit{}{}",
                            a.shape().ToString(), b.shape().ToString(),
                            ta ? " (a transposed)" : "",
                            tb ? " (b transposed)" : ""));
  }
  return {ta ? a.shape()[1] : a.shape()[0], tb ? b.shape()[0] : b.shape()[1],
          k};
}

// A bias (when valid) of `cols` values for an input of shape `of`.
void CheckBias(const Var& bias, int64_t cols, const Shape& of) {
  if (bias.valid() && (bias.shape().rank() != 1 || bias.shape()[0] != cols)) {
    throw Error(fmt::format("bias_add: bias {} does not fit input {}",
                            bias.shape().ToString(), of.ToString()));
  }
}

// The gradient before a fused op's bias and activation, dZ = f'(y) dY, and
// the bias's gradient (its third input, when there is one) from it.
Tensor EpilogueGradient(Backend& be, Node& self, int64_t rows, int64_t cols,
                        Activation f) {
  Node* bias = self.inputs.size() > 2 && self.inputs[2]->requires_grad
                   ? self.inputs[2].get()
                   : nullptr;
  if (f == Activation::kLinear) {
    if (bias != nullptr) {
      float beta = 1.0f;
      float* dbias = GradToWrite(be, *bias, &beta);
      be.ColumnSum(rows, cols, GradIn(self), beta, dbias);
    }
    return self.grad;
  }
  float* dbias = bias != nullptr ? Grad(be, *bias) : nullptr;
  Tensor dz = NewFloat(be, self.value.shape());
  be.BiasActivationBackward(rows, cols, f, self.value.data<float>(),
                            GradIn(self), dz.mutable_data<float>(), dbias);
  return dz;
}

}  // namespace

namespace ops {

Var Constant(Backend& be, const Tensor& t, float scale) {
  auto n = std::make_shared<Node>();
  n->value = ToFloat(be, t, scale);
  return Var(std::move(n));
}

Var DecodeRaw(Backend& be, const Tensor& bytes, const Shape& per_element,
              float scale) {
  if (bytes.dtype() != DType::kBytes) return Constant(be, bytes, scale);
  const int64_t count = bytes.num_elements();
  const int64_t each = per_element.num_elements();
  if (bytes.on_host()) {
    const int64_t k = bytes.FirstBytesNotOfLength(static_cast<size_t>(each));
    if (k < count) {
      throw Error(fmt::format(
          "decode_raw: value {} holds {} bytes, expected {} for shape {}", k,
          bytes.bytes(k).size(), each, per_element.ToString()));
    }
  }
  Shape shape = per_element;
  for (int i = bytes.shape().rank() - 1; i >= 0; --i) {
    shape = shape.Prepend(bytes.shape()[i]);
  }
  // The values as uint8 [..., each] in the backend's memory.
  const Tensor raw = be.ToDevice(bytes);
  Tensor out = NewFloat(be, shape);
  be.Convert(DType::kUInt8, count * each, raw.raw_data(), scale,
             out.mutable_data<float>());
  auto n = std::make_shared<Node>();
  n->value = std::move(out);
  return Var(std::move(n));
}

Var MatMul(Backend& be, const Var& a, const Var& b, bool ta, bool tb) {
  // Named copies, not a structured binding: clang before 16 cannot capture
  // a binding in the backward lambda (CI's sanitizer build is clang 14).
  const Dims dims = MatMulDims(a, b, ta, tb);
  const int64_t m = dims.m, n = dims.n, k = dims.k;
  Tensor y = NewFloat(be, Shape{m, n});
  be.Gemm(ta, tb, m, n, k, 1.0f, a.data(), b.data(), 0.0f,
          y.mutable_data<float>());
  auto node = MakeNode(std::move(y), {a.shared(), b.shared()});
  node->backward = [&be, m, n, k, ta, tb](Node& self) {
    Node& A = *self.inputs[0];
    Node& B = *self.inputs[1];
    const float* dy = GradIn(self);
    float beta = 1.0f;
    // dA = dY B^T (stored per A's layout), dB = A^T dY.
    if (A.requires_grad) {
      float* dA = GradToWrite(be, A, &beta);
      if (!ta) {
        be.Gemm(false, !tb, m, k, n, 1.0f, dy, B.value.data<float>(), beta, dA);
      } else {
        be.Gemm(tb, true, k, m, n, 1.0f, B.value.data<float>(), dy, beta, dA);
      }
    }
    if (B.requires_grad) {
      float* dB = GradToWrite(be, B, &beta);
      if (!tb) {
        be.Gemm(!ta, false, k, n, m, 1.0f, A.value.data<float>(), dy, beta, dB);
      } else {
        be.Gemm(true, ta, n, k, m, 1.0f, dy, A.value.data<float>(), beta, dB);
      }
    }
  };
  return Var(std::move(node));
}

Var BiasAdd(Backend& be, const Var& x, const Var& bias) {
  const int64_t cols = LastDim(x.shape());
  CheckBias(bias, cols, x.shape());
  const int64_t rows = x.value().num_elements() / std::max<int64_t>(cols, 1);
  Tensor y = NewFloat(be, x.shape());
  be.BiasAdd(rows, cols, x.data(), bias.data(), y.mutable_data<float>());
  auto node = MakeNode(std::move(y), {x.shared(), bias.shared()});
  node->backward = [&be, rows, cols](Node& self) {
    const float* dy = GradIn(self);
    float beta = 1.0f;
    if (self.inputs[0]->requires_grad) {
      float* dx = GradToWrite(be, *self.inputs[0], &beta);
      be.Axpby(rows * cols, 1.0f, dy, beta, dx);
    }
    if (self.inputs[1]->requires_grad) {
      float* db = GradToWrite(be, *self.inputs[1], &beta);
      be.ColumnSum(rows, cols, dy, beta, db);
    }
  };
  return Var(std::move(node));
}

Var Add(Backend& be, const Var& a, const Var& b) {
  if (!(a.shape() == b.shape())) {
    throw Error(fmt::format("add: shapes {} and {} differ",
                            a.shape().ToString(), b.shape().ToString()));
  }
  const int64_t n = a.value().num_elements();
  Tensor y = NewFloat(be, a.shape());
  be.Copy(n, a.data(), y.mutable_data<float>());
  be.Axpby(n, 1.0f, b.data(), 1.0f, y.mutable_data<float>());
  auto node = MakeNode(std::move(y), {a.shared(), b.shared()});
  node->backward = [&be, n](Node& self) {
    for (auto& in : self.inputs) {
      if (!in->requires_grad) continue;
      float beta = 1.0f;
      float* dx = GradToWrite(be, *in, &beta);
      be.Axpby(n, 1.0f, GradIn(self), beta, dx);
    }
  };
  return Var(std::move(node));
}

Var Multiply(Backend& be, const Var& a, const Var& b) {
  if (!(a.shape() == b.shape())) {
    throw Error(fmt::format("multiply: shapes {} and {} differ",
                            a.shape().ToString(), b.shape().ToString()));
  }
  const int64_t n = a.value().num_elements();
  Tensor y = NewFloat(be, a.shape());
  be.Multiply(n, a.data(), b.data(), y.mutable_data<float>());
  auto node = MakeNode(std::move(y), {a.shared(), b.shared()});
  node->backward = [&be, n](Node& self) {
    for (int i = 0; i < 2; ++i) {
      Node& in = *self.inputs[i];
      if (!in.requires_grad) continue;
      const float* other = self.inputs[1 - i]->value.data<float>();
      if (Fresh(in)) {
        float beta;
        be.Multiply(n, GradIn(self), other, GradToWrite(be, in, &beta));
        continue;
      }
      Tensor t = NewFloat(be, self.value.shape());
      be.Multiply(n, GradIn(self), other, t.mutable_data<float>());
      be.Axpby(n, 1.0f, t.data<float>(), 1.0f, Grad(be, in));
    }
  };
  return Var(std::move(node));
}

Var Scale(Backend& be, const Var& x, float s) {
  const int64_t n = x.value().num_elements();
  Tensor y = NewFloat(be, x.shape());
  be.Axpby(n, s, x.data(), 0.0f, y.mutable_data<float>());
  auto node = MakeNode(std::move(y), {x.shared()});
  node->backward = [&be, n, s](Node& self) {
    if (self.inputs[0]->requires_grad) {
      float beta = 1.0f;
      float* dx = GradToWrite(be, *self.inputs[0], &beta);
      be.Axpby(n, s, GradIn(self), beta, dx);
    }
  };
  return Var(std::move(node));
}

Var Activate(Backend& be, const Var& x, Activation f) {
  if (f == Activation::kLinear) return x;
  const int64_t n = x.value().num_elements();
  Tensor y = NewFloat(be, x.shape());
  be.ActivationForward(f, n, x.data(), y.mutable_data<float>());
  auto node = MakeNode(std::move(y), {x.shared()});
  node->backward = [&be, n, f](Node& self) {
    if (self.inputs[0]->requires_grad) {
      float beta = 1.0f;
      float* dx = GradToWrite(be, *self.inputs[0], &beta);
      be.ActivationBackward(f, n, self.value.data<float>(), GradIn(self), beta,
                            dx);
    }
  };
  return Var(std::move(node));
}

Var Softmax(Backend& be, const Var& x) {
  const int64_t cols = LastDim(x.shape());
  const int64_t rows = x.value().num_elements() / std::max<int64_t>(cols, 1);
  Tensor y = NewFloat(be, x.shape());
  be.Softmax(rows, cols, x.data(), y.mutable_data<float>());
  auto node = MakeNode(std::move(y), {x.shared()});
  node->backward = [&be, rows, cols](Node& self) {
    if (!self.inputs[0]->requires_grad) return;
    be.SoftmaxBackward(rows, cols, self.value.data<float>(), GradIn(self),
                       Grad(be, *self.inputs[0]));
  };
  return Var(std::move(node));
}

Var Reshape(Backend& be, const Var& x, const Shape& shape) {
  if (shape.num_elements() != x.value().num_elements()) {
    throw Error(fmt::format("reshape: {} has {} values, {} needs {}",
                            x.shape().ToString(), x.value().num_elements(),
                            shape.ToString(), shape.num_elements()));
  }
  auto node = MakeNode(x.value().Reshape(shape), {x.shared()});
  node->backward = [&be](Node& self) {
    Node& in = *self.inputs[0];
    if (!in.requires_grad) return;
    // Same layout: the gradients are the same numbers.
    if (!in.grad.valid()) {
      in.grad = self.grad.Reshape(in.value.shape());
      // Do not share: later accumulations into `in` must not alter
      // self's gradient, but self is done once its backward ran.
      return;
    }
    be.Axpby(in.value.num_elements(), 1.0f, self.grad.data<float>(), 1.0f,
             in.grad.mutable_data<float>());
  };
  return Var(std::move(node));
}

Var Flatten(Backend& be, const Var& x) {
  if (x.shape().rank() < 1) throw Error("flatten: needs a batch dimension");
  const int64_t batch = x.shape()[0];
  return Reshape(
      be, x, Shape{batch, batch == 0 ? 0 : x.value().num_elements() / batch});
}

Var Concat(Backend& be, std::span<const Var> parts) {
  if (parts.empty()) throw Error("concat: no inputs");
  const int64_t rows = parts[0].shape()[0];
  int64_t cols = 0;
  std::vector<int64_t> widths;
  std::vector<NodePtr> inputs;
  for (const Var& p : parts) {
    if (p.shape().rank() != 2 || p.shape()[0] != rows) {
      throw Error(fmt::format("concat: every input must be [{}, n]; got {}",
                              rows, p.shape().ToString()));
    }
    widths.push_back(p.shape()[1]);
    cols += p.shape()[1];
    inputs.push_back(p.shared());
  }
  Tensor y = NewFloat(be, Shape{rows, cols});
  float* o = y.mutable_data<float>();
  int64_t at = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    be.CopyBlock(rows, widths[i], parts[i].data(), widths[i], o + at, cols,
                 /*accumulate=*/false);
    at += widths[i];
  }
  auto node = MakeNode(std::move(y), std::move(inputs));
  node->backward = [&be, rows, cols, widths](Node& self) {
    const float* dy = GradIn(self);
    int64_t at = 0;
    for (size_t i = 0; i < widths.size(); ++i) {
      Node& in = *self.inputs[i];
      if (in.requires_grad) {
        be.CopyBlock(rows, widths[i], dy + at, cols, Grad(be, in), widths[i],
                     /*accumulate=*/true);
      }
      at += widths[i];
    }
  };
  return Var(std::move(node));
}

Var ReduceSum(Backend& be, const Var& x) {
  const int64_t n = x.value().num_elements();
  Tensor y = NewFloat(be, Shape{});
  be.Sum(n, x.data(), 1.0f, y.mutable_data<float>());
  auto node = MakeNode(std::move(y), {x.shared()});
  node->backward = [&be, n](Node& self) {
    if (!self.inputs[0]->requires_grad) return;
    float beta = 1.0f;
    float* dx = GradToWrite(be, *self.inputs[0], &beta);
    be.AxpyScalar(n, GradIn(self), nullptr, beta, dx);
  };
  return Var(std::move(node));
}

Var ReduceMean(Backend& be, const Var& x) {
  const int64_t n = x.value().num_elements();
  return Scale(be, ReduceSum(be, x), n == 0 ? 0.0f : 1.0f / n);
}

Var Conv2D(Backend& be, const Var& x, const Var& filter, int stride_h,
           int stride_w, Padding padding) {
  const Window2D g = ConvWindow(x, filter, stride_h, stride_w, padding);
  Tensor y = NewFloat(be, Shape{g.batch, g.out_h, g.out_w, g.out_c});
  be.Conv2D(g, x.data(), filter.data(), y.mutable_data<float>());
  auto node = MakeNode(std::move(y), {x.shared(), filter.shared()});
  node->backward = [&be, g](Node& self) {
    Node& X = *self.inputs[0];
    Node& W = *self.inputs[1];
    be.Conv2DBackward(g, X.value.data<float>(), W.value.data<float>(),
                      GradIn(self), X.requires_grad ? Grad(be, X) : nullptr,
                      W.requires_grad ? Grad(be, W) : nullptr);
  };
  return Var(std::move(node));
}

Var FusedMatMul(Backend& be, const Var& x, const Var& w, const Var& bias,
                Activation f) {
  const Dims dims = MatMulDims(x, w, false, false);
  const int64_t m = dims.m, n = dims.n, k = dims.k;
  CheckBias(bias, n, Shape{m, n});
  Tensor y = NewFloat(be, Shape{m, n});
  float* out = y.mutable_data<float>();
  be.GemmBiasActivation(m, n, k, x.data(), w.data(),
                        bias.valid() ? bias.data() : nullptr, f, out);
  std::vector<NodePtr> inputs{x.shared(), w.shared()};
  if (bias.valid()) inputs.push_back(bias.shared());
  auto node = MakeNode(std::move(y), std::move(inputs));
  node->backward = [&be, m, n, k, f](Node& self) {
    Node& X = *self.inputs[0];
    Node& W = *self.inputs[1];
    const Tensor dz = EpilogueGradient(be, self, m, n, f);
    // dX = dZ W^T, dW = X^T dZ.
    float beta = 1.0f;
    if (X.requires_grad) {
      float* dx = GradToWrite(be, X, &beta);
      be.Gemm(false, true, m, k, n, 1.0f, dz.data<float>(),
              W.value.data<float>(), beta, dx);
    }
    if (W.requires_grad) {
      float* dw = GradToWrite(be, W, &beta);
      be.Gemm(true, false, k, n, m, 1.0f, X.value.data<float>(),
              dz.data<float>(), beta, dw);
    }
  };
  return Var(std::move(node));
}

Var FusedConv2D(Backend& be, const Var& x, const Var& filter, const Var& bias,
                Activation f, int stride_h, int stride_w, Padding padding) {
  const Window2D g = ConvWindow(x, filter, stride_h, stride_w, padding);
  CheckBias(bias, g.out_c, Shape{g.batch, g.out_h, g.out_w, g.out_c});
  Tensor y = NewFloat(be, Shape{g.batch, g.out_h, g.out_w, g.out_c});
  float* out = y.mutable_data<float>();
  be.Conv2D(g, x.data(), filter.data(), out);
  const int64_t rows = g.batch * g.out_h * g.out_w;
  be.BiasActivation(rows, g.out_c, bias.valid() ? bias.data() : nullptr, f,
                    out);
  std::vector<NodePtr> inputs{x.shared(), filter.shared()};
  if (bias.valid()) inputs.push_back(bias.shared());
  auto node = MakeNode(std::move(y), std::move(inputs));
  node->backward = [&be, g, rows, f](Node& self) {
    Node& X = *self.inputs[0];
    Node& W = *self.inputs[1];
    const Tensor dz = EpilogueGradient(be, self, rows, g.out_c, f);
    be.Conv2DBackward(g, X.value.data<float>(), W.value.data<float>(),
                      dz.data<float>(), X.requires_grad ? Grad(be, X) : nullptr,
                      W.requires_grad ? Grad(be, W) : nullptr);
  };
  return Var(std::move(node));
}

Var Pool2D(Backend& be, Pooling kind, const Var& x, int window_h, int window_w,
           int stride_h, int stride_w, Padding padding) {
  CheckRank(x, 4, kind == Pooling::kMax ? "max_pool2d" : "avg_pool2d");
  Window2D g;
  g.batch = x.shape()[0];
  g.in_h = x.shape()[1];
  g.in_w = x.shape()[2];
  g.in_c = x.shape()[3];
  g.out_c = g.in_c;
  g.window_h = window_h;
  g.window_w = window_w;
  g.stride_h = stride_h;
  g.stride_w = stride_w;
  g.padding = padding;
  g.Resolve();
  Tensor y = NewFloat(be, Shape{g.batch, g.out_h, g.out_w, g.in_c});
  be.Pool2D(kind, g, x.data(), y.mutable_data<float>());
  auto node = MakeNode(std::move(y), {x.shared()});
  node->backward = [&be, g, kind](Node& self) {
    Node& X = *self.inputs[0];
    if (!X.requires_grad) return;
    if (Fresh(X)) {
      X.grad = NewFloat(be, X.value.shape());
      be.Pool2DBackwardWrite(kind, g, X.value.data<float>(),
                             self.value.data<float>(), GradIn(self),
                             X.grad.mutable_data<float>());
    } else {
      be.Pool2DBackward(kind, g, X.value.data<float>(),
                        self.value.data<float>(), GradIn(self), Grad(be, X));
    }
  };
  return Var(std::move(node));
}

Var Dropout(Backend& be, const Var& x, float rate, uint64_t seed) {
  if (rate < 0.0f || rate >= 1.0f) {
    throw Error(fmt::format("dropout: rate {} is outside [0, 1)", rate));
  }
  if (rate == 0.0f) return x;
  const int64_t n = x.value().num_elements();
  Tensor mask = NewFloat(be, x.shape());
  float* m = mask.mutable_data<float>();
  be.DropoutMask(n, rate, seed, m);
  Tensor y = NewFloat(be, x.shape());
  be.Multiply(n, x.data(), m, y.mutable_data<float>());
  auto node = MakeNode(std::move(y), {x.shared()});
  node->backward = [&be, n, mask](Node& self) {
    Node& in = *self.inputs[0];
    if (!in.requires_grad) return;
    if (Fresh(in)) {
      float beta;
      be.Multiply(n, GradIn(self), mask.data<float>(),
                  GradToWrite(be, in, &beta));
      return;
    }
    Tensor t = NewFloat(be, self.value.shape());
    be.Multiply(n, GradIn(self), mask.data<float>(), t.mutable_data<float>());
    be.Axpby(n, 1.0f, t.data<float>(), 1.0f, Grad(be, in));
  };
  return Var(std::move(node));
}

Var BatchNorm(Backend& be, const Var& x, const Var& gamma, const Var& beta,
              float* moving_mean, float* moving_var, bool training,
              float momentum, float epsilon) {
  const int64_t cols = LastDim(x.shape());
  const int64_t rows = x.value().num_elements() / std::max<int64_t>(cols, 1);
  if (gamma.value().num_elements() != cols ||
      beta.value().num_elements() != cols) {
    throw Error(fmt::format("batch_norm: {} channels but gamma/beta of {}/{}",
                            cols, gamma.value().num_elements(),
                            beta.value().num_elements()));
  }
  Tensor mean = NewFloat(be, Shape{cols});
  Tensor inv_std = NewFloat(be, Shape{cols});
  Tensor y = NewFloat(be, x.shape());
  be.BatchNormForward(rows, cols, x.data(), gamma.data(), beta.data(), epsilon,
                      training, momentum, moving_mean, moving_var,
                      mean.mutable_data<float>(), inv_std.mutable_data<float>(),
                      y.mutable_data<float>());
  auto node =
      MakeNode(std::move(y), {x.shared(), gamma.shared(), beta.shared()});
  node->backward = [&be, rows, cols, mean, inv_std, training](Node& self) {
    Node& X = *self.inputs[0];
    Node& G = *self.inputs[1];
    Node& B = *self.inputs[2];
    const float* dy = GradIn(self);
    be.BatchNormBackward(rows, cols, training, X.value.data<float>(),
                         G.value.data<float>(), mean.data<float>(),
                         inv_std.data<float>(), dy,
                         X.requires_grad ? Grad(be, X) : nullptr,
                         G.requires_grad ? Grad(be, G) : nullptr,
                         B.requires_grad ? Grad(be, B) : nullptr);
  };
  return Var(std::move(node));
}

Var Gather(Backend& be, const Var& table, const Tensor& ids) {
  CheckRank(table, 2, "embedding table");
  const int64_t rows = table.shape()[0], dim = table.shape()[1];
  const int64_t n = ids.num_elements();
  Tensor id_values = AsInt64(be, ids, n, "embedding lookup");
  Shape shape = ids.shape();
  // ids.shape + [dim]
  std::vector<int64_t> dims(shape.dims().begin(), shape.dims().end());
  dims.push_back(dim);
  Tensor y = NewFloat(be, Shape(std::span<const int64_t>(dims)));
  be.Gather(rows, dim, table.data(), n, id_values.data<int64_t>(),
            y.mutable_data<float>());
  auto node = MakeNode(std::move(y), {table.shared()});
  node->backward = [&be, dim, n, id_values](Node& self) {
    if (!self.inputs[0]->requires_grad) return;
    be.ScatterAdd(dim, n, id_values.data<int64_t>(), GradIn(self),
                  Grad(be, *self.inputs[0]));
  };
  return Var(std::move(node));
}

Var SparseSoftmaxCrossEntropy(Backend& be, const Var& logits,
                              const Tensor& labels) {
  CheckRank(logits, 2, "sparse_softmax_cross_entropy");
  const int64_t rows = logits.shape()[0], cols = logits.shape()[1];
  const Tensor ids = AsInt64(be, labels, rows, "sparse_softmax_cross_entropy");
  Tensor losses = NewFloat(be, Shape{rows});
  // The gradient is computed with the forward pass (it needs the softmax),
  // written whole by the backend.
  Tensor dlogits = NewFloat(be, logits.shape());
  const float scale = rows == 0 ? 0.0f : 1.0f / static_cast<float>(rows);
  be.SparseSoftmaxCrossEntropy(rows, cols, logits.data(), ids.data<int64_t>(),
                               losses.mutable_data<float>(),
                               dlogits.mutable_data<float>(), scale);
  return MeanLoss(be, logits, losses, scale, std::move(dlogits));
}

Var SigmoidCrossEntropy(Backend& be, const Var& logits, const Tensor& labels) {
  const int64_t n = logits.value().num_elements();
  if (labels.num_elements() != n) {
    throw Error(
        fmt::format("sigmoid_cross_entropy: {} labels for logits of shape {}",
                    labels.num_elements(), logits.shape().ToString()));
  }
  Tensor targets = ToFloat(be, labels, 1.0f);
  Tensor losses = NewFloat(be, Shape{n});
  Tensor dlogits = NewFloat(be, logits.shape());
  const float scale = n == 0 ? 0.0f : 1.0f / static_cast<float>(n);
  be.SigmoidCrossEntropy(n, logits.data(), targets.data<float>(),
                         losses.mutable_data<float>(),
                         dlogits.mutable_data<float>(), scale);
  return MeanLoss(be, logits, losses, scale, std::move(dlogits));
}

Var MeanSquaredError(Backend& be, const Var& predictions,
                     const Tensor& labels) {
  const int64_t n = predictions.value().num_elements();
  if (labels.num_elements() != n) {
    throw Error(
        fmt::format("mean_squared_error: {} labels for predictions of "
                    "shape {}",
                    labels.num_elements(), predictions.shape().ToString()));
  }
  Var target = Constant(be, labels);
  if (!(target.shape() == predictions.shape())) {
    target = Reshape(be, target, predictions.shape());
  }
  Var diff = Add(be, predictions, Scale(be, target, -1.0f));
  return ReduceMean(be, Multiply(be, diff, diff));
}

void Backward(Backend& be, const Var& loss, float seed) {
  if (loss.value().num_elements() != 1) {
    throw Error(fmt::format("backward: the loss must be a scalar, got {}",
                            loss.shape().ToString()));
  }
  // Reverse topological order by an iterative depth-first search.
  std::vector<Node*> order;
  std::unordered_set<Node*> seen;
  std::vector<std::pair<Node*, size_t>> stack{{loss.node(), 0}};
  seen.insert(loss.node());
  while (!stack.empty()) {
    auto& [node, next] = stack.back();
    if (next < node->inputs.size()) {
      Node* in = node->inputs[next++].get();
      if (in->requires_grad && seen.insert(in).second) stack.push_back({in, 0});
    } else {
      order.push_back(node);
      stack.pop_back();
    }
  }
  // dL/dL = seed: written where the loss's gradient is fresh, added where
  // it already holds a value.
  if (Fresh(*loss.node())) {
    float beta;
    be.Fill(1, seed, GradToWrite(be, *loss.node(), &beta));
  } else {
    Tensor d_loss = NewFloat(be, Shape{});
    be.Fill(1, seed, d_loss.mutable_data<float>());
    be.Axpby(1, 1.0f, d_loss.data<float>(), 1.0f, Grad(be, *loss.node()));
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* n = *it;
    if (n->backward && n->grad.valid()) n->backward(*n);
  }
}

}  // namespace ops
}  // namespace recflow::train
