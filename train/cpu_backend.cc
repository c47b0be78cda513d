// The Eigen CPU backend.  Matrix products are Eigen tensor contractions on
// a ThreadPoolDevice (TensorFlow's CPU matmul); convolutions are im2col +
// one contraction; everything elementwise is split over the same pool with
// parallelFor, so the backend never runs two pools against each other.
#define EIGEN_USE_THREADS
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <thread>
#include <unsupported/Eigen/CXX11/Tensor>
#include <vector>

#include "train/backend.h"

namespace recflow::train {

Activation ActivationFromName(std::string_view name) {
  if (name == "linear" || name.empty()) return Activation::kLinear;
  if (name == "relu") return Activation::kRelu;
  if (name == "sigmoid") return Activation::kSigmoid;
  if (name == "tanh") return Activation::kTanh;
  throw Error(fmt::format(
      "unknown activation \"{}\" (expected linear, relu, sigmoid or tanh)",
      name));
}

std::string_view ActivationName(Activation a) {
  switch (a) {
    case Activation::kLinear:
      return "linear";
    case Activation::kRelu:
      return "relu";
    case Activation::kSigmoid:
      return "sigmoid";
    case Activation::kTanh:
      return "tanh";
  }
  return "?";
}

void Window2D::Resolve() {
  if (window_h <= 0 || window_w <= 0 || stride_h <= 0 || stride_w <= 0) {
    throw Error(fmt::format("window {}x{} with strides {}x{}: must be positive",
                            window_h, window_w, stride_h, stride_w));
  }
  if (padding == Padding::kSame) {
    out_h = (in_h + stride_h - 1) / stride_h;
    out_w = (in_w + stride_w - 1) / stride_w;
    const int64_t pad_h =
        std::max<int64_t>((out_h - 1) * stride_h + window_h - in_h, 0);
    const int64_t pad_w =
        std::max<int64_t>((out_w - 1) * stride_w + window_w - in_w, 0);
    pad_top = pad_h / 2;
    pad_left = pad_w / 2;
  } else {
    if (window_h > in_h || window_w > in_w) {
      throw Error(fmt::format(
          "a {}x{} window does not fit a {}x{} input with VALID padding",
          window_h, window_w, in_h, in_w));
    }
    out_h = (in_h - window_h) / stride_h + 1;
    out_w = (in_w - window_w) / stride_w + 1;
    pad_top = pad_left = 0;
  }
}

namespace {

using RowMatrix = Eigen::TensorMap<Eigen::Tensor<float, 2, Eigen::RowMajor>>;
using ConstRowMatrix =
    Eigen::TensorMap<Eigen::Tensor<const float, 2, Eigen::RowMajor>>;
using Vector = Eigen::TensorMap<Eigen::Tensor<float, 1, Eigen::RowMajor>>;
using ConstVector =
    Eigen::TensorMap<Eigen::Tensor<const float, 1, Eigen::RowMajor>>;

// Bytes of im2col scratch a convolution uses at most; larger batches are
// convolved in chunks of images.
constexpr size_t kMaxColumnBytes = size_t{64} << 20;

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads)
      : threads_(threads > 0
                     ? threads
                     : std::max(1, static_cast<int>(
                                       std::thread::hardware_concurrency()))),
        pool_(threads_),
        device_(&pool_, threads_) {}

  Device device() const override { return Device::kCpu; }
  std::string name() const override {
    return fmt::format("eigen-cpu ({} threads)", threads_);
  }
  int threads() const override { return threads_; }

  Tensor Allocate(DType dtype, const Shape& shape) override {
    return Tensor::Allocate(dtype, shape);
  }
  Tensor ToDevice(const Tensor& t) override {
    t.CheckHost("the CPU backend");
    return t.dtype() == DType::kBytes ? t.BytesAsUInt8() : t;
  }
  Tensor ToHost(const Tensor& t) override {
    t.CheckHost("the CPU backend");
    return t;
  }

  void Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
            const float* a, const float* b, float beta, float* c) override {
    ConstRowMatrix A(a, ta ? k : m, ta ? m : k);
    ConstRowMatrix B(b, tb ? n : k, tb ? k : n);
    RowMatrix C(c, m, n);
    const Eigen::array<Eigen::IndexPair<int>, 1> dims = {
        Eigen::IndexPair<int>(ta ? 0 : 1, tb ? 1 : 0)};
    if (k == 0) {
      if (beta == 0.0f) {
        C.device(device_) = C.constant(0.0f);
      } else {
        C.device(device_) = C * beta;
      }
      return;
    }
    if (beta == 0.0f) {
      if (alpha == 1.0f) {
        C.device(device_) = A.contract(B, dims);
      } else {
        C.device(device_) = A.contract(B, dims) * alpha;
      }
    } else if (beta == 1.0f && alpha == 1.0f) {
      C.device(device_) += A.contract(B, dims);
    } else {
      C.device(device_) = A.contract(B, dims) * alpha + C * beta;
    }
  }

  void Conv2D(const Window2D& g, const float* x, const float* w,
              float* y) override {
    const int64_t patch = g.window_h * g.window_w * g.in_c;
    const int64_t pixels = g.out_h * g.out_w;
    ForImageChunks(g, [&](int64_t first, int64_t count) {
      const float* cols = Im2Col(g, x, first, count);
      Gemm(false, false, count * pixels, g.out_c, patch, 1.0f, cols, w, 0.0f,
           y + first * pixels * g.out_c);
    });
  }

  void Conv2DBackward(const Window2D& g, const float* x, const float* w,
                      const float* dy, float* dx, float* dw) override {
    const int64_t patch = g.window_h * g.window_w * g.in_c;
    const int64_t pixels = g.out_h * g.out_w;
    ForImageChunks(g, [&](int64_t first, int64_t count) {
      const float* dy_chunk = dy + first * pixels * g.out_c;
      if (dw != nullptr) {
        const float* cols = Im2Col(g, x, first, count);
        Gemm(true, false, patch, g.out_c, count * pixels, 1.0f, cols, dy_chunk,
             1.0f, dw);
      }
      if (dx != nullptr) {
        dcols_.resize(static_cast<size_t>(count * pixels * patch));
        Gemm(false, true, count * pixels, patch, g.out_c, 1.0f, dy_chunk, w,
             0.0f, dcols_.data());
        Col2Im(g, dcols_.data(), first, count, dx);
      }
    });
  }

  void Pool2D(Pooling kind, const Window2D& g, const float* x,
              float* y) override {
    ParallelRows(g.batch * g.out_h, g.out_w * g.window_h * g.window_w * g.in_c,
                 [&](int64_t row) {
                   const int64_t b = row / g.out_h, oh = row % g.out_h;
                   for (int64_t ow = 0; ow < g.out_w; ++ow) {
                     float* out =
                         y + ((b * g.out_h + oh) * g.out_w + ow) * g.in_c;
                     PoolWindow(kind, g, x, b, oh, ow, out);
                   }
                 });
  }

  void Pool2DBackward(Pooling kind, const Window2D& g, const float* x,
                      const float* y, const float* dy, float* dx) override {
    // Per image, so that no two threads add into the same dx cell.
    ParallelRows(
        g.batch, g.out_h * g.out_w * g.window_h * g.window_w * g.in_c,
        [&](int64_t b) {
          for (int64_t oh = 0; oh < g.out_h; ++oh) {
            for (int64_t ow = 0; ow < g.out_w; ++ow) {
              const int64_t o = ((b * g.out_h + oh) * g.out_w + ow) * g.in_c;
              PoolWindowBackward(kind, g, x, y + o, dy + o, b, oh, ow, dx);
            }
          }
        });
  }

  void ActivationForward(Activation f, int64_t n, const float* x,
                         float* y) override {
    ConstVector X(x, n);
    Vector Y(y, n);
    switch (f) {
      case Activation::kLinear:
        if (x != y) Y.device(device_) = X;
        break;
      case Activation::kRelu:
        Y.device(device_) = X.cwiseMax(0.0f);
        break;
      case Activation::kSigmoid:
        Y.device(device_) = X.sigmoid();
        break;
      case Activation::kTanh:
        Y.device(device_) = X.tanh();
        break;
    }
  }

  void ActivationBackward(Activation f, int64_t n, const float* y,
                          const float* dy, float* dx) override {
    ConstVector Y(y, n), DY(dy, n);
    Vector DX(dx, n);
    switch (f) {
      case Activation::kLinear:
        DX.device(device_) += DY;
        break;
      case Activation::kRelu:
        DX.device(device_) +=
            (Y > Y.constant(0.0f)).select(DY, DY.constant(0.0f));
        break;
      case Activation::kSigmoid:
        DX.device(device_) += DY * Y * (Y.constant(1.0f) - Y);
        break;
      case Activation::kTanh:
        DX.device(device_) += DY * (Y.constant(1.0f) - Y * Y);
        break;
    }
  }

  void Softmax(int64_t rows, int64_t cols, const float* x, float* y) override {
    ParallelRows(rows, cols * 4, [&](int64_t r) {
      SoftmaxRow(cols, x + r * cols, y + r * cols);
    });
  }
  void SoftmaxBackward(int64_t rows, int64_t cols, const float* y,
                       const float* dy, float* dx) override {
    ParallelRows(rows, cols * 4, [&](int64_t r) {
      const float* yr = y + r * cols;
      const float* dyr = dy + r * cols;
      float* dxr = dx + r * cols;
      double dot = 0;
      for (int64_t c = 0; c < cols; ++c) dot += dyr[c] * yr[c];
      for (int64_t c = 0; c < cols; ++c) {
        dxr[c] += yr[c] * static_cast<float>(dyr[c] - dot);
      }
    });
  }

  void SparseSoftmaxCrossEntropy(int64_t rows, int64_t cols,
                                 const float* logits, const int64_t* labels,
                                 float* losses, float* dlogits,
                                 float scale) override {
    for (int64_t r = 0; r < rows; ++r) {
      if (labels[r] < 0 || labels[r] >= cols) {
        throw Error(fmt::format(
            "label {} of row {} is outside [0, {}) (the logits' classes)",
            labels[r], r, cols));
      }
    }
    ParallelRows(rows, cols * 8, [&](int64_t r) {
      const float* z = logits + r * cols;
      const float max = *std::max_element(z, z + cols);
      double sum = 0;
      for (int64_t c = 0; c < cols; ++c) sum += std::exp(double(z[c] - max));
      const double log_sum = std::log(sum);
      losses[r] = static_cast<float>(log_sum - (z[labels[r]] - max));
      if (dlogits != nullptr) {
        float* d = dlogits + r * cols;
        for (int64_t c = 0; c < cols; ++c) {
          const double p = std::exp(double(z[c] - max) - log_sum);
          d[c] += scale * static_cast<float>(p - (c == labels[r] ? 1.0 : 0.0));
        }
      }
    });
  }

  void SigmoidCrossEntropy(int64_t n, const float* logits, const float* targets,
                           float* losses, float* dlogits,
                           float scale) override {
    ParallelRows(n, 20, [&](int64_t i) {
      const float x = logits[i], z = targets[i];
      // max(x, 0) - x z + log(1 + exp(-|x|)), TF's stable form.
      losses[i] =
          std::max(x, 0.0f) - x * z + std::log1p(std::exp(-std::abs(x)));
      if (dlogits != nullptr) {
        dlogits[i] += scale * (1.0f / (1.0f + std::exp(-x)) - z);
      }
    });
  }

  void Fill(int64_t n, float value, float* y) override {
    Vector Y(y, n);
    Y.device(device_) = Y.constant(value);
  }
  void Copy(int64_t n, const float* x, float* y) override {
    Vector(y, n).device(device_) = ConstVector(x, n);
  }
  void Axpby(int64_t n, float alpha, const float* x, float beta,
             float* y) override {
    ConstVector X(x, n);
    Vector Y(y, n);
    if (beta == 1.0f && alpha == 1.0f) {
      Y.device(device_) += X;
    } else if (beta == 1.0f) {
      Y.device(device_) += X * alpha;
    } else if (beta == 0.0f) {
      Y.device(device_) = X * alpha;
    } else {
      Y.device(device_) = X * alpha + Y * beta;
    }
  }
  void Multiply(int64_t n, const float* x, const float* y, float* z) override {
    Vector(z, n).device(device_) = ConstVector(x, n) * ConstVector(y, n);
  }
  void BiasAdd(int64_t rows, int64_t cols, const float* x, const float* b,
               float* y) override {
    ConstRowMatrix X(x, rows, cols);
    RowMatrix Y(y, rows, cols);
    const Eigen::array<Eigen::Index, 2> shape{1, cols};
    const Eigen::array<Eigen::Index, 2> times{rows, 1};
    Y.device(device_) =
        X + ConstVector(b, cols).reshape(shape).broadcast(times);
  }
  void ColumnSum(int64_t rows, int64_t cols, const float* x, float beta,
                 float* out) override {
    ConstRowMatrix X(x, rows, cols);
    Vector O(out, cols);
    const Eigen::array<Eigen::Index, 1> first{0};
    if (beta == 0.0f) {
      O.device(device_) = X.sum(first);
    } else {
      O.device(device_) = X.sum(first) + O * beta;
    }
  }
  void Sum(int64_t n, const float* x, float scale, float* y) override {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += x[i];
    y[0] = static_cast<float>(sum * scale);
  }
  void AxpyScalar(int64_t n, const float* alpha, const float* x,
                  float* y) override {
    const float a = alpha[0];
    Vector Y(y, n);
    if (x == nullptr) {
      Y.device(device_) = Y + Y.constant(a);
    } else {
      Y.device(device_) = Y + ConstVector(x, n) * a;
    }
  }
  void Convert(DType dtype, int64_t n, const void* x, float scale,
               float* y) override {
    auto convert = [&](const auto* in) {
      ParallelRows(
          n, 2, [&](int64_t i) { y[i] = static_cast<float>(in[i]) * scale; });
    };
    switch (dtype) {
      case DType::kFloat32:
        convert(static_cast<const float*>(x));
        break;
      case DType::kFloat64:
        convert(static_cast<const double*>(x));
        break;
      case DType::kInt32:
        convert(static_cast<const int32_t*>(x));
        break;
      case DType::kInt64:
        convert(static_cast<const int64_t*>(x));
        break;
      case DType::kUInt8:
        convert(static_cast<const uint8_t*>(x));
        break;
      case DType::kBytes:
        throw Error(
            "a bytes tensor cannot be used as numbers; decode it first "
            "(ops::DecodeRaw)");
    }
  }
  void ToInt64(DType dtype, int64_t n, const void* x, int64_t* y) override {
    switch (dtype) {
      case DType::kInt64:
        std::copy_n(static_cast<const int64_t*>(x), n, y);
        break;
      case DType::kInt32:
        std::copy_n(static_cast<const int32_t*>(x), n, y);
        break;
      case DType::kUInt8:
        std::copy_n(static_cast<const uint8_t*>(x), n, y);
        break;
      default:
        throw Error(fmt::format("ids must be integers, got {}",
                                pipeline::DTypeName(dtype)));
    }
  }
  void CopyBlock(int64_t rows, int64_t cols, const float* x, int64_t ldx,
                 float* y, int64_t ldy, bool accumulate) override {
    ParallelRows(rows, cols, [&](int64_t r) {
      const float* in = x + r * ldx;
      float* out = y + r * ldy;
      if (accumulate) {
        for (int64_t c = 0; c < cols; ++c) out[c] += in[c];
      } else {
        std::copy_n(in, cols, out);
      }
    });
  }
  void DropoutMask(int64_t n, float rate, uint64_t seed, float* mask) override {
    const float keep = 1.0f / (1.0f - rate);
    const uint64_t threshold = static_cast<uint64_t>(static_cast<double>(rate) *
                                                     18446744073709551616.0);
    ParallelRows(n, 8, [&](int64_t i) {
      mask[i] =
          DropoutBits(seed, static_cast<uint64_t>(i)) < threshold ? 0.0f : keep;
    });
  }
  void ArgMax(int64_t rows, int64_t cols, const float* x,
              int64_t* out) override {
    ParallelRows(rows, cols, [&](int64_t r) {
      const float* z = x + r * cols;
      out[r] = cols == 0 ? 0 : std::max_element(z, z + cols) - z;
    });
  }
  void GreaterThan(int64_t n, const float* x, float threshold,
                   int64_t* out) override {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] > threshold ? 1 : 0;
  }

  void Gather(int64_t rows, int64_t dim, const float* table, int64_t n,
              const int64_t* ids, float* y) override {
    for (int64_t i = 0; i < n; ++i) {
      if (ids[i] < 0 || ids[i] >= rows) {
        throw Error(
            fmt::format("id {} at position {} is outside [0, {}) (the "
                        "embedding's rows)",
                        ids[i], i, rows));
      }
    }
    ParallelRows(n, dim, [&](int64_t i) {
      std::copy_n(table + ids[i] * dim, dim, y + i * dim);
    });
  }
  void ScatterAdd(int64_t dim, int64_t n, const int64_t* ids, const float* dy,
                  float* dtable) override {
    for (int64_t i = 0; i < n; ++i) {
      float* row = dtable + ids[i] * dim;
      const float* d = dy + i * dim;
      for (int64_t j = 0; j < dim; ++j) row[j] += d[j];
    }
  }

  void BatchNormForward(int64_t rows, int64_t cols, const float* x,
                        const float* gamma, const float* beta, float epsilon,
                        bool training, float momentum, float* moving_mean,
                        float* moving_var, float* mean, float* inv_std,
                        float* y) override {
    if (training) {
      ConstRowMatrix X(x, rows, cols);
      const Eigen::array<Eigen::Index, 1> first{0};
      Vector M(mean, cols), S(inv_std, cols);
      M.device(device_) = X.mean(first);
      const Eigen::array<Eigen::Index, 2> shape{1, cols};
      const Eigen::array<Eigen::Index, 2> times{rows, 1};
      S.device(device_) =
          (X - M.reshape(shape).broadcast(times)).square().mean(first);
      for (int64_t c = 0; c < cols; ++c) {
        const float var = inv_std[c];
        // Keras keeps the biased batch variance in its moving average.
        moving_mean[c] = momentum * moving_mean[c] + (1 - momentum) * mean[c];
        moving_var[c] = momentum * moving_var[c] + (1 - momentum) * var;
        inv_std[c] = 1.0f / std::sqrt(var + epsilon);
      }
    } else {
      for (int64_t c = 0; c < cols; ++c) {
        mean[c] = moving_mean[c];
        inv_std[c] = 1.0f / std::sqrt(moving_var[c] + epsilon);
      }
    }
    ParallelRows(rows, cols * 3, [&](int64_t r) {
      const float* xr = x + r * cols;
      float* yr = y + r * cols;
      for (int64_t c = 0; c < cols; ++c) {
        yr[c] = (xr[c] - mean[c]) * inv_std[c] * gamma[c] + beta[c];
      }
    });
  }

  void BatchNormBackward(int64_t rows, int64_t cols, bool training,
                         const float* x, const float* gamma, const float* mean,
                         const float* inv_std, const float* dy, float* dx,
                         float* dgamma, float* dbeta) override {
    std::vector<double> sum_dy(cols), sum_dy_xhat(cols);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      const float* dyr = dy + r * cols;
      for (int64_t c = 0; c < cols; ++c) {
        sum_dy[c] += dyr[c];
        sum_dy_xhat[c] += dyr[c] * (xr[c] - mean[c]) * inv_std[c];
      }
    }
    for (int64_t c = 0; c < cols; ++c) {
      if (dgamma != nullptr) dgamma[c] += static_cast<float>(sum_dy_xhat[c]);
      if (dbeta != nullptr) dbeta[c] += static_cast<float>(sum_dy[c]);
    }
    if (dx == nullptr) return;
    if (!training) {
      ParallelRows(rows, cols * 2, [&](int64_t r) {
        for (int64_t c = 0; c < cols; ++c) {
          dx[r * cols + c] += dy[r * cols + c] * gamma[c] * inv_std[c];
        }
      });
      return;
    }
    const double inv_rows = 1.0 / static_cast<double>(rows);
    ParallelRows(rows, cols * 6, [&](int64_t r) {
      const float* xr = x + r * cols;
      const float* dyr = dy + r * cols;
      float* dxr = dx + r * cols;
      for (int64_t c = 0; c < cols; ++c) {
        const double xhat = (xr[c] - mean[c]) * inv_std[c];
        dxr[c] += static_cast<float>(
            gamma[c] * inv_std[c] *
            (dyr[c] - sum_dy[c] * inv_rows - xhat * sum_dy_xhat[c] * inv_rows));
      }
    });
  }

  void SgdUpdate(int64_t n, float lr, const float* g, float* w) override {
    Vector(w, n).device(device_) -= ConstVector(g, n) * lr;
  }
  void MomentumUpdate(int64_t n, float lr, float momentum, bool nesterov,
                      const float* g, float* v, float* w) override {
    ConstVector G(g, n);
    Vector V(v, n), W(w, n);
    V.device(device_) = V * momentum + G;
    if (nesterov) {
      W.device(device_) -= (G + V * momentum) * lr;
    } else {
      W.device(device_) -= V * lr;
    }
  }
  void AdamUpdate(int64_t n, float lr_t, float beta1, float beta2,
                  float epsilon, const float* g, float* m, float* v,
                  float* w) override {
    ConstVector G(g, n);
    Vector M(m, n), V(v, n), W(w, n);
    M.device(device_) = M * beta1 + G * (1 - beta1);
    V.device(device_) = V * beta2 + G.square() * (1 - beta2);
    W.device(device_) -= M * lr_t / (V.sqrt() + V.constant(epsilon));
  }

 private:
  // Runs fn(row) for rows [0, n) on the pool; `cost` is a rough number of
  // operations per row, so that small work stays on one thread.
  template <typename Fn>
  void ParallelRows(int64_t n, int64_t cost, const Fn& fn) {
    if (n <= 0) return;
    if (n * cost < 32768 || threads_ == 1) {
      for (int64_t i = 0; i < n; ++i) fn(i);
      return;
    }
    device_.parallelFor(n, Eigen::TensorOpCost(0, 0, static_cast<double>(cost)),
                        [&](Eigen::Index first, Eigen::Index last) {
                          for (Eigen::Index i = first; i < last; ++i) fn(i);
                        });
  }

  template <typename Fn>
  void ForImageChunks(const Window2D& g, const Fn& fn) {
    const size_t per_image = static_cast<size_t>(
        g.out_h * g.out_w * g.window_h * g.window_w * g.in_c * 4);
    const int64_t chunk = std::max<int64_t>(
        1,
        static_cast<int64_t>(kMaxColumnBytes / std::max<size_t>(per_image, 1)));
    for (int64_t first = 0; first < g.batch; first += chunk) {
      fn(first, std::min(chunk, g.batch - first));
    }
  }

  // Rows (image, out_y, out_x) of patches (ky, kx, channel), zero outside
  // the input, for images [first, first + count).
  const float* Im2Col(const Window2D& g, const float* x, int64_t first,
                      int64_t count) {
    const int64_t patch = g.window_h * g.window_w * g.in_c;
    cols_.resize(static_cast<size_t>(count * g.out_h * g.out_w * patch));
    float* cols = cols_.data();
    ParallelRows(count * g.out_h, g.out_w * patch, [&](int64_t row) {
      const int64_t b = first + row / g.out_h, oh = row % g.out_h;
      const float* image = x + b * g.in_h * g.in_w * g.in_c;
      float* out = cols + row * g.out_w * patch;
      for (int64_t ow = 0; ow < g.out_w; ++ow) {
        for (int64_t ky = 0; ky < g.window_h; ++ky) {
          const int64_t iy = oh * g.stride_h - g.pad_top + ky;
          for (int64_t kx = 0; kx < g.window_w; ++kx) {
            const int64_t ix = ow * g.stride_w - g.pad_left + kx;
            if (iy < 0 || iy >= g.in_h || ix < 0 || ix >= g.in_w) {
              std::fill_n(out, g.in_c, 0.0f);
            } else {
              std::copy_n(image + (iy * g.in_w + ix) * g.in_c, g.in_c, out);
            }
            out += g.in_c;
          }
        }
      }
    });
    return cols;
  }

  void Col2Im(const Window2D& g, const float* dcols, int64_t first,
              int64_t count, float* dx) {
    const int64_t patch = g.window_h * g.window_w * g.in_c;
    ParallelRows(count, g.out_h * g.out_w * patch, [&](int64_t i) {
      const int64_t b = first + i;
      float* image = dx + b * g.in_h * g.in_w * g.in_c;
      const float* in = dcols + i * g.out_h * g.out_w * patch;
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        for (int64_t ow = 0; ow < g.out_w; ++ow) {
          for (int64_t ky = 0; ky < g.window_h; ++ky) {
            const int64_t iy = oh * g.stride_h - g.pad_top + ky;
            for (int64_t kx = 0; kx < g.window_w; ++kx) {
              const int64_t ix = ow * g.stride_w - g.pad_left + kx;
              if (iy >= 0 && iy < g.in_h && ix >= 0 && ix < g.in_w) {
                float* d = image + (iy * g.in_w + ix) * g.in_c;
                for (int64_t c = 0; c < g.in_c; ++c) d[c] += in[c];
              }
              in += g.in_c;
            }
          }
        }
      }
    });
  }

  // The window of output (b, oh, ow), clipped to the input.
  struct Clip {
    int64_t y0, y1, x0, x1;
  };
  static Clip ClipWindow(const Window2D& g, int64_t oh, int64_t ow) {
    const int64_t y = oh * g.stride_h - g.pad_top;
    const int64_t x = ow * g.stride_w - g.pad_left;
    return {std::max<int64_t>(y, 0), std::min(y + g.window_h, g.in_h),
            std::max<int64_t>(x, 0), std::min(x + g.window_w, g.in_w)};
  }

  static void PoolWindow(Pooling kind, const Window2D& g, const float* x,
                         int64_t b, int64_t oh, int64_t ow, float* out) {
    const Clip w = ClipWindow(g, oh, ow);
    const float* image = x + b * g.in_h * g.in_w * g.in_c;
    const float init =
        kind == Pooling::kMax ? -std::numeric_limits<float>::infinity() : 0.0f;
    std::fill_n(out, g.in_c, init);
    for (int64_t iy = w.y0; iy < w.y1; ++iy) {
      for (int64_t ix = w.x0; ix < w.x1; ++ix) {
        const float* in = image + (iy * g.in_w + ix) * g.in_c;
        if (kind == Pooling::kMax) {
          for (int64_t c = 0; c < g.in_c; ++c) out[c] = std::max(out[c], in[c]);
        } else {
          for (int64_t c = 0; c < g.in_c; ++c) out[c] += in[c];
        }
      }
    }
    if (kind == Pooling::kAverage) {
      const float n = static_cast<float>((w.y1 - w.y0) * (w.x1 - w.x0));
      for (int64_t c = 0; c < g.in_c; ++c) out[c] /= n;
    }
  }

  static void PoolWindowBackward(Pooling kind, const Window2D& g,
                                 const float* x, const float* y,
                                 const float* dy, int64_t b, int64_t oh,
                                 int64_t ow, float* dx) {
    const Clip w = ClipWindow(g, oh, ow);
    const int64_t base = b * g.in_h * g.in_w * g.in_c;
    if (kind == Pooling::kAverage) {
      const float n = static_cast<float>((w.y1 - w.y0) * (w.x1 - w.x0));
      for (int64_t iy = w.y0; iy < w.y1; ++iy) {
        for (int64_t ix = w.x0; ix < w.x1; ++ix) {
          float* d = dx + base + (iy * g.in_w + ix) * g.in_c;
          for (int64_t c = 0; c < g.in_c; ++c) d[c] += dy[c] / n;
        }
      }
      return;
    }
    // One pass over the window; each channel's gradient goes to the first
    // cell equal to its maximum.
    thread_local std::vector<uint8_t> routed;
    routed.assign(static_cast<size_t>(g.in_c), 0);
    for (int64_t iy = w.y0; iy < w.y1; ++iy) {
      for (int64_t ix = w.x0; ix < w.x1; ++ix) {
        const int64_t at = base + (iy * g.in_w + ix) * g.in_c;
        for (int64_t c = 0; c < g.in_c; ++c) {
          if (!routed[c] && x[at + c] == y[c]) {
            dx[at + c] += dy[c];
            routed[c] = 1;
          }
        }
      }
    }
  }

  static void SoftmaxRow(int64_t cols, const float* z, float* y) {
    const float max = *std::max_element(z, z + cols);
    double sum = 0;
    for (int64_t c = 0; c < cols; ++c) {
      y[c] = std::exp(z[c] - max);
      sum += y[c];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t c = 0; c < cols; ++c) y[c] *= inv;
  }

  const int threads_;
  Eigen::ThreadPool pool_;
  Eigen::ThreadPoolDevice device_;
  std::vector<float> cols_, dcols_;  // im2col scratch, reused
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(int threads) {
  return std::make_unique<CpuBackend>(threads);
}

std::string DeviceSpec::ToString() const {
  return device == Device::kCpu ? "cpu" : fmt::format("cuda:{}", index);
}

DeviceSpec ParseDevice(std::string_view text) {
  DeviceSpec spec;
  if (text == "cpu") return spec;
  if (text == "cuda" || text == "gpu") {
    spec.device = Device::kCuda;
    return spec;
  }
  if (text.starts_with("cuda:")) {
    const std::string_view n = text.substr(5);
    int index = 0;
    bool ok = !n.empty() && n.size() <= 4;
    for (char c : n) {
      if (c < '0' || c > '9') ok = false;
      index = index * 10 + (c - '0');
    }
    if (ok) {
      spec.device = Device::kCuda;
      spec.index = index;
      return spec;
    }
  }
  throw Error(fmt::format(
      "unknown device \"{}\" (expected cpu, cuda or cuda:N)", text));
}

std::unique_ptr<Backend> MakeBackend(const DeviceSpec& spec, int threads) {
  if (spec.device == Device::kCpu) return MakeCpuBackend(threads);
  // RECFLOW_CUDA_TF32=0 keeps matrix products and convolutions in full
  // float32 (as NVIDIA_TF32_OVERRIDE=0 does for TensorFlow).
  const char* tf32 = std::getenv("RECFLOW_CUDA_TF32");
  return MakeCudaBackend(spec.index,
                         tf32 == nullptr || std::string_view(tf32) != "0");
}

}  // namespace recflow::train
