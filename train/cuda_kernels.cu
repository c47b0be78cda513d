// The CUDA backend's own kernels (cuda_kernels.h): elementwise maps with
// grid-stride loops, row-wise work one warp per row, column reductions in
// two deterministic passes (no float atomics where the order of a sum
// would change the result from run to run).
#include <cfloat>
#include <cstdint>

#include "train/cuda_kernels.h"

namespace recflow::train::cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > 8192 ? 8192 : b));
}

#define GRID_STRIDE(i, n)                                                   \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); \
       i += int64_t(blockDim.x) * gridDim.x)

__device__ void RecordError(DeviceError* err, int code, long long value,
                            long long position, long long limit) {
  if (atomicCAS(&err->code, 0, code) == 0) {
    err->value = value;
    err->position = position;
    err->limit = limit;
    __threadfence_system();
  }
}

__device__ double WarpSumD(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__global__ void FillK(int64_t n, float v, float* y) {
  GRID_STRIDE(i, n) y[i] = v;
}
__global__ void AxpbyK(int64_t n, float a, const float* x, float b, float* y) {
  if (b == 0.0f) {
    GRID_STRIDE(i, n) y[i] = a * x[i];
  } else if (b == 1.0f) {
    GRID_STRIDE(i, n) y[i] += a * x[i];
  } else {
    GRID_STRIDE(i, n) y[i] = a * x[i] + b * y[i];
  }
}
__global__ void AxpyScalarK(int64_t n, const float* alpha, const float* x,
                            float beta, float* y) {
  const float a = *alpha;
  if (beta == 0.0f) {
    if (x == nullptr) {
      GRID_STRIDE(i, n) y[i] = a;
    } else {
      GRID_STRIDE(i, n) y[i] = a * x[i];
    }
  } else if (x == nullptr) {
    GRID_STRIDE(i, n) y[i] += a;
  } else {
    GRID_STRIDE(i, n) y[i] += a * x[i];
  }
}
__global__ void MultiplyK(int64_t n, const float* x, const float* y, float* z) {
  GRID_STRIDE(i, n) z[i] = x[i] * y[i];
}
__global__ void BiasAddK(int64_t rows, int64_t cols, const float* x,
                         const float* b, float* y) {
  GRID_STRIDE(i, rows * cols) y[i] = x[i] + b[i % cols];
}

// Column sums in two passes: blocks of 32 columns x 8 row lanes reduce a
// chunk of rows each into partial[chunk, c]; the second pass adds the
// chunks in order.
constexpr int64_t kRowsPerChunk = 1024;

__global__ void ColumnPartialK(int64_t rows, int64_t cols, const float* x,
                               const float* y, float* partial) {
  // y != null: sums x * y (for batch norm's sum of dy * xhat terms).
  __shared__ double tile[8][33];
  const int64_t c = blockIdx.x * 32 + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  const int64_t r0 = chunk * kRowsPerChunk;
  const int64_t r1 = min(rows, r0 + kRowsPerChunk);
  double s = 0;
  if (c < cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
      const float v = x[r * cols + c];
      s += y == nullptr ? v : double(v) * y[r * cols + c];
    }
  }
  tile[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    double t = 0;
    for (int k = 0; k < 8; ++k) t += tile[k][threadIdx.x];
    partial[chunk * cols + c] = static_cast<float>(t);
  }
}

__global__ void ColumnFinishK(int64_t chunks, int64_t cols,
                              const float* partial, float beta, float* out) {
  GRID_STRIDE(c, cols) {
    double s = 0;
    for (int64_t k = 0; k < chunks; ++k) s += partial[k * cols + c];
    out[c] = static_cast<float>(s) + (beta == 0.0f ? 0.0f : beta * out[c]);
  }
}

int64_t Chunks(int64_t rows) {
  return rows <= 0 ? 1 : (rows + kRowsPerChunk - 1) / kRowsPerChunk;
}

void ColumnPartials(cudaStream_t s, int64_t rows, int64_t cols, const float* x,
                    const float* y, float* partial) {
  const dim3 grid(static_cast<unsigned>((cols + 31) / 32),
                  static_cast<unsigned>(Chunks(rows)));
  ColumnPartialK<<<grid, dim3(32, 8), 0, s>>>(rows, cols, x, y, partial);
}

__global__ void SumK(int64_t n, const float* x, float scale, float* y) {
  __shared__ double warp[32];
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  s = WarpSumD(s);
  if ((threadIdx.x & 31) == 0) warp[threadIdx.x >> 5] = s;
  __syncthreads();
  if (threadIdx.x < 32) {
    double t = threadIdx.x < (blockDim.x >> 5) ? warp[threadIdx.x] : 0.0;
    t = WarpSumD(t);
    if (threadIdx.x == 0) y[0] = static_cast<float>(t * scale);
  }
}

template <typename T>
__global__ void ConvertK(int64_t n, const T* x, float scale, float* y) {
  GRID_STRIDE(i, n) y[i] = static_cast<float>(x[i]) * scale;
}
template <typename T>
__global__ void ToInt64K(int64_t n, const T* x, int64_t* y) {
  GRID_STRIDE(i, n) y[i] = static_cast<int64_t>(x[i]);
}

__global__ void CopyBlockK(int64_t rows, int64_t cols, const float* x,
                           int64_t ldx, float* y, int64_t ldy,
                           bool accumulate) {
  GRID_STRIDE(i, rows * cols) {
    const int64_t r = i / cols, c = i % cols;
    if (accumulate) {
      y[r * ldy + c] += x[r * ldx + c];
    } else {
      y[r * ldy + c] = x[r * ldx + c];
    }
  }
}

__device__ uint64_t Bits(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
__global__ void DropoutMaskK(int64_t n, uint64_t threshold, float keep,
                             uint64_t seed, float* mask) {
  GRID_STRIDE(i, n) {
    mask[i] = Bits(seed, static_cast<uint64_t>(i)) < threshold ? 0.0f : keep;
  }
}

__global__ void ArgMaxK(int64_t rows, int64_t cols, const float* x,
                        int64_t* out) {
  GRID_STRIDE(r, rows) {
    const float* z = x + r * cols;
    int64_t best = 0;
    for (int64_t c = 1; c < cols; ++c) {
      if (z[c] > z[best]) best = c;
    }
    out[r] = best;
  }
}
__global__ void GreaterThanK(int64_t n, const float* x, float t, int64_t* out) {
  GRID_STRIDE(i, n) out[i] = x[i] > t ? 1 : 0;
}

__global__ void ActivationForwardK(int f, int64_t n, const float* x, float* y) {
  GRID_STRIDE(i, n) {
    const float v = x[i];
    switch (f) {
      case 1:
        y[i] = fmaxf(v, 0.0f);
        break;
      case 2:
        y[i] = 1.0f / (1.0f + expf(-v));
        break;
      case 3:
        y[i] = tanhf(v);
        break;
      default:
        y[i] = v;
    }
  }
}
__global__ void ActivationBackwardK(int f, int64_t n, const float* y,
                                    const float* dy, float beta, float* dx) {
  GRID_STRIDE(i, n) {
    const float v = y[i], d = dy[i];
    float g;
    switch (f) {
      case 1:
        g = v > 0.0f ? d : 0.0f;
        break;
      case 2:
        g = d * v * (1.0f - v);
        break;
      case 3:
        g = d * (1.0f - v * v);
        break;
      default:
        g = d;
    }
    // beta 0: written, never read (the buffer may hold anything).
    dx[i] = beta == 0.0f ? g : dx[i] + g;
  }
}

// One warp per row.
__global__ void SoftmaxK(int64_t rows, int64_t cols, const float* x, float* y) {
  const int64_t r = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const float* z = x + r * cols;
  float m = -FLT_MAX;
  for (int64_t c = lane; c < cols; c += 32) m = fmaxf(m, z[c]);
  m = WarpMax(m);
  double s = 0;
  for (int64_t c = lane; c < cols; c += 32) s += expf(z[c] - m);
  s = WarpSumD(s);
  const float inv = static_cast<float>(1.0 / s);
  for (int64_t c = lane; c < cols; c += 32)
    y[r * cols + c] = expf(z[c] - m) * inv;
}
__global__ void SoftmaxBackwardK(int64_t rows, int64_t cols, const float* y,
                                 const float* dy, float* dx) {
  const int64_t r = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const float* yr = y + r * cols;
  const float* dyr = dy + r * cols;
  double dot = 0;
  for (int64_t c = lane; c < cols; c += 32) dot += double(dyr[c]) * yr[c];
  dot = WarpSumD(dot);
  for (int64_t c = lane; c < cols; c += 32) {
    dx[r * cols + c] += yr[c] * static_cast<float>(dyr[c] - dot);
  }
}
__global__ void SparseXentK(int64_t rows, int64_t cols, const float* logits,
                            const int64_t* labels, float* losses,
                            float* dlogits, float scale, DeviceError* err) {
  const int64_t r = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const int64_t label = labels[r];
  if (label < 0 || label >= cols) {
    if (lane == 0) {
      RecordError(err, kLabelOutOfRange, label, r, cols);
      losses[r] = __int_as_float(0x7fc00000);
    }
    // The row's gradient is written, never read: zeros, so that the
    // updates enqueued before the error is reported change nothing.
    if (dlogits != nullptr) {
      for (int64_t c = lane; c < cols; c += 32) dlogits[r * cols + c] = 0.0f;
    }
    return;
  }
  const float* z = logits + r * cols;
  float m = -FLT_MAX;
  for (int64_t c = lane; c < cols; c += 32) m = fmaxf(m, z[c]);
  m = WarpMax(m);
  double s = 0;
  for (int64_t c = lane; c < cols; c += 32) s += exp(double(z[c] - m));
  s = WarpSumD(s);
  const double log_sum = log(s);
  if (lane == 0) losses[r] = static_cast<float>(log_sum - (z[label] - m));
  if (dlogits != nullptr) {
    for (int64_t c = lane; c < cols; c += 32) {
      const double p = exp(double(z[c] - m) - log_sum);
      dlogits[r * cols + c] =
          scale * static_cast<float>(p - (c == label ? 1.0 : 0.0));
    }
  }
}
__global__ void SigmoidXentK(int64_t n, const float* logits,
                             const float* targets, float* losses,
                             float* dlogits, float scale) {
  GRID_STRIDE(i, n) {
    const float x = logits[i], z = targets[i];
    losses[i] = fmaxf(x, 0.0f) - x * z + log1pf(expf(-fabsf(x)));
    if (dlogits != nullptr) dlogits[i] = scale * (1.0f / (1.0f + expf(-x)) - z);
  }
}

__global__ void GatherK(int64_t rows, int64_t dim, const float* table,
                        int64_t n, const int64_t* ids, float* y,
                        DeviceError* err) {
  GRID_STRIDE(i, n * dim) {
    const int64_t k = i / dim, j = i % dim;
    const int64_t id = ids[k];
    if (id < 0 || id >= rows) {
      if (j == 0) RecordError(err, kIdOutOfRange, id, k, rows);
      y[i] = 0.0f;
    } else {
      y[i] = table[id * dim + j];
    }
  }
}
__global__ void ScatterAddK(int64_t rows, int64_t dim, int64_t n,
                            const int64_t* ids, const float* dy,
                            float* dtable) {
  GRID_STRIDE(i, n * dim) {
    const int64_t k = i / dim, j = i % dim;
    const int64_t id = ids[k];
    if (id >= 0 && id < rows) atomicAdd(dtable + id * dim + j, dy[i]);
  }
}

struct Clip {
  int64_t y0, y1, x0, x1;
};
__device__ Clip ClipWindow(const PoolShape& g, int64_t oh, int64_t ow) {
  const int64_t ys = oh * g.stride_h - g.pad_top;
  const int64_t xs = ow * g.stride_w - g.pad_left;
  return {max(ys, int64_t{0}), min(ys + g.window_h, g.in_h),
          max(xs, int64_t{0}), min(xs + g.window_w, g.in_w)};
}

__global__ void PoolK(int kind, PoolShape g, const float* x, float* y) {
  GRID_STRIDE(i, g.batch * g.out_h * g.out_w * g.c) {
    const int64_t c = i % g.c;
    int64_t t = i / g.c;
    const int64_t ow = t % g.out_w;
    t /= g.out_w;
    const int64_t oh = t % g.out_h;
    const int64_t b = t / g.out_h;
    const Clip w = ClipWindow(g, oh, ow);
    const float* image = x + b * g.in_h * g.in_w * g.c;
    float acc = kind == 0 ? -INFINITY : 0.0f;
    for (int64_t iy = w.y0; iy < w.y1; ++iy) {
      for (int64_t ix = w.x0; ix < w.x1; ++ix) {
        const float v = image[(iy * g.in_w + ix) * g.c + c];
        acc = kind == 0 ? fmaxf(acc, v) : acc + v;
      }
    }
    if (kind == 1) acc /= static_cast<float>((w.y1 - w.y0) * (w.x1 - w.x0));
    y[i] = acc;
  }
}
__global__ void PoolBackwardK(int kind, PoolShape g, const float* x,
                              const float* y, const float* dy, float* dx) {
  GRID_STRIDE(i, g.batch * g.out_h * g.out_w * g.c) {
    const int64_t c = i % g.c;
    int64_t t = i / g.c;
    const int64_t ow = t % g.out_w;
    t /= g.out_w;
    const int64_t oh = t % g.out_h;
    const int64_t b = t / g.out_h;
    const Clip w = ClipWindow(g, oh, ow);
    const int64_t base = b * g.in_h * g.in_w * g.c;
    const float d = dy[i];
    const bool overlap = g.window_h > g.stride_h || g.window_w > g.stride_w;
    if (kind == 1) {
      const float share = d / static_cast<float>((w.y1 - w.y0) * (w.x1 - w.x0));
      for (int64_t iy = w.y0; iy < w.y1; ++iy) {
        for (int64_t ix = w.x0; ix < w.x1; ++ix) {
          float* p = dx + base + (iy * g.in_w + ix) * g.c + c;
          if (overlap) {
            atomicAdd(p, share);
          } else {
            *p += share;
          }
        }
      }
      continue;
    }
    // The first cell of the window equal to the maximum gets it all.
    const float m = y[i];
    for (int64_t iy = w.y0; iy < w.y1; ++iy) {
      for (int64_t ix = w.x0; ix < w.x1; ++ix) {
        const int64_t at = base + (iy * g.in_w + ix) * g.c + c;
        if (x[at] == m) {
          if (overlap) {
            atomicAdd(dx + at, d);
          } else {
            dx[at] += d;
          }
          iy = w.y1;
          break;
        }
      }
    }
  }
}

__global__ void PadK(int64_t batch, int64_t in_h, int64_t in_w, int64_t c,
                     int64_t top, int64_t bottom, int64_t left, int64_t right,
                     const float* x, float* padded) {
  const int64_t ph = in_h + top + bottom, pw = in_w + left + right;
  GRID_STRIDE(i, batch * ph * pw * c) {
    const int64_t ch = i % c;
    int64_t t = i / c;
    const int64_t px = t % pw;
    t /= pw;
    const int64_t py = t % ph;
    const int64_t b = t / ph;
    const int64_t iy = py - top, ix = px - left;
    padded[i] = (iy >= 0 && iy < in_h && ix >= 0 && ix < in_w)
                    ? x[((b * in_h + iy) * in_w + ix) * c + ch]
                    : 0.0f;
  }
}
__global__ void CropAccumulateK(int64_t batch, int64_t in_h, int64_t in_w,
                                int64_t c, int64_t top, int64_t bottom,
                                int64_t left, int64_t right,
                                const float* padded, float* dx) {
  const int64_t ph = in_h + top + bottom, pw = in_w + left + right;
  GRID_STRIDE(i, batch * in_h * in_w * c) {
    const int64_t ch = i % c;
    int64_t t = i / c;
    const int64_t ix = t % in_w;
    t /= in_w;
    const int64_t iy = t % in_h;
    const int64_t b = t / in_h;
    dx[i] += padded[((b * ph + iy + top) * pw + ix + left) * c + ch];
  }
}
__global__ void HwioToKrscK(int64_t hw, int64_t in, int64_t out,
                            const float* hwio, float* krsc) {
  GRID_STRIDE(i, hw * in * out) {
    // i indexes HWIO: ((p * in) + ci) * out + co.
    const int64_t co = i % out;
    const int64_t ci = (i / out) % in;
    const int64_t p = i / (out * in);
    krsc[(co * hw + p) * in + ci] = hwio[i];
  }
}
__global__ void KrscAccumulateHwioK(int64_t hw, int64_t in, int64_t out,
                                    const float* krsc, float* hwio) {
  GRID_STRIDE(i, hw * in * out) {
    const int64_t co = i % out;
    const int64_t ci = (i / out) % in;
    const int64_t p = i / (out * in);
    hwio[i] += krsc[(co * hw + p) * in + ci];
  }
}

__global__ void BatchNormStatsK(int64_t rows, int64_t chunks, int64_t cols,
                                const float* sums, const float* squares,
                                float epsilon, float momentum,
                                float* moving_mean, float* moving_var,
                                float* mean, float* inv_std) {
  GRID_STRIDE(c, cols) {
    double s = 0, q = 0;
    for (int64_t k = 0; k < chunks; ++k) {
      s += sums[k * cols + c];
      q += squares[k * cols + c];
    }
    const double m = s / double(rows);
    // Biased batch variance, as Keras keeps in its moving average.
    const double var = fmax(q / double(rows) - m * m, 0.0);
    mean[c] = static_cast<float>(m);
    moving_mean[c] = momentum * moving_mean[c] + (1 - momentum) * float(m);
    moving_var[c] = momentum * moving_var[c] + (1 - momentum) * float(var);
    inv_std[c] = static_cast<float>(1.0 / sqrt(var + epsilon));
  }
}
__global__ void BatchNormInferenceStatsK(int64_t cols, float epsilon,
                                         const float* moving_mean,
                                         const float* moving_var, float* mean,
                                         float* inv_std) {
  GRID_STRIDE(c, cols) {
    mean[c] = moving_mean[c];
    inv_std[c] = 1.0f / sqrtf(moving_var[c] + epsilon);
  }
}
__global__ void BatchNormApplyK(int64_t rows, int64_t cols, const float* x,
                                const float* mean, const float* inv_std,
                                const float* gamma, const float* beta,
                                float* y) {
  GRID_STRIDE(i, rows * cols) {
    const int64_t c = i % cols;
    y[i] = (x[i] - mean[c]) * inv_std[c] * gamma[c] + beta[c];
  }
}
// xhat = (x - mean) * inv_std, written for the column pass.
__global__ void XhatK(int64_t rows, int64_t cols, const float* x,
                      const float* mean, const float* inv_std, float* xhat) {
  GRID_STRIDE(i, rows * cols) {
    const int64_t c = i % cols;
    xhat[i] = (x[i] - mean[c]) * inv_std[c];
  }
}
__global__ void BatchNormParamGradsK(int64_t chunks, int64_t cols,
                                     const float* sum_dy,
                                     const float* sum_dy_xhat, float* dgamma,
                                     float* dbeta, float* totals) {
  GRID_STRIDE(c, cols) {
    double a = 0, b = 0;
    for (int64_t k = 0; k < chunks; ++k) {
      a += sum_dy[k * cols + c];
      b += sum_dy_xhat[k * cols + c];
    }
    if (dbeta != nullptr) dbeta[c] += static_cast<float>(a);
    if (dgamma != nullptr) dgamma[c] += static_cast<float>(b);
    totals[c] = static_cast<float>(a);
    totals[cols + c] = static_cast<float>(b);
  }
}
__global__ void BatchNormDxK(int64_t rows, int64_t cols, bool training,
                             const float* x, const float* gamma,
                             const float* mean, const float* inv_std,
                             const float* dy, const float* totals, float* dx) {
  const double inv_rows = 1.0 / double(rows);
  GRID_STRIDE(i, rows * cols) {
    const int64_t c = i % cols;
    if (!training) {
      dx[i] += dy[i] * gamma[c] * inv_std[c];
      continue;
    }
    const double xhat = (x[i] - mean[c]) * inv_std[c];
    dx[i] += static_cast<float>(
        gamma[c] * inv_std[c] *
        (dy[i] - totals[c] * inv_rows - xhat * totals[cols + c] * inv_rows));
  }
}

__global__ void SgdK(int64_t n, float lr, const float* g, float* w) {
  GRID_STRIDE(i, n) w[i] -= lr * g[i];
}
__global__ void MomentumK(int64_t n, float lr, float momentum, bool nesterov,
                          const float* g, float* v, float* w) {
  GRID_STRIDE(i, n) {
    const float vi = momentum * v[i] + g[i];
    v[i] = vi;
    w[i] -= nesterov ? lr * (g[i] + momentum * vi) : lr * vi;
  }
}
// TensorFlow's Adam at value i.
__device__ void AdamAt(int64_t i, float lr_t, float b1, float b2, float eps,
                       const float* g, float* m, float* v, float* w) {
  const float gi = g[i];
  const float mi = b1 * m[i] + (1 - b1) * gi;
  const float vi = b2 * v[i] + (1 - b2) * gi * gi;
  m[i] = mi;
  v[i] = vi;
  w[i] -= mi * lr_t / (sqrtf(vi) + eps);
}
__global__ void AdamK(int64_t n, float lr_t, float b1, float b2, float eps,
                      const float* g, float* m, float* v, float* w) {
  GRID_STRIDE(i, n) AdamAt(i, lr_t, b1, b2, eps, g, m, v, w);
}

// AdamK over every variable of `b`, each gradient zeroed once read: the
// blocks b.first_block names for a variable stride over its values.
__global__ void AdamAllK(AdamBatch b, float lr_t, float b1, float b2,
                         float eps) {
  int k = 0;
  while (static_cast<int>(blockIdx.x) >= b.first_block[k + 1]) ++k;
  const int64_t n = b.n[k];
  const int64_t stride =
      int64_t(b.first_block[k + 1] - b.first_block[k]) * blockDim.x;
  float* g = b.g[k];
  float* m = b.m[k];
  float* v = b.v[k];
  float* w = b.w[k];
  for (int64_t i =
           (blockIdx.x - b.first_block[k]) * int64_t(blockDim.x) + threadIdx.x;
       i < n; i += stride) {
    AdamAt(i, lr_t, b1, b2, eps, g, m, v, w);
    g[i] = 0.0f;
  }
}

// Calls fn with `x` as a pointer to the element type `src` names.
template <typename Fn>
void WithSrc(Src src, const void* x, const Fn& fn) {
  switch (src) {
    case Src::kF32:
      return fn(static_cast<const float*>(x));
    case Src::kF64:
      return fn(static_cast<const double*>(x));
    case Src::kI32:
      return fn(static_cast<const int32_t*>(x));
    case Src::kI64:
      return fn(static_cast<const int64_t*>(x));
    case Src::kU8:
      return fn(static_cast<const uint8_t*>(x));
  }
}

int WarpBlocks(int64_t rows) {
  return static_cast<int>((rows * 32 + kThreads - 1) / kThreads);
}

}  // namespace

void Fill(cudaStream_t s, int64_t n, float v, float* y) {
  if (n > 0) FillK<<<Blocks(n), kThreads, 0, s>>>(n, v, y);
}
void Axpby(cudaStream_t s, int64_t n, float a, const float* x, float b,
           float* y) {
  if (n > 0) AxpbyK<<<Blocks(n), kThreads, 0, s>>>(n, a, x, b, y);
}
void AxpyScalar(cudaStream_t s, int64_t n, const float* alpha, const float* x,
                float beta, float* y) {
  if (n > 0) AxpyScalarK<<<Blocks(n), kThreads, 0, s>>>(n, alpha, x, beta, y);
}
void Multiply(cudaStream_t s, int64_t n, const float* x, const float* y,
              float* z) {
  if (n > 0) MultiplyK<<<Blocks(n), kThreads, 0, s>>>(n, x, y, z);
}
void BiasAdd(cudaStream_t s, int64_t rows, int64_t cols, const float* x,
             const float* b, float* y) {
  if (rows * cols > 0)
    BiasAddK<<<Blocks(rows * cols), kThreads, 0, s>>>(rows, cols, x, b, y);
}
int64_t ColumnSumScratch(int64_t rows, int64_t cols) {
  return Chunks(rows) * cols;
}
void ColumnSum(cudaStream_t s, int64_t rows, int64_t cols, const float* x,
               float beta, float* out, float* partial) {
  if (cols <= 0) return;
  ColumnPartials(s, rows, cols, x, nullptr, partial);
  ColumnFinishK<<<Blocks(cols), kThreads, 0, s>>>(Chunks(rows), cols, partial,
                                                  beta, out);
}
void Sum(cudaStream_t s, int64_t n, const float* x, float scale, float* y) {
  SumK<<<1, 1024, 0, s>>>(n, x, scale, y);
}
void Convert(cudaStream_t s, Src src, int64_t n, const void* x, float scale,
             float* y) {
  if (n <= 0) return;
  WithSrc(src, x, [&](const auto* in) {
    ConvertK<<<Blocks(n), kThreads, 0, s>>>(n, in, scale, y);
  });
}
void ToInt64(cudaStream_t s, Src src, int64_t n, const void* x, int64_t* y) {
  if (n <= 0) return;
  WithSrc(src, x, [&](const auto* in) {
    ToInt64K<<<Blocks(n), kThreads, 0, s>>>(n, in, y);
  });
}
void CopyBlock(cudaStream_t s, int64_t rows, int64_t cols, const float* x,
               int64_t ldx, float* y, int64_t ldy, bool accumulate) {
  if (rows * cols > 0) {
    CopyBlockK<<<Blocks(rows * cols), kThreads, 0, s>>>(rows, cols, x, ldx, y,
                                                        ldy, accumulate);
  }
}
void DropoutMask(cudaStream_t s, int64_t n, float rate, uint64_t seed,
                 float* mask) {
  const float keep = 1.0f / (1.0f - rate);
  const uint64_t threshold =
      static_cast<uint64_t>(static_cast<double>(rate) * 18446744073709551616.0);
  if (n > 0)
    DropoutMaskK<<<Blocks(n), kThreads, 0, s>>>(n, threshold, keep, seed, mask);
}
void ArgMax(cudaStream_t s, int64_t rows, int64_t cols, const float* x,
            int64_t* out) {
  if (rows > 0) ArgMaxK<<<Blocks(rows), kThreads, 0, s>>>(rows, cols, x, out);
}
void GreaterThan(cudaStream_t s, int64_t n, const float* x, float t,
                 int64_t* out) {
  if (n > 0) GreaterThanK<<<Blocks(n), kThreads, 0, s>>>(n, x, t, out);
}
void ActivationForward(cudaStream_t s, int f, int64_t n, const float* x,
                       float* y) {
  if (n > 0) ActivationForwardK<<<Blocks(n), kThreads, 0, s>>>(f, n, x, y);
}
void ActivationBackward(cudaStream_t s, int f, int64_t n, const float* y,
                        const float* dy, float beta, float* dx) {
  if (n > 0)
    ActivationBackwardK<<<Blocks(n), kThreads, 0, s>>>(f, n, y, dy, beta, dx);
}
void Softmax(cudaStream_t s, int64_t rows, int64_t cols, const float* x,
             float* y) {
  if (rows > 0)
    SoftmaxK<<<WarpBlocks(rows), kThreads, 0, s>>>(rows, cols, x, y);
}
void SoftmaxBackward(cudaStream_t s, int64_t rows, int64_t cols, const float* y,
                     const float* dy, float* dx) {
  if (rows > 0) {
    SoftmaxBackwardK<<<WarpBlocks(rows), kThreads, 0, s>>>(rows, cols, y, dy,
                                                           dx);
  }
}
void SparseSoftmaxCrossEntropy(cudaStream_t s, int64_t rows, int64_t cols,
                               const float* logits, const int64_t* labels,
                               float* losses, float* dlogits, float scale,
                               DeviceError* err) {
  if (rows > 0) {
    SparseXentK<<<WarpBlocks(rows), kThreads, 0, s>>>(
        rows, cols, logits, labels, losses, dlogits, scale, err);
  }
}
void SigmoidCrossEntropy(cudaStream_t s, int64_t n, const float* logits,
                         const float* targets, float* losses, float* dlogits,
                         float scale) {
  if (n > 0) {
    SigmoidXentK<<<Blocks(n), kThreads, 0, s>>>(n, logits, targets, losses,
                                                dlogits, scale);
  }
}
void Gather(cudaStream_t s, int64_t rows, int64_t dim, const float* table,
            int64_t n, const int64_t* ids, float* y, DeviceError* err) {
  if (n * dim > 0) {
    GatherK<<<Blocks(n * dim), kThreads, 0, s>>>(rows, dim, table, n, ids, y,
                                                 err);
  }
}
void ScatterAdd(cudaStream_t s, int64_t rows, int64_t dim, int64_t n,
                const int64_t* ids, const float* dy, float* dtable) {
  if (n * dim > 0) {
    ScatterAddK<<<Blocks(n * dim), kThreads, 0, s>>>(rows, dim, n, ids, dy,
                                                     dtable);
  }
}
void Pool2D(cudaStream_t s, int kind, const PoolShape& g, const float* x,
            float* y) {
  const int64_t n = g.batch * g.out_h * g.out_w * g.c;
  if (n > 0) PoolK<<<Blocks(n), kThreads, 0, s>>>(kind, g, x, y);
}
void Pool2DBackward(cudaStream_t s, int kind, const PoolShape& g,
                    const float* x, const float* y, const float* dy,
                    float* dx) {
  const int64_t n = g.batch * g.out_h * g.out_w * g.c;
  if (n > 0)
    PoolBackwardK<<<Blocks(n), kThreads, 0, s>>>(kind, g, x, y, dy, dx);
}
void Pad(cudaStream_t s, int64_t batch, int64_t in_h, int64_t in_w, int64_t c,
         int64_t top, int64_t bottom, int64_t left, int64_t right,
         const float* x, float* padded) {
  const int64_t n = batch * (in_h + top + bottom) * (in_w + left + right) * c;
  if (n > 0) {
    PadK<<<Blocks(n), kThreads, 0, s>>>(batch, in_h, in_w, c, top, bottom, left,
                                        right, x, padded);
  }
}
void CropAccumulate(cudaStream_t s, int64_t batch, int64_t in_h, int64_t in_w,
                    int64_t c, int64_t top, int64_t bottom, int64_t left,
                    int64_t right, const float* padded, float* dx) {
  const int64_t n = batch * in_h * in_w * c;
  if (n > 0) {
    CropAccumulateK<<<Blocks(n), kThreads, 0, s>>>(
        batch, in_h, in_w, c, top, bottom, left, right, padded, dx);
  }
}
void HwioToKrsc(cudaStream_t s, int64_t hw, int64_t in, int64_t out,
                const float* hwio, float* krsc) {
  const int64_t n = hw * in * out;
  if (n > 0)
    HwioToKrscK<<<Blocks(n), kThreads, 0, s>>>(hw, in, out, hwio, krsc);
}
void KrscAccumulateHwio(cudaStream_t s, int64_t hw, int64_t in, int64_t out,
                        const float* krsc, float* hwio) {
  const int64_t n = hw * in * out;
  if (n > 0) {
    KrscAccumulateHwioK<<<Blocks(n), kThreads, 0, s>>>(hw, in, out, krsc, hwio);
  }
}
void BatchNormStats(cudaStream_t s, int64_t rows, int64_t cols, const float* x,
                    float epsilon, float momentum, float* moving_mean,
                    float* moving_var, float* mean, float* inv_std,
                    float* partial) {
  if (cols <= 0) return;
  float* sums = partial;
  float* squares = partial + ColumnSumScratch(rows, cols);
  ColumnPartials(s, rows, cols, x, nullptr, sums);
  ColumnPartials(s, rows, cols, x, x, squares);
  BatchNormStatsK<<<Blocks(cols), kThreads, 0, s>>>(
      rows, Chunks(rows), cols, sums, squares, epsilon, momentum, moving_mean,
      moving_var, mean, inv_std);
}
void BatchNormInferenceStats(cudaStream_t s, int64_t cols, float epsilon,
                             const float* moving_mean, const float* moving_var,
                             float* mean, float* inv_std) {
  if (cols > 0) {
    BatchNormInferenceStatsK<<<Blocks(cols), kThreads, 0, s>>>(
        cols, epsilon, moving_mean, moving_var, mean, inv_std);
  }
}
void BatchNormApply(cudaStream_t s, int64_t rows, int64_t cols, const float* x,
                    const float* mean, const float* inv_std, const float* gamma,
                    const float* beta, float* y) {
  if (rows * cols > 0) {
    BatchNormApplyK<<<Blocks(rows * cols), kThreads, 0, s>>>(
        rows, cols, x, mean, inv_std, gamma, beta, y);
  }
}
void BatchNormBackward(cudaStream_t s, int64_t rows, int64_t cols,
                       bool training, const float* x, const float* gamma,
                       const float* mean, const float* inv_std, const float* dy,
                       float* dx, float* dgamma, float* dbeta, float* partial) {
  if (rows * cols <= 0) return;
  // partial: [sum_dy chunks][sum_dy_xhat chunks][totals 2*cols][xhat].
  const int64_t scratch = ColumnSumScratch(rows, cols);
  float* sum_dy = partial;
  float* sum_dy_xhat = partial + scratch;
  float* totals = partial + 2 * scratch;
  float* xhat = totals + 2 * cols;
  XhatK<<<Blocks(rows * cols), kThreads, 0, s>>>(rows, cols, x, mean, inv_std,
                                                 xhat);
  ColumnPartials(s, rows, cols, dy, nullptr, sum_dy);
  ColumnPartials(s, rows, cols, dy, xhat, sum_dy_xhat);
  BatchNormParamGradsK<<<Blocks(cols), kThreads, 0, s>>>(
      Chunks(rows), cols, sum_dy, sum_dy_xhat, dgamma, dbeta, totals);
  if (dx != nullptr) {
    BatchNormDxK<<<Blocks(rows * cols), kThreads, 0, s>>>(
        rows, cols, training, x, gamma, mean, inv_std, dy, totals, dx);
  }
}
void SgdUpdate(cudaStream_t s, int64_t n, float lr, const float* g, float* w) {
  if (n > 0) SgdK<<<Blocks(n), kThreads, 0, s>>>(n, lr, g, w);
}
void MomentumUpdate(cudaStream_t s, int64_t n, float lr, float momentum,
                    bool nesterov, const float* g, float* v, float* w) {
  if (n > 0) {
    MomentumK<<<Blocks(n), kThreads, 0, s>>>(n, lr, momentum, nesterov, g, v,
                                             w);
  }
}
void AdamUpdate(cudaStream_t s, int64_t n, float lr_t, float b1, float b2,
                float eps, const float* g, float* m, float* v, float* w) {
  if (n > 0) {
    AdamK<<<Blocks(n), kThreads, 0, s>>>(n, lr_t, b1, b2, eps, g, m, v, w);
  }
}
void AdamUpdateAll(cudaStream_t s, const AdamBatch& batch, float lr_t, float b1,
                   float b2, float eps) {
  AdamBatch b = batch;
  int blocks = 0;
  for (int k = 0; k < b.count; ++k) {
    b.first_block[k] = blocks;
    if (b.n[k] > 0) blocks += Blocks(b.n[k]);
  }
  // Past the last variable: no block reads beyond first_block[count].
  for (int k = b.count; k <= AdamBatch::kMax; ++k) b.first_block[k] = blocks;
  if (blocks == 0) return;
  AdamAllK<<<blocks, kThreads, 0, s>>>(b, lr_t, b1, b2, eps);
}

}  // namespace recflow::train::cuda
