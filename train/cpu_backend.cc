// The CPU backend.  Matrix products are OpenBLAS's sgemm on blocks of the
// output split over a ThreadTeam (see Blas below); convolutions are im2col +
// one product per group of images, each group on one thread (direct loops for a
// first layer's few input channels); everything elementwise is a plain loop or
// an Eigen array expression split over the same team.  Work is split only when
// it is large enough to gain (kGemmGrain, kGrain: measured, see
// docs/PERFORMANCE.md), so the small operations of a dense model stay on the
// caller.
#include <cblas.h>
#include <fmt/format.h>

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <span>
#include <string_view>
#include <thread>
#include <vector>

#include "train/backend.h"
#include "train/thread_team.h"

namespace recflow::train {

namespace {

using ArrayMap = Eigen::Map<Eigen::ArrayXf>;
using ConstArrayMap = Eigen::Map<const Eigen::ArrayXf>;

// Multiply-adds below which a product runs on one thread, and the least a
// thread gets when it is split.
constexpr int64_t kGemmGrain = int64_t{1} << 18;
// Simple operations (one per float for a copy or an add) below which a
// loop runs on one thread.
constexpr int64_t kGrain = int64_t{1} << 15;
// Bytes of im2col scratch per group of images: a group's columns and its
// output stay in L2 between the copy and the product.
constexpr int64_t kColumnGroupBytes = int64_t{512} << 10;

// Loops over short spans that GCC would otherwise turn into memmove and
// memset calls (a call per three floats for a one-channel image).
#if defined(__GNUC__) && !defined(__clang__)
#define RECFLOW_SPAN_LOOPS \
  __attribute__((optimize("no-tree-loop-distribute-patterns")))
#else
#define RECFLOW_SPAN_LOOPS
#endif

// Tasks per thread a convolution is split into.
constexpr int64_t kTasksPerThread = 4;

// Floats between the starts of two tasks' partial sums: whole cache lines
// and one spare, so no two tasks write into one line (false sharing made
// a split column sum slower than one thread).
int64_t PartialStride(int64_t n) { return (n + 15) / 16 * 16 + 16; }

// Products are OpenBLAS's sgemm, one call per block of C on the team's
// threads.  Its packing and micro-kernels reach 73-87 GFLOP/s on one core
// of this project's AVX2 machines where Eigen's reach 58-64 (the DNN's and
// CNN's shapes; docs/PERFORMANCE.md), so the library wins over writing our
// own.  OpenBLAS's own threads are set to one, once: the team splits the
// work, warm across a step, and OpenBLAS's pool would fight it.  Its
// pthread build (the one CMake links) takes calls from several threads at
// once; a sequential or OpenMP build loaded instead (LD_LIBRARY_PATH, or
// another variant chosen through Debian's alternatives) gets one call at a
// time, which is correct and slower, and name() says so.
struct Blas {
  Blas() {
    // Not asked again when it already has one (openblas_pool.cc): a pool
    // shut down is started anew by any openblas_set_num_threads.
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
    concurrent = openblas_get_parallel() == OPENBLAS_THREAD;
    std::string_view config = openblas_get_config();
    // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH NO_AFFINITY Zen ...": the
    // version and the kernels chosen for this CPU.
    const auto words = config.find(' ', config.find(' ') + 1);
    name =
        fmt::format("{} {}", config.substr(0, words), openblas_get_corename());
    if (!concurrent) name += ", one call at a time";
  }
  bool concurrent = false;
  std::string name;
  std::mutex serial;
};

Blas& TheBlas() {
  static Blas blas;
  return blas;
}

// Rows [r0, r1) x columns [c0, c1) of C = alpha op(A) op(B) + beta C, with
// C [m, n] and op(A) [m, k] row-major.  beta 0 writes C without reading it.
void GemmBlock(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, const float* b, float beta, float* c, int64_t r0,
               int64_t r1, int64_t c0, int64_t c1) {
  // CBLAS takes 32-bit sizes (Debian's libopenblas0 is LP64).
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  if (m > kMax || n > kMax || k > kMax) {
    throw Error(fmt::format(
        "a product of [{}, {}] by [{}, {}] has a side over {} values, the "
        "most OpenBLAS's 32-bit sizes address",
        m, k, k, n, kMax));
  }
  const auto call = [&] {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                tb ? CblasTrans : CblasNoTrans, static_cast<int>(r1 - r0),
                static_cast<int>(c1 - c0), static_cast<int>(k), alpha,
                ta ? a + r0 : a + r0 * k, static_cast<int>(ta ? m : k),
                tb ? b + c0 * k : b + c0, static_cast<int>(tb ? k : n), beta,
                c + r0 * n + c0, static_cast<int>(n));
  };
  Blas& blas = TheBlas();
  if (blas.concurrent) {
    call();
  } else {
    std::lock_guard lock(blas.serial);
    call();
  }
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads)
      : threads_(threads > 0
                     ? threads
                     : std::max(1, static_cast<int>(
                                       std::thread::hardware_concurrency()))),
        team_(threads_) {
    TheBlas();
  }

  Device device() const override { return Device::kCpu; }
  std::string name() const override {
    return fmt::format("cpu ({} thread{}; products: {})", threads_,
                       threads_ == 1 ? "" : "s", TheBlas().name);
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
    if (m <= 0 || n <= 0) return;
    if (k == 0) {
      Scale(m * n, beta, c);
      return;
    }
    SplitGemm(m, n, k, [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
      GemmBlock(ta, tb, m, n, k, alpha, a, b, beta, c, r0, r1, c0, c1);
    });
  }

  // Each task applies the epilogue to its own block of C right after
  // computing it, on the same core while the block is in its cache: no
  // second pass over C, and no second fork and join.
  void GemmBiasActivation(int64_t m, int64_t n, int64_t k, const float* a,
                          const float* b, const float* bias, Activation f,
                          float* c) override {
    if (m <= 0 || n <= 0) return;
    if (k == 0) {
      Fill(m * n, 0.0f, c);
      BiasActivation(m, n, bias, f, c);
      return;
    }
    SplitGemm(m, n, k, [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
      GemmBlock(false, false, m, n, k, 1.0f, a, b, 0.0f, c, r0, r1, c0, c1);
      for (int64_t r = r0; r < r1; ++r) {
        Epilogue(bias == nullptr ? nullptr : bias + c0, f, c + r * n + c0,
                 c1 - c0);
      }
    });
  }

  void Conv2D(const Window2D& g, const float* x, const float* w,
              float* y) override {
    if (Direct(g)) {
      ForImageRanges(g, [&](int64_t, int64_t first, int64_t end) {
        DirectConvImages(g, x, w, y, first, end);
      });
      return;
    }
    if (Winograd(g)) {
      WinogradFilter(w, g.in_c, g.out_c, &winograd_filter_);
      WinogradConv(g, x, winograd_filter_.data(), y, /*accumulate=*/false);
      return;
    }
    const int64_t patch = g.window_h * g.window_w * g.in_c;
    ForPixelGroups(g, [&](int64_t task, int64_t first, int64_t count) {
      const float* cols = Im2Col(g, x, first, count, Scratch(task, 0));
      GemmBlock(false, false, count, g.out_c, patch, 1.0f, cols, w, 0.0f,
                y + first * g.out_c, 0, count, 0, g.out_c);
    });
  }

  void Conv2DBackward(const Window2D& g, const float* x, const float* w,
                      const float* dy, float* dx, float* dw) override {
    if (Direct(g) && dw != nullptr) {
      SumOverImageRanges(g, g.window_h * g.window_w * g.in_c * g.out_c, dw,
                         [&](int64_t first, int64_t end, float* into) {
                           DirectFilterGradImages(g, x, dy, into, first, end);
                         });
      // dX, for an input that wants it, through the columns below.
      dw = nullptr;
      if (dx == nullptr) return;
    }
    if (Winograd(g) && dx != nullptr) {
      // dX is the convolution of dy with the filter turned by 180 degrees,
      // its channels swapped: the same 3x3 stride-1 transform.
      const Window2D t = TransposedWindow(g);
      const int64_t taps = 9, n = g.in_c * g.out_c;
      winograd_turned_.resize(static_cast<size_t>(taps * n));
      for (int64_t k = 0; k < taps; ++k) {
        const float* from = w + (taps - 1 - k) * n;
        float* to = winograd_turned_.data() + k * n;
        for (int64_t ci = 0; ci < g.in_c; ++ci) {
          for (int64_t co = 0; co < g.out_c; ++co) {
            to[co * g.in_c + ci] = from[ci * g.out_c + co];
          }
        }
      }
      WinogradFilter(winograd_turned_.data(), t.in_c, t.out_c,
                     &winograd_filter_);
      WinogradConv(t, dy, winograd_filter_.data(), dx, /*accumulate=*/true);
      dx = nullptr;
    }
    if (Winograd(g)) {
      if (dw != nullptr) WinogradFilterGrad(g, x, dy, dw);
      return;
    }
    const int64_t patch = g.window_h * g.window_w * g.in_c;
    const int64_t filter = patch * g.out_c;
    const int64_t stride = PartialStride(filter);
    // Each task sums its images' dW apart; the sums are added in task
    // order, so a team size gives the same dW every run.
    const int64_t tasks = ImageTasks(g);
    std::vector<float>& partial = dw_partial_;
    if (dw != nullptr && tasks > 1) {
      partial.assign(static_cast<size_t>(tasks * stride), 0.0f);
    }
    ForPixelGroups(g, [&](int64_t task, int64_t first, int64_t count) {
      const float* dy_group = dy + first * g.out_c;
      if (dw != nullptr) {
        const float* cols = Im2Col(g, x, first, count, Scratch(task, 0));
        float* into = tasks > 1 ? partial.data() + task * stride : dw;
        GemmBlock(true, false, patch, g.out_c, count, 1.0f, cols, dy_group,
                  1.0f, into, 0, patch, 0, g.out_c);
      }
      if (dx != nullptr) {
        std::vector<float>& dcols = Scratch(task, 1);
        dcols.resize(static_cast<size_t>(count * patch));
        GemmBlock(false, true, count, patch, g.out_c, 1.0f, dy_group, w, 0.0f,
                  dcols.data(), 0, count, 0, patch);
        Col2Im(g, dcols.data(), first, count, dx);
      }
    });
    if (dw != nullptr && tasks > 1) AddPartials(tasks, stride, filter, dw);
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
    PoolBackward(kind, g, x, y, dy, dx, /*write=*/false);
  }
  void Pool2DBackwardWrite(Pooling kind, const Window2D& g, const float* x,
                           const float* y, const float* dy,
                           float* dx) override {
    PoolBackward(kind, g, x, y, dy, dx, /*write=*/true);
  }

 private:
  // write: each image's dx is zeroed just before its windows add into it,
  // while it is in cache, instead of in a pass of its own.  When no two
  // windows share a cell (stride >= window, as the usual 2x2 / 2 pooling)
  // each window assigns its cells instead of adding, and an image whose
  // cells the windows cover (stride == window, no leading padding) is not
  // zeroed at all: dx is written once.
  void PoolBackward(Pooling kind, const Window2D& g, const float* x,
                    const float* y, const float* dy, float* dx, bool write) {
    // Split by images, so that no two threads add into the same dx cell.
    const int64_t image = g.in_h * g.in_w * g.in_c;
    const int64_t cost = g.out_h * g.out_w * g.window_h * g.window_w * g.in_c;
    const bool assign =
        write && g.stride_h >= g.window_h && g.stride_w >= g.window_w;
    const bool covered = g.stride_h == g.window_h && g.stride_w == g.window_w &&
                         g.pad_top <= 0 && g.pad_left <= 0 &&
                         g.out_h * g.stride_h >= g.in_h &&
                         g.out_w * g.stride_w >= g.in_w;
    team_.For(g.batch, RowGrain(cost), [&](int64_t first, int64_t end) {
      for (int64_t b = first; b < end; ++b) {
        if (write && !(assign && covered)) {
          std::memset(dx + b * image, 0,
                      static_cast<size_t>(image) * sizeof(float));
        }
        for (int64_t oh = 0; oh < g.out_h; ++oh) {
          for (int64_t ow = 0; ow < g.out_w; ++ow) {
            const int64_t o = ((b * g.out_h + oh) * g.out_w + ow) * g.in_c;
            if (assign) {
              PoolWindowBackward<true>(kind, g, x, y + o, dy + o, b, oh, ow,
                                       dx);
            } else {
              PoolWindowBackward<false>(kind, g, x, y + o, dy + o, b, oh, ow,
                                        dx);
            }
          }
        }
      }
    });
  }

 public:
  void ActivationForward(Activation f, int64_t n, const float* x,
                         float* y) override {
    if (f == Activation::kLinear && x == y) return;
    team_.For(n, kGrain / ActivationCost(f), [&](int64_t lo, int64_t hi) {
      ArrayMap out(y + lo, hi - lo);
      Activate(f, ConstArrayMap(x + lo, hi - lo), out);
    });
  }

  void ActivationBackward(Activation f, int64_t n, const float* y,
                          const float* dy, float beta, float* dx) override {
    team_.For(n, kGrain, [&](int64_t lo, int64_t hi) {
      ActivationGrad(f, y + lo, dy + lo, dx + lo, hi - lo,
                     /*accumulate=*/beta != 0.0f);
    });
  }

  void BiasActivation(int64_t rows, int64_t cols, const float* b, Activation f,
                      float* y) override {
    ParallelRows(rows, cols * ActivationCost(f),
                 [&](int64_t r) { Epilogue(b, f, y + r * cols, cols); });
  }

  void BiasActivationBackward(int64_t rows, int64_t cols, Activation f,
                              const float* y, const float* dy, float* dz,
                              float* db) override {
    CheckEpilogueAliasing(f, dy, dz);
    RowsWithColumnSums(rows, cols, 1.0f, db, [&](int64_t r) {
      const int64_t at = r * cols;
      if (f != Activation::kLinear || dz != dy) {
        ActivationGrad(f, y + at, dy + at, dz + at, cols,
                       /*accumulate=*/false);
      }
      return dz + at;
    });
  }

  void Softmax(int64_t rows, int64_t cols, const float* x, float* y) override {
    team_.For(rows, RowGrain(cols * 4), [&](int64_t lo, int64_t hi) {
      ShiftedExps(hi - lo, cols, x + lo * cols, y + lo * cols);
      for (int64_t r = lo; r < hi; ++r) {
        float* yr = y + r * cols;
        double sum = 0;
        for (int64_t c = 0; c < cols; ++c) sum += yr[c];
        ArrayMap(yr, cols) *= static_cast<float>(1.0 / sum);
      }
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
    // Rows at a time: the shifted logits of a range of rows go through one
    // vectorised float exp (Eigen's) and are summed per row in double.  Two
    // scalar double exps per logit, row by row, made this 10-class loss a
    // fifth of the DNN step's non-GEMM time.
    team_.For(rows, RowGrain(cols * 8), [&](int64_t lo, int64_t hi) {
      // The range's exps, then its rows' maxima.
      thread_local std::vector<float> scratch;
      const int64_t n = (hi - lo) * cols;
      if (scratch.size() < static_cast<size_t>(n + hi - lo)) {
        scratch.resize(static_cast<size_t>(n + hi - lo));
      }
      const float* z = logits + lo * cols;
      float* e = scratch.data();
      float* maxima = e + n;
      ShiftedExps(hi - lo, cols, z, e, maxima);
      for (int64_t r = 0; r < hi - lo; ++r) {
        const float* zr = z + r * cols;
        const float* er = e + r * cols;
        const float max = maxima[r];
        double sum = 0;
        for (int64_t c = 0; c < cols; ++c) sum += er[c];
        const double log_sum = std::log(sum);
        const int64_t label = labels[lo + r];
        losses[lo + r] = static_cast<float>(log_sum - (zr[label] - max));
        if (dlogits != nullptr) {
          const float inv = static_cast<float>(1.0 / sum);
          float* d = dlogits + (lo + r) * cols;
          ArrayMap(d, cols) = (scale * inv) * ConstArrayMap(er, cols);
          d[label] -= scale;
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
        dlogits[i] = scale * (1.0f / (1.0f + std::exp(-x)) - z);
      }
    });
  }

  void Fill(int64_t n, float value, float* y) override {
    team_.For(n, kGrain, [&](int64_t lo, int64_t hi) {
      if (value == 0.0f) {
        std::memset(y + lo, 0, static_cast<size_t>(hi - lo) * sizeof(float));
      } else {
        std::fill(y + lo, y + hi, value);
      }
    });
  }
  void Copy(int64_t n, const float* x, float* y) override {
    if (x == y) return;
    team_.For(n, kGrain, [&](int64_t lo, int64_t hi) {
      std::memcpy(y + lo, x + lo, static_cast<size_t>(hi - lo) * sizeof(float));
    });
  }
  void Axpby(int64_t n, float alpha, const float* x, float beta,
             float* y) override {
    team_.For(n, kGrain, [&](int64_t lo, int64_t hi) {
      ConstArrayMap X(x + lo, hi - lo);
      ArrayMap Y(y + lo, hi - lo);
      if (beta == 1.0f && alpha == 1.0f) {
        Y += X;
      } else if (beta == 1.0f) {
        Y += X * alpha;
      } else if (beta == 0.0f) {
        Y = X * alpha;
      } else {
        Y = X * alpha + Y * beta;
      }
    });
  }
  void Multiply(int64_t n, const float* x, const float* y, float* z) override {
    team_.For(n, kGrain, [&](int64_t lo, int64_t hi) {
      ArrayMap(z + lo, hi - lo) =
          ConstArrayMap(x + lo, hi - lo) * ConstArrayMap(y + lo, hi - lo);
    });
  }
  void BiasAdd(int64_t rows, int64_t cols, const float* x, const float* b,
               float* y) override {
    ParallelRows(rows, cols, [&](int64_t r) {
      ArrayMap(y + r * cols, cols) =
          ConstArrayMap(x + r * cols, cols) + ConstArrayMap(b, cols);
    });
  }
  void ColumnSum(int64_t rows, int64_t cols, const float* x, float beta,
                 float* out) override {
    RowsWithColumnSums(rows, cols, beta, out,
                       [&](int64_t r) { return x + r * cols; });
  }
  void Sum(int64_t n, const float* x, float scale, float* y) override {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += x[i];
    y[0] = static_cast<float>(sum * scale);
  }
  void AxpyScalar(int64_t n, const float* alpha, const float* x, float beta,
                  float* y) override {
    const float a = alpha[0];
    team_.For(n, kGrain, [&](int64_t lo, int64_t hi) {
      ArrayMap Y(y + lo, hi - lo);
      if (beta == 0.0f) {
        if (x == nullptr) {
          Y.setConstant(a);
        } else {
          Y = ConstArrayMap(x + lo, hi - lo) * a;
        }
      } else if (x == nullptr) {
        Y += a;
      } else {
        Y += ConstArrayMap(x + lo, hi - lo) * a;
      }
    });
  }
  void Convert(DType dtype, int64_t n, const void* x, float scale,
               float* y) override {
    auto convert = [&](const auto* in) {
      team_.For(n, kGrain / 2, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          y[i] = static_cast<float>(in[i]) * scale;
        }
      });
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
      // Two passes in double: the mean, then the (biased) variance.
      std::vector<double> sum(static_cast<size_t>(cols)),
          squares(static_cast<size_t>(cols));
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) sum[c] += x[r * cols + c];
      }
      const double inv_rows = rows == 0 ? 0.0 : 1.0 / static_cast<double>(rows);
      for (int64_t c = 0; c < cols; ++c) mean[c] = float(sum[c] * inv_rows);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const double d = x[r * cols + c] - mean[c];
          squares[c] += d * d;
        }
      }
      for (int64_t c = 0; c < cols; ++c) {
        const float var = static_cast<float>(squares[c] * inv_rows);
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
    team_.For(n, kGrain, [&](int64_t lo, int64_t hi) {
      ArrayMap(w + lo, hi - lo) -= ConstArrayMap(g + lo, hi - lo) * lr;
    });
  }
  void MomentumUpdate(int64_t n, float lr, float momentum, bool nesterov,
                      const float* g, float* v, float* w) override {
    team_.For(n, kGrain / 4, [&](int64_t lo, int64_t hi) {
      ConstArrayMap G(g + lo, hi - lo);
      ArrayMap V(v + lo, hi - lo), W(w + lo, hi - lo);
      V = V * momentum + G;
      if (nesterov) {
        W -= (G + V * momentum) * lr;
      } else {
        W -= V * lr;
      }
    });
  }
  void AdamUpdate(int64_t n, float lr_t, float beta1, float beta2,
                  float epsilon, const float* g, float* m, float* v,
                  float* w) override {
    team_.For(n, kGrain / 8, [&](int64_t lo, int64_t hi) {
      Adam(lo, hi, lr_t, beta1, beta2, epsilon, g, m, v, w);
    });
  }
  // Every variable's values laid end to end and split over the team as one
  // loop: small variables (biases) cost no split of their own.
  void AdamUpdateAll(std::span<const AdamVariable> vars, float lr_t,
                     float beta1, float beta2, float epsilon) override {
    // The calling thread's (the team's threads read it through this
    // reference; a thread_local named in the loop would be their own).
    thread_local std::vector<int64_t> starts_of_this_thread;
    std::vector<int64_t>& starts = starts_of_this_thread;
    starts.assign(1, 0);
    for (const AdamVariable& a : vars) starts.push_back(starts.back() + a.n);
    team_.For(starts.back(), kGrain / 8, [&](int64_t lo, int64_t hi) {
      // The variable holding value lo, then each one [lo, hi) reaches.
      size_t k = static_cast<size_t>(
          std::upper_bound(starts.begin(), starts.end(), lo) - starts.begin() -
          1);
      for (; lo < hi; ++k) {
        const AdamVariable& a = vars[k];
        const int64_t end = std::min(hi, starts[k + 1]);
        const int64_t to = end - starts[k];
        // A gradient's piece is zeroed right after Adam read it, while it
        // is still in L1.
        constexpr int64_t kPiece = 2048;
        for (int64_t from = lo - starts[k]; from < to; from += kPiece) {
          const int64_t until = std::min(to, from + kPiece);
          Adam(from, until, lr_t, beta1, beta2, epsilon, a.g, a.m, a.v, a.w);
          std::memset(a.g + from, 0,
                      static_cast<size_t>(until - from) * sizeof(float));
        }
        lo = end;
      }
    });
  }

 private:
  // TensorFlow's Adam over values [lo, hi).
  static void Adam(int64_t lo, int64_t hi, float lr_t, float beta1, float beta2,
                   float epsilon, const float* g, float* m, float* v,
                   float* w) {
    ConstArrayMap G(g + lo, hi - lo);
    ArrayMap M(m + lo, hi - lo), V(v + lo, hi - lo), W(w + lo, hi - lo);
    M = M * beta1 + G * (1 - beta1);
    V = V * beta2 + G.square() * (1 - beta2);
    W -= M * lr_t / (V.sqrt() + epsilon);
  }

  // y *= beta over n values (beta 0: zeros, whatever y held).
  void Scale(int64_t n, float beta, float* y) {
    if (beta == 0.0f) {
      Fill(n, 0.0f, y);
    } else if (beta != 1.0f) {
      Axpby(n, 0.0f, y, beta, y);
    }
  }

  // Operations per value of f: exp and tanh cost about 16 adds.
  static int64_t ActivationCost(Activation f) {
    return f == Activation::kSigmoid || f == Activation::kTanh ? 16 : 1;
  }

  // out = f(in), elementwise (out may be in).
  template <typename In>
  static void Activate(Activation f, const In& in, ArrayMap& out) {
    switch (f) {
      case Activation::kLinear:
        out = in;
        break;
      case Activation::kRelu:
        out = in.max(0.0f);
        break;
      case Activation::kSigmoid:
        out = in.logistic();
        break;
      case Activation::kTanh:
        out = in.tanh();
        break;
    }
  }

  // y = f(y + b) over n values of one row (b null: no bias).
  static void Epilogue(const float* b, Activation f, float* y, int64_t n) {
    ArrayMap out(y, n);
    if (b != nullptr) out += ConstArrayMap(b, n);
    if (f != Activation::kLinear) Activate(f, out, out);
  }

  // dx (+)= f'(.) dy over n values from the activation's output y.
  static void ActivationGrad(Activation f, const float* y, const float* dy,
                             float* dx, int64_t n, bool accumulate) {
    ConstArrayMap Y(y, n), DY(dy, n);
    ArrayMap DX(dx, n);
    auto apply = [&](const auto& grad) {
      if (accumulate) {
        DX += grad;
      } else {
        DX = grad;
      }
    };
    switch (f) {
      case Activation::kLinear:
        apply(DY);
        break;
      case Activation::kRelu:
        apply((Y > 0.0f).select(DY, 0.0f));
        break;
      case Activation::kSigmoid:
        apply(DY * Y * (1.0f - Y));
        break;
      case Activation::kTanh:
        apply(DY * (1.0f - Y * Y));
        break;
    }
  }

  // Rows per thread at least, for rows of `cost` operations each, so that
  // small work stays on one thread.
  static int64_t RowGrain(int64_t cost) {
    return std::max<int64_t>(1, kGrain / std::max<int64_t>(cost, 1));
  }

  // Calls block(r0, r1, c0, c1) for the blocks of an [m, n] product with
  // depth k: one block below kGemmGrain, else the longer side of C split
  // into one block of whole SIMD widths per task.
  template <typename Fn>
  void SplitGemm(int64_t m, int64_t n, int64_t k, const Fn& block) {
    const int64_t tasks = team_.Tasks(m * n * k, kGemmGrain);
    if (tasks <= 1) {
      block(int64_t{0}, m, int64_t{0}, n);
      return;
    }
    const bool by_rows = m >= n;
    const int64_t extent = by_rows ? m : n;
    const int64_t unit = by_rows ? 8 : 16;
    const int64_t step =
        ((extent + tasks - 1) / tasks + unit - 1) / unit * unit;
    team_.Run(tasks, [&](int64_t t) {
      const int64_t lo = std::min(extent, t * step);
      const int64_t hi = std::min(extent, lo + step);
      if (lo >= hi) return;
      if (by_rows) {
        block(lo, hi, int64_t{0}, n);
      } else {
        block(int64_t{0}, m, lo, hi);
      }
    });
  }

  // Runs fn(row) for rows [0, n) on the team; `cost` is a rough number of
  // operations per row.
  template <typename Fn>
  void ParallelRows(int64_t n, int64_t cost, const Fn& fn) {
    team_.For(n, RowGrain(cost), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) fn(i);
    });
  }

  // Runs row(r) for rows [0, rows) on the team, each returning the row of
  // `cols` values it computed (or read), and, when `out` is not null, sets
  // out = beta * out + the rows' column sums.  Each range of rows sums
  // apart and the sums are added in range order: the same numbers every
  // run at one team size.
  template <typename RowFn>
  void RowsWithColumnSums(int64_t rows, int64_t cols, float beta, float* out,
                          const RowFn& row) {
    const int64_t tasks = team_.Tasks(rows, RowGrain(cols));
    const int64_t chunk = tasks == 0 ? 0 : (rows + tasks - 1) / tasks;
    const int64_t stride = PartialStride(cols);
    if (out != nullptr) {
      column_partial_.assign(static_cast<size_t>(tasks * stride), 0.0f);
    }
    team_.Run(tasks, [&](int64_t t) {
      float* sum =
          out != nullptr ? column_partial_.data() + t * stride : nullptr;
      for (int64_t r = t * chunk; r < std::min(rows, (t + 1) * chunk); ++r) {
        const float* values = row(r);
        if (sum != nullptr) ArrayMap(sum, cols) += ConstArrayMap(values, cols);
      }
    });
    if (out == nullptr) return;
    ArrayMap o(out, cols);
    if (beta == 0.0f) {
      o.setZero();
    } else if (beta != 1.0f) {
      o *= beta;
    }
    for (int64_t t = 0; t < tasks; ++t) {
      o += ConstArrayMap(column_partial_.data() + t * stride, cols);
    }
  }

  // How many tasks a convolution's images are split into: several per
  // thread, taken as threads come free, so that a thread the input
  // pipeline's threads preempt holds up a share of the batch, not half.
  int64_t ImageTasks(const Window2D& g) const {
    const int64_t per_image =
        g.out_h * g.out_w * g.window_h * g.window_w * g.in_c * g.out_c;
    const int64_t by_size =
        g.batch * per_image / std::max<int64_t>(kGemmGrain, 1);
    if (threads_ == 1 || by_size < 2) return 1;
    return std::clamp<int64_t>(
        by_size, 1, std::min<int64_t>(g.batch, kTasksPerThread * threads_));
  }

  // Convolutions over at most kDirectChannels input channels (an image
  // model's first layer: grey or RGB) with whole SIMD widths of filters run
  // as direct loops: through im2col their patches are a few floats long and
  // the product's k is 9 or 27, far below a core's speed.  Each image is
  // first copied into a zero-padded one (PaddedImage), so that every tap of
  // every output pixel reads inside it and the loops have no bounds.  Sums
  // stay in registers (forward: 8 pixels' outputs for one SIMD width of
  // filters across the window; dW: a block of up to 3x3 taps' gradients
  // across the image), and memory is read, not written, in the inner
  // loops: the earlier tap-by-tap loops added into the output row in
  // memory, a load and a store per multiply-add, and ran at 18-23 GFLOP/s
  // (docs/PERFORMANCE.md).
  static constexpr int64_t kDirectChannels = 4;
  // One SIMD register of floats (zmm, ymm or xmm, as the build's target
  // has): GCC's vector extension, not an Eigen array, so that a few of
  // them stay in registers across the loops below.  Never wider than the
  // target's registers: GCC lowers a wider vector through memory (16
  // floats on AVX2 made these loops 4-10x slower).
#if defined(__AVX512F__)
  static constexpr int64_t kLanes = 16;
#elif defined(__AVX__)
  static constexpr int64_t kLanes = 8;
#else
  static constexpr int64_t kLanes = 4;
#endif
  using Lanes = float __attribute__((vector_size(kLanes * sizeof(float))));
  // Lanes at any float's address: one unaligned load or store, through a
  // packed struct (GCC staged memcpy's AVX2 stores on the stack, and clang
  // keeps a vector typedef's natural alignment whatever aligned() says).
  struct __attribute__((packed, may_alias)) UnalignedLanes {
    Lanes v;
  };
  static Lanes LoadLanes(const float* p) {
    return reinterpret_cast<const UnalignedLanes*>(p)->v;
  }
  static void StoreLanes(float* p, const Lanes& v) {
    reinterpret_cast<UnalignedLanes*>(p)->v = v;
  }
  static bool Direct(const Window2D& g) {
    return g.in_c <= kDirectChannels && g.out_c % kLanes == 0;
  }

  // An image's zero-padded copy, with rows and columns enough for every
  // window of the output (the padding SAME adds, none VALID leaves out),
  // laid out as planes: one per channel and column phase (the column
  // modulo stride_w).  Tap (ky, kx, c) of output pixel (oh, ow) is then
  // plane (c, kx % stride_w), row oh * stride_h + ky, column
  // ow + kx / stride_w: neighbouring pixels read neighbouring floats
  // whatever the channels and stride, so the loops below address a
  // pixel of a block by a constant offset.
  struct PaddedImage {
    explicit PaddedImage(const Window2D& g)
        : g(g),
          h((g.out_h - 1) * g.stride_h + g.window_h),
          w((g.out_w - 1) * g.stride_w + g.window_w),
          cols((w + g.stride_w - 1) / g.stride_w),
          plane(h * cols),
          values(static_cast<size_t>(g.in_c * g.stride_w * plane)) {}
    // Copies image b of x in.
    void Fill(const float* x, int64_t b) {
      const int64_t ic = g.in_c, sw = g.stride_w;
      const float* image = x + b * g.in_h * g.in_w * ic;
      for (int64_t c = 0; c < ic; ++c) {
        for (int64_t phase = 0; phase < sw; ++phase) {
          float* out = values.data() + (c * sw + phase) * plane;
          for (int64_t r = 0; r < h; ++r, out += cols) {
            const int64_t iy = r - g.pad_top;
            if (iy < 0 || iy >= g.in_h) {
              std::fill_n(out, cols, 0.0f);
              continue;
            }
            const float* in = image + iy * g.in_w * ic + c;
            // Column j is padded column j * sw + phase.
            for (int64_t j = 0, ix = phase - g.pad_left; j < cols;
                 ++j, ix += sw) {
              out[j] = ix >= 0 && ix < g.in_w ? in[ix * ic] : 0.0f;
            }
          }
        }
      }
    }
    // Where tap (ky, kx, c) of pixel (oh, 0) is.
    const float* Tap(int64_t oh, int64_t ky, int64_t kx, int64_t c) const {
      return values.data() + (c * g.stride_w + kx % g.stride_w) * plane +
             (oh * g.stride_h + ky) * cols + kx / g.stride_w;
    }
    const Window2D& g;
    const int64_t h, w, cols, plane;
    std::vector<float> values;
  };

  // y of images [first, end): for each output row, blocks of 8 pixels
  // (then 4, then one by one), each block's sums for one SIMD width of
  // filters in registers over the whole window.
  static void DirectConvImages(const Window2D& g, const float* x,
                               const float* w, float* y, int64_t first,
                               int64_t end) {
    PaddedImage image(g);
    // Each tap's offset from tap (0, 0, 0), in the weights' order.
    std::vector<int64_t> taps;
    for (int64_t ky = 0; ky < g.window_h; ++ky) {
      for (int64_t kx = 0; kx < g.window_w; ++kx) {
        for (int64_t c = 0; c < g.in_c; ++c) {
          taps.push_back(image.Tap(0, ky, kx, c) - image.Tap(0, 0, 0, 0));
        }
      }
    }
    for (int64_t b = first; b < end; ++b) {
      image.Fill(x, b);
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        float* row = y + (b * g.out_h + oh) * g.out_w * g.out_c;
        const float* in = image.Tap(oh, 0, 0, 0);
        int64_t ow = 0;
        // 8 sums in flight keep both FMA pipes busy through their latency.
        for (; ow + 8 <= g.out_w; ow += 8) {
          DirectConvPixels<8>(g, taps, in + ow, w, row + ow * g.out_c);
        }
        if (ow + 4 <= g.out_w) {
          DirectConvPixels<4>(g, taps, in + ow, w, row + ow * g.out_c);
          ow += 4;
        }
        for (; ow < g.out_w; ++ow) {
          DirectConvPixels<1>(g, taps, in + ow, w, row + ow * g.out_c);
        }
      }
    }
  }

  // P neighbouring output pixels (`out`, filters innermost), the first of
  // which reads its tap t at in[taps[t]] and the next pixels the floats
  // after it.
  template <int P>
  static void DirectConvPixels(const Window2D& g,
                               const std::vector<int64_t>& taps,
                               const float* in, const float* w, float* out) {
    const int64_t oc = g.out_c, n = static_cast<int64_t>(taps.size());
    for (int64_t f0 = 0; f0 < oc; f0 += kLanes) {
      Lanes sum[P] = {};
      const float* wt = w + f0;
      for (int64_t t = 0; t < n; ++t, wt += oc) {
        const Lanes wv = LoadLanes(wt);
        const float* tap = in + taps[t];
        for (int p = 0; p < P; ++p) sum[p] += tap[p] * wv;
      }
      for (int p = 0; p < P; ++p) StoreLanes(out + p * oc + f0, sum[p]);
    }
  }

  // dw += dW of images [first, end): for each image, SIMD width of
  // filters, channel and block of up to kRows x kCols neighbouring taps,
  // the block's gradients summed in registers over the whole image (each
  // output gradient loaded once per block).
  static void DirectFilterGradImages(const Window2D& g, const float* x,
                                     const float* dy, float* dw, int64_t first,
                                     int64_t end) {
    PaddedImage image(g);
    for (int64_t b = first; b < end; ++b) {
      image.Fill(x, b);
      const float* dy_image = dy + b * g.out_h * g.out_w * g.out_c;
      for (int64_t f0 = 0; f0 < g.out_c; f0 += kLanes) {
        for (int64_t c = 0; c < g.in_c; ++c) {
          for (int64_t ky = 0; ky < g.window_h; ky += kRows) {
            for (int64_t kx = 0; kx < g.window_w; kx += kCols) {
              const TapBlock at{f0, ky, kx, c};
              const int64_t rows = std::min(kRows, g.window_h - ky);
              const int64_t cols = std::min(kCols, g.window_w - kx);
              FilterGradBlock(rows, cols, g, image, dy_image, at, dw);
            }
          }
        }
      }
    }
  }
  // Taps per block, window rows and columns: 9 sums in registers (of
  // AVX2's 16, AVX-512's 32), each output gradient loaded once for them.
  static constexpr int64_t kRows = 3;
  static constexpr int64_t kCols = 3;
  // Filters [f0, f0 + kLanes) of taps (ky + r, kx + t, c).
  struct TapBlock {
    int64_t f0, ky, kx, c;
  };

  // FilterGradTaps<rows, cols>.
  static void FilterGradBlock(int64_t rows, int64_t cols, const Window2D& g,
                              const PaddedImage& image, const float* dy_image,
                              const TapBlock& at, float* dw) {
    static_assert(kRows == 3 && kCols == 3);
    using Fn = void (*)(const Window2D&, const PaddedImage&, const float*,
                        const TapBlock&, float*);
    static constexpr Fn kBlocks[3][3] = {
        {FilterGradTaps<1, 1>, FilterGradTaps<1, 2>, FilterGradTaps<1, 3>},
        {FilterGradTaps<2, 1>, FilterGradTaps<2, 2>, FilterGradTaps<2, 3>},
        {FilterGradTaps<3, 1>, FilterGradTaps<3, 2>, FilterGradTaps<3, 3>}};
    kBlocks[rows - 1][cols - 1](g, image, dy_image, at, dw);
  }

  // dw of the R x C taps `at` names += their sums over the image.
  template <int R, int C>
  static void FilterGradTaps(const Window2D& g, const PaddedImage& image,
                             const float* dy_image, const TapBlock& at,
                             float* dw) {
    const int64_t oc = g.out_c;
    const float* in[R][C];
    for (int r = 0; r < R; ++r) {
      for (int t = 0; t < C; ++t) {
        in[r][t] = image.Tap(0, at.ky + r, at.kx + t, at.c);
      }
    }
    const int64_t line = g.stride_h * image.cols;
    Lanes sum[R][C] = {};
    const float* d = dy_image + at.f0;
    for (int64_t oh = 0; oh < g.out_h; ++oh) {
      for (int64_t ow = 0; ow < g.out_w; ++ow, d += oc) {
        const Lanes dv = LoadLanes(d);
        for (int r = 0; r < R; ++r) {
          for (int t = 0; t < C; ++t) sum[r][t] += in[r][t][ow] * dv;
        }
      }
      for (int r = 0; r < R; ++r) {
        for (int t = 0; t < C; ++t) in[r][t] += line;
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int t = 0; t < C; ++t) {
        float* into =
            dw + (((at.ky + r) * g.window_w + at.kx + t) * g.in_c + at.c) * oc +
            at.f0;
        StoreLanes(into, LoadLanes(into) + sum[r][t]);
      }
    }
  }

  // --- Winograd F(2x2, 3x3) ------------------------------------------------
  //
  // 3x3 convolutions of stride 1 over many channels (a CNN's second layer:
  // 32 -> 64 at 14x14) were the step: their three products (forward, dX,
  // dW) through im2col ran at OpenBLAS's peak and were ~60% of a CNN step.
  // Winograd's minimal filtering (Lavin and Gray, 2015) computes each 2x2
  // block of outputs from a 4x4 block of inputs with 16 multiplies per
  // channel pair instead of 36: the input tiles and the filter are
  // transformed (V = B^T d B, U = G g G^T), each of the 16 positions of a
  // tile is one product V[xi] (tiles x in_c) by U[xi] (in_c x out_c), and
  // the 2x2 outputs come back as A^T M A.  2.25x fewer multiply-adds in
  // products with k = in_c, plus the transforms' passes over memory.  The
  // forward pass, dX (the same convolution with the filter turned and its
  // channels swapped) and dW (WinogradFilterGrad) all take it.  Rounding: the
  // transforms add and subtract up to 16 terms, so results differ from
  // im2col's in the last bits (tests: within 1e-4 of the plain sums, and
  // 1e-6 of their terms' magnitudes for large images).
  static constexpr int64_t kWinogradMinChannels = 16;
  // Bytes of V and M per group of tiles (tiles x 16 x (in_c + out_c)
  // floats): products of a few hundred rows, still in L2/L3 between the
  // transforms and the products.  Groups are runs of tiles, not whole
  // images, so a task's scratch stays this size however large an image is
  // (1,024 tiles at 16 -> 16 channels; 341 at 32 -> 64).
  static constexpr int64_t kWinogradGroupBytes = int64_t{2} << 20;
  // G of U = G g G^T (and of dW = G^T dU G).
  static constexpr float kWinogradG[4][3] = {{1.0f, 0.0f, 0.0f},
                                             {0.5f, 0.5f, 0.5f},
                                             {0.5f, -0.5f, 0.5f},
                                             {0.0f, 0.0f, 1.0f}};

  static bool Winograd(const Window2D& g) {
    return g.window_h == 3 && g.window_w == 3 && g.stride_h == 1 &&
           g.stride_w == 1 && g.in_c >= kWinogradMinChannels &&
           g.out_c >= kWinogradMinChannels;
  }

  // The convolution that gives dX from dy: input dy (out_h x out_w x
  // out_c), output dX (in_h x in_w x in_c), padded so that output pixel iy
  // reads dy rows iy + pad_top - 2 .. iy + pad_top.
  static Window2D TransposedWindow(const Window2D& g) {
    Window2D t;
    t.batch = g.batch;
    t.in_h = g.out_h;
    t.in_w = g.out_w;
    t.in_c = g.out_c;
    t.window_h = t.window_w = 3;
    t.out_c = g.in_c;
    t.out_h = g.in_h;
    t.out_w = g.in_w;
    t.pad_top = 2 - g.pad_top;
    t.pad_left = 2 - g.pad_left;
    return t;
  }

  // U[16][in_c][out_c] = G g G^T for every channel pair, from w [3][3][in_c]
  // [out_c].
  static void WinogradFilter(const float* w, int64_t in_c, int64_t out_c,
                             std::vector<float>* u) {
    const int64_t n = in_c * out_c;
    u->assign(static_cast<size_t>(16 * n), 0.0f);
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 4; ++j) {
        float* out = u->data() + (i * 4 + j) * n;
        for (int kh = 0; kh < 3; ++kh) {
          for (int kw = 0; kw < 3; ++kw) {
            const float c = kWinogradG[i][kh] * kWinogradG[j][kw];
            if (c == 0.0f) continue;
            const float* in = w + (kh * 3 + kw) * n;
            for (int64_t k = 0; k < n; ++k) out[k] += c * in[k];
          }
        }
      }
    }
  }

  // fn(task, first, rows, v, m) over groups of 2x2 output tiles (numbered
  // image by image, tile-row by tile-row): the batch is split into
  // ImageTasks(g) contiguous ranges of images, one task each, and each
  // range into runs of `rows` tiles with V (v: 16 x rows x in_c) and M or
  // dM (m: 16 x rows x out_c) in the task's scratch, kWinogradGroupBytes
  // together.
  template <typename Fn>
  void ForWinogradGroups(const Window2D& g, const Fn& fn) {
    const int64_t per_image = ((g.out_h + 1) / 2) * ((g.out_w + 1) / 2);
    const int64_t group = std::max<int64_t>(
        1, kWinogradGroupBytes / (16 * (g.in_c + g.out_c) * 4));
    const int64_t tasks = ImageTasks(g);
    if (scratch_.size() < static_cast<size_t>(tasks)) {
      scratch_.resize(static_cast<size_t>(tasks));
    }
    ForImageRanges(g, [&](int64_t t, int64_t first, int64_t end) {
      for (int64_t at = first * per_image; at < end * per_image; at += group) {
        const int64_t rows = std::min(group, end * per_image - at);
        std::vector<float>& v = Scratch(t, 0);
        std::vector<float>& m = Scratch(t, 1);
        v.resize(static_cast<size_t>(16 * rows * g.in_c));
        m.resize(static_cast<size_t>(16 * rows * g.out_c));
        fn(t, at, rows, v.data(), m.data());
      }
    });
  }

  // y = conv(x, the filter whose transform is u) for a 3x3 stride-1
  // window g (y += with `accumulate`), split over the team by images.
  void WinogradConv(const Window2D& g, const float* x, const float* u, float* y,
                    bool accumulate) {
    ForWinogradGroups(
        g, [&](int64_t, int64_t first, int64_t rows, float* v, float* m) {
          WinogradInput(g, x, first, rows, v);
          for (int64_t xi = 0; xi < 16; ++xi) {
            GemmBlock(false, false, rows, g.out_c, g.in_c, 1.0f,
                      v + xi * rows * g.in_c, u + xi * g.in_c * g.out_c, 0.0f,
                      m + xi * rows * g.out_c, 0, rows, 0, g.out_c);
          }
          WinogradOutput(g, m, first, rows, y, accumulate);
        });
  }

  // dW += the filter gradient, through the same transforms: with M = V . U
  // per tile position and Y = A^T M A, dM = A dY A^T per tile, dU[xi] = the
  // sum over tiles of V[xi]^T dM[xi] (16 products with k = tiles: long, so
  // near the library's peak), and dW = G^T dU G.  Each task sums its
  // images' dU apart and the sums are added in task order, so a team size
  // gives the same dW every run.
  void WinogradFilterGrad(const Window2D& g, const float* x, const float* dy,
                          float* dw) {
    const int64_t n = g.in_c * g.out_c;
    const int64_t tasks = ImageTasks(g);
    const int64_t stride = PartialStride(16 * n);
    dw_partial_.assign(static_cast<size_t>(tasks * stride), 0.0f);
    ForWinogradGroups(
        g, [&](int64_t t, int64_t first, int64_t rows, float* v, float* dm) {
          float* du = dw_partial_.data() + t * stride;
          WinogradInput(g, x, first, rows, v);
          WinogradOutputGrad(g, dy, first, rows, dm);
          for (int64_t xi = 0; xi < 16; ++xi) {
            GemmBlock(true, false, g.in_c, g.out_c, rows, 1.0f,
                      v + xi * rows * g.in_c, dm + xi * rows * g.out_c, 1.0f,
                      du + xi * n, 0, g.in_c, 0, g.out_c);
          }
        });
    // dW[kh][kw] += sum over (i, j) of G[i][kh] G[j][kw] dU[i][j], with dU
    // the tasks' sums in task order.
    team_.For(n, kGrain / 16, [&](int64_t lo, int64_t hi) {
      std::vector<float> du(static_cast<size_t>(16 * (hi - lo)), 0.0f);
      for (int64_t t = 0; t < tasks; ++t) {
        const float* p = dw_partial_.data() + t * stride;
        for (int64_t xi = 0; xi < 16; ++xi) {
          float* into = du.data() + xi * (hi - lo);
          const float* from = p + xi * n + lo;
          for (int64_t k = 0; k < hi - lo; ++k) into[k] += from[k];
        }
      }
      for (int kh = 0; kh < 3; ++kh) {
        for (int kw = 0; kw < 3; ++kw) {
          float* out = dw + (kh * 3 + kw) * n + lo;
          for (int i = 0; i < 4; ++i) {
            for (int j = 0; j < 4; ++j) {
              const float c = kWinogradG[i][kh] * kWinogradG[j][kw];
              if (c == 0.0f) continue;
              const float* from = du.data() + (i * 4 + j) * (hi - lo);
              for (int64_t k = 0; k < hi - lo; ++k) out[k] += c * from[k];
            }
          }
        }
      }
    });
  }

  // transform(load, store, k) for channels [0, c): with Lanes loads and
  // stores a SIMD width of channels at a time, then with float ones one
  // channel at a time for the rest.  The transforms below are written once
  // for both.
  template <typename Transform>
  static void ForLanesAndRest(int64_t c, const Transform& transform) {
    int64_t k = 0;
    for (; k + kLanes <= c; k += kLanes) {
      transform([](const float* p) { return LoadLanes(p); },
                [](float* p, const Lanes& v) { StoreLanes(p, v); }, k);
    }
    for (; k < c; ++k) {
      transform([](const float* p) { return *p; },
                [](float* p, float v) { *p = v; }, k);
    }
  }

  // dM[16][rows][out_c] = A dY A^T for the 2x2 block of dy of every tile
  // (zero where the tile lies outside the output): the gradient of M
  // through WinogradOutput's A^T M A.
  static void WinogradOutputGrad(const Window2D& g, const float* dy,
                                 int64_t first, int64_t count, float* dm) {
    const int64_t c = g.out_c;
    const int64_t tiles_h = (g.out_h + 1) / 2, tiles_w = (g.out_w + 1) / 2;
    const int64_t step = count * c;
    const std::vector<float> zeros(static_cast<size_t>(c), 0.0f);
    const int64_t per_image = tiles_h * tiles_w;
    for (int64_t row = 0; row < count; ++row) {
      const int64_t tile = first + row, b = tile / per_image;
      const int64_t ty = tile % per_image / tiles_w, tx = tile % tiles_w;
      const float* image = dy + b * g.out_h * g.out_w * c;
      const float* in[2][2];
      for (int64_t r = 0; r < 2; ++r) {
        for (int64_t col = 0; col < 2; ++col) {
          const int64_t oy = 2 * ty + r, ox = 2 * tx + col;
          in[r][col] = oy < g.out_h && ox < g.out_w
                           ? image + (oy * g.out_w + ox) * c
                           : zeros.data();
        }
      }
      float* out = dm + row * c;
      const auto transform = [&](auto load, auto store, int64_t k) {
        // e = A dY (4x2), then dM = e A^T (4x4).
        const auto y00 = load(in[0][0] + k), y01 = load(in[0][1] + k);
        const auto y10 = load(in[1][0] + k), y11 = load(in[1][1] + k);
        const decltype(y00) e[4][2] = {{y00, y01},
                                       {y00 + y10, y01 + y11},
                                       {y00 - y10, y01 - y11},
                                       {-y10, -y11}};
        for (int i = 0; i < 4; ++i) {
          store(out + (i * 4 + 0) * step + k, e[i][0]);
          store(out + (i * 4 + 1) * step + k, e[i][0] + e[i][1]);
          store(out + (i * 4 + 2) * step + k, e[i][0] - e[i][1]);
          store(out + (i * 4 + 3) * step + k, -e[i][1]);
        }
      };
      ForLanesAndRest(c, transform);
    }
  }

  // V[16][rows][in_c] = B^T d B for the 4x4 input tile d of every output
  // tile of images [first, first + count) (rows in image, tile-row,
  // tile-column order), zero outside the input.  SIMD widths of channels
  // at a time, then one channel at a time for the rest.
  static void WinogradInput(const Window2D& g, const float* x, int64_t first,
                            int64_t count, float* v) {
    const int64_t c = g.in_c;
    const int64_t tiles_h = (g.out_h + 1) / 2, tiles_w = (g.out_w + 1) / 2;
    const int64_t step = count * c;  // between positions xi
    const std::vector<float> zeros(static_cast<size_t>(c), 0.0f);
    const int64_t per_image = tiles_h * tiles_w;
    for (int64_t row = 0; row < count; ++row) {
      const int64_t tile = first + row, b = tile / per_image;
      const int64_t ty = tile % per_image / tiles_w, tx = tile % tiles_w;
      const float* image = x + b * g.in_h * g.in_w * c;
      const float* d[4][4];
      for (int64_t i = 0; i < 4; ++i) {
        const int64_t iy = 2 * ty - g.pad_top + i;
        for (int64_t j = 0; j < 4; ++j) {
          const int64_t ix = 2 * tx - g.pad_left + j;
          d[i][j] = iy >= 0 && iy < g.in_h && ix >= 0 && ix < g.in_w
                        ? image + (iy * g.in_w + ix) * c
                        : zeros.data();
        }
      }
      float* out = v + row * c;
      const auto transform = [&](auto load, auto store, int64_t k) {
        // t = B^T d (by rows), then V = t B (by columns).
        decltype(load(d[0][0])) t[4][4];
        for (int j = 0; j < 4; ++j) {
          const auto d0 = load(d[0][j] + k), d1 = load(d[1][j] + k);
          const auto d2 = load(d[2][j] + k), d3 = load(d[3][j] + k);
          t[0][j] = d0 - d2;
          t[1][j] = d1 + d2;
          t[2][j] = d2 - d1;
          t[3][j] = d1 - d3;
        }
        for (int i = 0; i < 4; ++i) {
          store(out + (i * 4 + 0) * step + k, t[i][0] - t[i][2]);
          store(out + (i * 4 + 1) * step + k, t[i][1] + t[i][2]);
          store(out + (i * 4 + 2) * step + k, t[i][2] - t[i][1]);
          store(out + (i * 4 + 3) * step + k, t[i][1] - t[i][3]);
        }
      };
      ForLanesAndRest(c, transform);
    }
  }

  // The 2x2 outputs A^T M A of every tile from M[16][rows][out_c], written
  // (or added) where they fall inside the output.
  static void WinogradOutput(const Window2D& g, const float* m, int64_t first,
                             int64_t count, float* y, bool accumulate) {
    const int64_t c = g.out_c;
    const int64_t tiles_h = (g.out_h + 1) / 2, tiles_w = (g.out_w + 1) / 2;
    const int64_t step = count * c;
    // Outputs of a tile outside y go here (and are dropped).
    std::vector<float> spill(static_cast<size_t>(c));
    const int64_t per_image = tiles_h * tiles_w;
    for (int64_t row = 0; row < count; ++row) {
      const int64_t tile = first + row, b = tile / per_image;
      const int64_t ty = tile % per_image / tiles_w, tx = tile % tiles_w;
      float* image = y + b * g.out_h * g.out_w * c;
      const float* in = m + row * c;
      float* out[4];
      bool add[4];
      for (int64_t r = 0; r < 2; ++r) {
        for (int64_t col = 0; col < 2; ++col) {
          const int64_t oy = 2 * ty + r, ox = 2 * tx + col;
          const bool inside = oy < g.out_h && ox < g.out_w;
          out[r * 2 + col] =
              inside ? image + (oy * g.out_w + ox) * c : spill.data();
          add[r * 2 + col] = accumulate && inside;
        }
      }
      const auto transform = [&](auto load, auto store, int64_t k) {
        // u = A^T M (by rows), then Y = u A (by columns).
        decltype(load(in)) u0[4], u1[4];
        for (int j = 0; j < 4; ++j) {
          const auto s0 = load(in + (0 * 4 + j) * step + k);
          const auto s1 = load(in + (1 * 4 + j) * step + k);
          const auto s2 = load(in + (2 * 4 + j) * step + k);
          const auto s3 = load(in + (3 * 4 + j) * step + k);
          u0[j] = s0 + s1 + s2;
          u1[j] = s1 - s2 - s3;
        }
        const decltype(load(in)) q[4] = {
            u0[0] + u0[1] + u0[2], u0[1] - u0[2] - u0[3], u1[0] + u1[1] + u1[2],
            u1[1] - u1[2] - u1[3]};
        for (int o = 0; o < 4; ++o) {
          store(out[o] + k, add[o] ? load(out[o] + k) + q[o] : q[o]);
        }
      };
      ForLanesAndRest(c, transform);
    }
  }

  // fn(task, first, end) over ImageTasks(g) contiguous ranges of images.
  template <typename Fn>
  void ForImageRanges(const Window2D& g, const Fn& fn) {
    const int64_t tasks = ImageTasks(g);
    const int64_t chunk = (g.batch + tasks - 1) / tasks;
    team_.Run(tasks, [&](int64_t t) {
      const int64_t first = t * chunk, end = std::min(g.batch, first + chunk);
      if (first < end) fn(t, first, end);
    });
  }

  // out[0, n) += what fn(first, end, into) adds into `into` over the image
  // ranges (into zeroed partials, added in task order, so that a team size
  // gives the same sums every run).
  template <typename Fn>
  void SumOverImageRanges(const Window2D& g, int64_t n, float* out,
                          const Fn& fn) {
    const int64_t tasks = ImageTasks(g);
    if (tasks <= 1) {
      fn(int64_t{0}, g.batch, out);
      return;
    }
    const int64_t stride = PartialStride(n);
    dw_partial_.assign(static_cast<size_t>(tasks * stride), 0.0f);
    ForImageRanges(g, [&](int64_t t, int64_t first, int64_t end) {
      fn(first, end, dw_partial_.data() + t * stride);
    });
    AddPartials(tasks, stride, n, out);
  }

  // out[0, n) += the `tasks` partial sums in dw_partial_, `stride` apart,
  // added in task order (so that a team size gives the same sums every
  // run), split over the team by ranges of out.
  void AddPartials(int64_t tasks, int64_t stride, int64_t n, float* out) {
    team_.For(n, kGrain / tasks, [&](int64_t lo, int64_t hi) {
      for (int64_t t = 0; t < tasks; ++t) {
        const float* p = dw_partial_.data() + t * stride;
        for (int64_t i = lo; i < hi; ++i) out[i] += p[i];
      }
    });
  }

  // fn(task, first, count) over groups of output pixels (numbered image by
  // image, row by row): the batch is split into ImageTasks(g) contiguous
  // ranges of images, one task each, and each range into runs of pixels
  // whose im2col columns fit kColumnGroupBytes.  Runs, not whole images,
  // so that a task's columns stay that size however large an image is
  // (at least one pixel's patch).
  template <typename Fn>
  void ForPixelGroups(const Window2D& g, const Fn& fn) {
    const int64_t pixels = g.out_h * g.out_w;
    const int64_t patch_bytes = g.window_h * g.window_w * g.in_c * 4;
    const int64_t group = std::max<int64_t>(
        1, kColumnGroupBytes / std::max<int64_t>(patch_bytes, 1));
    const int64_t tasks = ImageTasks(g);
    if (scratch_.size() < static_cast<size_t>(tasks)) {
      scratch_.resize(static_cast<size_t>(tasks));
    }
    ForImageRanges(g, [&](int64_t t, int64_t first, int64_t end) {
      for (int64_t at = first * pixels; at < end * pixels; at += group) {
        fn(t, at, std::min(group, end * pixels - at));
      }
    });
  }

  // Scratch buffer `which` of task `task` (ForPixelGroups sizes them).
  std::vector<float>& Scratch(int64_t task, int which) {
    return scratch_[static_cast<size_t>(task)][which];
  }

  // Rows of patches (ky, kx, channel), zero outside the input, for output
  // pixels [first, first + count) (numbered image by image, row by row),
  // into `scratch`.  A patch row inside the input is window_w * in_c
  // contiguous floats, copied as one span; small spans (the first layer's
  // in_c = 1) are copied by the loops below rather than one memmove call
  // per value.
  RECFLOW_SPAN_LOOPS static const float* Im2Col(const Window2D& g,
                                                const float* x, int64_t first,
                                                int64_t count,
                                                std::vector<float>& scratch) {
    const int64_t c = g.in_c;
    const int64_t patch = g.window_h * g.window_w * c;
    const int64_t pixels = g.out_h * g.out_w;
    scratch.resize(static_cast<size_t>(count * patch));
    float* out = scratch.data();
    int64_t b = first / pixels, oh = first % pixels / g.out_w,
            ow = first % g.out_w;
    for (int64_t p = 0; p < count; ++p) {
      const float* image = x + b * g.in_h * g.in_w * c;
      const auto [x0, lo, hi] = InsideColumns(g, ow);
      for (int64_t ky = 0; ky < g.window_h; ++ky) {
        const int64_t iy = oh * g.stride_h - g.pad_top + ky;
        if (iy < 0 || iy >= g.in_h) {
          ZeroSpan(out, g.window_w * c);
        } else {
          ZeroSpan(out, lo * c);
          CopySpan(image + (iy * g.in_w + x0 + lo) * c, out + lo * c,
                   (hi - lo) * c);
          ZeroSpan(out + hi * c, (g.window_w - hi) * c);
        }
        out += g.window_w * c;
      }
      NextPixel(g, &b, &oh, &ow);
    }
    return scratch.data();
  }

  // The output pixel after (b, oh, ow), row by row, image by image.
  static inline void NextPixel(const Window2D& g, int64_t* b, int64_t* oh,
                               int64_t* ow) {
    if (++*ow < g.out_w) return;
    *ow = 0;
    if (++*oh < g.out_h) return;
    *oh = 0;
    ++*b;
  }

  // Output column ow's window starts at input column x0 (negative in the
  // padding); its columns [lo, hi) lie inside the input.
  struct ColumnSpan {
    int64_t x0, lo, hi;
  };
  RECFLOW_SPAN_LOOPS static inline ColumnSpan InsideColumns(const Window2D& g,
                                                            int64_t ow) {
    const int64_t x0 = ow * g.stride_w - g.pad_left;
    const int64_t lo = std::clamp<int64_t>(-x0, 0, g.window_w);
    return {x0, lo, std::clamp<int64_t>(g.in_w - x0, lo, g.window_w)};
  }

  // Spans of a few floats to a few hundred: loops the compiler keeps (no
  // memmove/memset call for three values); the callers carry the same
  // attribute so that these inline into them.
  RECFLOW_SPAN_LOOPS static inline void CopySpan(const float* __restrict in,
                                                 float* __restrict out,
                                                 int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = in[i];
  }
  RECFLOW_SPAN_LOOPS static inline void ZeroSpan(float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = 0.0f;
  }
  RECFLOW_SPAN_LOOPS static inline void AddSpan(const float* __restrict in,
                                                float* __restrict out,
                                                int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] += in[i];
  }

  // Adds the columns' gradients of output pixels [first, first + count)
  // back into dx.
  RECFLOW_SPAN_LOOPS static void Col2Im(const Window2D& g, const float* dcols,
                                        int64_t first, int64_t count,
                                        float* dx) {
    const int64_t c = g.in_c;
    const int64_t pixels = g.out_h * g.out_w;
    const float* in = dcols;
    int64_t b = first / pixels, oh = first % pixels / g.out_w,
            ow = first % g.out_w;
    for (int64_t p = 0; p < count; ++p) {
      float* image = dx + b * g.in_h * g.in_w * c;
      const auto [x0, lo, hi] = InsideColumns(g, ow);
      for (int64_t ky = 0; ky < g.window_h; ++ky) {
        const int64_t iy = oh * g.stride_h - g.pad_top + ky;
        if (iy >= 0 && iy < g.in_h) {
          AddSpan(in + lo * c, image + (iy * g.in_w + x0 + lo) * c,
                  (hi - lo) * c);
        }
        in += g.window_w * c;
      }
      NextPixel(g, &b, &oh, &ow);
    }
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

  // Assign: the window's cells are written, not added to (no other
  // window shares them).
  template <bool Assign>
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
          for (int64_t c = 0; c < g.in_c; ++c) {
            d[c] = (Assign ? 0.0f : d[c]) + dy[c] / n;
          }
        }
      }
      return;
    }
    // Each channel's gradient goes to the first cell of the window equal
    // to its maximum: cells in order, each taking what is left of dy where
    // it matches and clearing it.  The matches are data-dependent (about
    // one cell in four for 2x2 windows), so they are bit masks, not
    // branches: written as `hit ? left : 0`, GCC compiled a scalar compare
    // and a mispredicted jump per value, and this loop was a fifth of the
    // CNN's step.  A SIMD width of channels at a time keeps what is left in
    // a register across the window's cells, not in scratch memory.  What
    // bounds the loop now is reading x (the convolution's output) from
    // memory.
    using Bits = uint32_t __attribute__((vector_size(sizeof(Lanes))));
    const int64_t channels = g.in_c;
    const int64_t row = g.in_w * channels;
    int64_t c = 0;
    for (; c + kLanes <= channels; c += kLanes) {
      Bits left = std::bit_cast<Bits>(LoadLanes(dy + c));
      const Lanes top = LoadLanes(y + c);
      for (int64_t iy = w.y0; iy < w.y1; ++iy) {
        for (int64_t ix = w.x0; ix < w.x1; ++ix) {
          const int64_t at = base + iy * row + ix * channels + c;
          const Bits hit = reinterpret_cast<Bits>(LoadLanes(x + at) == top);
          const Lanes take = std::bit_cast<Lanes>(left & hit);
          left &= ~hit;
          StoreLanes(dx + at, Assign ? take : LoadLanes(dx + at) + take);
        }
      }
    }
    for (; c < channels; ++c) {
      uint32_t left = std::bit_cast<uint32_t>(dy[c]);
      for (int64_t iy = w.y0; iy < w.y1; ++iy) {
        for (int64_t ix = w.x0; ix < w.x1; ++ix) {
          const int64_t at = base + iy * row + ix * channels + c;
          const uint32_t hit = -static_cast<uint32_t>(x[at] == y[c]);
          const float take = std::bit_cast<float>(left & hit);
          left &= ~hit;
          dx[at] = Assign ? take : dx[at] + take;
        }
      }
    }
  }

  // e = exp(z - the row's max) over `rows` rows of `cols`: the shifts row
  // by row, then one vectorised exp over all of them (a row of 10 classes
  // is too short for SIMD on its own).  e may be z.  The maxima go to
  // `maxima` ([rows]) unless it is null.
  static void ShiftedExps(int64_t rows, int64_t cols, const float* z, float* e,
                          float* maxima = nullptr) {
    for (int64_t r = 0; r < rows; ++r) {
      const float* zr = z + r * cols;
      const float max = *std::max_element(zr, zr + cols);
      if (maxima != nullptr) maxima[r] = max;
      float* er = e + r * cols;
      for (int64_t c = 0; c < cols; ++c) er[c] = zr[c] - max;
    }
    VectorisedExp(e, rows * cols);
  }

  // x = exp(x), every value through Eigen's vectorised exp.  An exp over a
  // map of x itself would take the values before x's first aligned packet
  // and after its last whole one through the scalar exp, which differs in
  // the last bits: results would then depend on where x lies, and a buffer
  // whose place the heap decides (the cross-entropy's scratch) made the
  // same training run differ from run to run (docs/PERFORMANCE.md,
  // 2026-11-25).  Through an aligned block of whole packets instead, each
  // value's exp is the same wherever it lies.
  static void VectorisedExp(float* x, int64_t n) {
    constexpr int64_t kBlock = 256;  // whole packets of any SIMD width
    alignas(64) float block[kBlock];
    for (int64_t at = 0; at < n; at += kBlock) {
      const int64_t m = std::min(kBlock, n - at);
      std::copy_n(x + at, m, block);
      std::fill(block + m, block + kBlock, 0.0f);
      Eigen::Map<Eigen::Array<float, kBlock, 1>, Eigen::Aligned64> b(block);
      b = b.exp();
      std::copy_n(block, m, x + at);
    }
  }

  const int threads_;
  ThreadTeam team_;
  // Per task: im2col columns and their gradients, reused across calls.
  std::vector<std::array<std::vector<float>, 2>> scratch_;
  // Winograd: the filter's transform, and the filter turned for dX.
  std::vector<float> winograd_filter_;
  std::vector<float> winograd_turned_;
  std::vector<float> dw_partial_, column_partial_;
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(int threads) {
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace recflow::train
