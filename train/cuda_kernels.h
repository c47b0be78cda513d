// Internal to the CUDA backend (not installed): the kernels recflow writes
// itself, each launched on `stream` and returning at once.  Pointers are
// device memory unless named otherwise; "accumulates" as backend.h says.
//
// Kernels that find bad input (a label or id out of range) record the
// first such finding in `err` (mapped pinned host memory) and go on; the
// backend reports it at its next synchronisation.
#ifndef RECFLOW_TRAIN_CUDA_KERNELS_H_
#define RECFLOW_TRAIN_CUDA_KERNELS_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace recflow::train::cuda {

// The first error a kernel found (code 0: none).
struct DeviceError {
  int code;  // kLabelOutOfRange, kIdOutOfRange
  int pad;
  long long value, position, limit;
};
inline constexpr int kLabelOutOfRange = 1;
inline constexpr int kIdOutOfRange = 2;

// Element types Convert/ToInt64 read (the order of pipeline::DType).
enum class Src : int { kF32, kF64, kI32, kI64, kU8 };

void Fill(cudaStream_t s, int64_t n, float v, float* y);
void Axpby(cudaStream_t s, int64_t n, float a, const float* x, float b,
           float* y);
void AxpyScalar(cudaStream_t s, int64_t n, const float* alpha, const float* x,
                float beta, float* y);
void Multiply(cudaStream_t s, int64_t n, const float* x, const float* y,
              float* z);
void BiasAdd(cudaStream_t s, int64_t rows, int64_t cols, const float* x,
             const float* b, float* y);
// out[c] = sum_r x[r, c] + beta * out[c]; `partial` holds
// ColumnSumScratch(rows, cols) floats.
int64_t ColumnSumScratch(int64_t rows, int64_t cols);
void ColumnSum(cudaStream_t s, int64_t rows, int64_t cols, const float* x,
               float beta, float* out, float* partial);
void Sum(cudaStream_t s, int64_t n, const float* x, float scale, float* y);
void Convert(cudaStream_t s, Src src, int64_t n, const void* x, float scale,
             float* y);
void ToInt64(cudaStream_t s, Src src, int64_t n, const void* x, int64_t* y);
void CopyBlock(cudaStream_t s, int64_t rows, int64_t cols, const float* x,
               int64_t ldx, float* y, int64_t ldy, bool accumulate);
void DropoutMask(cudaStream_t s, int64_t n, float rate, uint64_t seed,
                 float* mask);
void ArgMax(cudaStream_t s, int64_t rows, int64_t cols, const float* x,
            int64_t* out);
void GreaterThan(cudaStream_t s, int64_t n, const float* x, float t,
                 int64_t* out);

// Activation: 0 linear, 1 relu, 2 sigmoid, 3 tanh (train::Activation).
void ActivationForward(cudaStream_t s, int f, int64_t n, const float* x,
                       float* y);
void ActivationBackward(cudaStream_t s, int f, int64_t n, const float* y,
                        const float* dy, float beta, float* dx);
void Softmax(cudaStream_t s, int64_t rows, int64_t cols, const float* x,
             float* y);
void SoftmaxBackward(cudaStream_t s, int64_t rows, int64_t cols, const float* y,
                     const float* dy, float* dx);
void SparseSoftmaxCrossEntropy(cudaStream_t s, int64_t rows, int64_t cols,
                               const float* logits, const int64_t* labels,
                               float* losses, float* dlogits, float scale,
                               DeviceError* err);
void SigmoidCrossEntropy(cudaStream_t s, int64_t n, const float* logits,
                         const float* targets, float* losses, float* dlogits,
                         float scale);
void Gather(cudaStream_t s, int64_t rows, int64_t dim, const float* table,
            int64_t n, const int64_t* ids, float* y, DeviceError* err);
void ScatterAdd(cudaStream_t s, int64_t rows, int64_t dim, int64_t n,
                const int64_t* ids, const float* dy, float* dtable);

// Pooling over NHWC with TensorFlow's windows (pad_top/pad_left, clipped
// to the input); kind 0 max, 1 average.
struct PoolShape {
  int64_t batch, in_h, in_w, c, out_h, out_w;
  int64_t window_h, window_w, stride_h, stride_w, pad_top, pad_left;
};
void Pool2D(cudaStream_t s, int kind, const PoolShape& g, const float* x,
            float* y);
void Pool2DBackward(cudaStream_t s, int kind, const PoolShape& g,
                    const float* x, const float* y, const float* dy, float* dx);

// Zero-padded copy of NHWC x into [batch, in_h + top + bottom,
// in_w + left + right, c], and the way back (accumulating the inner part).
void Pad(cudaStream_t s, int64_t batch, int64_t in_h, int64_t in_w, int64_t c,
         int64_t top, int64_t bottom, int64_t left, int64_t right,
         const float* x, float* padded);
void CropAccumulate(cudaStream_t s, int64_t batch, int64_t in_h, int64_t in_w,
                    int64_t c, int64_t top, int64_t bottom, int64_t left,
                    int64_t right, const float* padded, float* dx);
// HWIO [hw, in, out] <-> cuDNN's NHWC filter layout KRSC [out, hw, in].
void HwioToKrsc(cudaStream_t s, int64_t hw, int64_t in, int64_t out,
                const float* hwio, float* krsc);
void KrscAccumulateHwio(cudaStream_t s, int64_t hw, int64_t in, int64_t out,
                        const float* krsc, float* hwio);

// Batch normalisation over [rows, cols]; `partial` holds
// 2 * ColumnSumScratch(rows, cols) floats.
void BatchNormStats(cudaStream_t s, int64_t rows, int64_t cols, const float* x,
                    float epsilon, float momentum, float* moving_mean,
                    float* moving_var, float* mean, float* inv_std,
                    float* partial);
void BatchNormInferenceStats(cudaStream_t s, int64_t cols, float epsilon,
                             const float* moving_mean, const float* moving_var,
                             float* mean, float* inv_std);
void BatchNormApply(cudaStream_t s, int64_t rows, int64_t cols, const float* x,
                    const float* mean, const float* inv_std, const float* gamma,
                    const float* beta, float* y);
void BatchNormBackward(cudaStream_t s, int64_t rows, int64_t cols,
                       bool training, const float* x, const float* gamma,
                       const float* mean, const float* inv_std, const float* dy,
                       float* dx, float* dgamma, float* dbeta, float* partial);

void SgdUpdate(cudaStream_t s, int64_t n, float lr, const float* g, float* w);
void MomentumUpdate(cudaStream_t s, int64_t n, float lr, float momentum,
                    bool nesterov, const float* g, float* v, float* w);
void AdamUpdate(cudaStream_t s, int64_t n, float lr_t, float b1, float b2,
                float eps, const float* g, float* m, float* v, float* w);
// Up to kMax variables' Adam updates and gradient zeroings in one launch
// (the kernel takes them by value: 1.4 KB of parameters).
struct AdamBatch {
  static constexpr int kMax = 32;
  int count = 0;
  int64_t n[kMax] = {};
  float* g[kMax] = {};
  float* m[kMax] = {};
  float* v[kMax] = {};
  float* w[kMax] = {};
  // Blocks [first_block[k], first_block[k + 1]) update variable k
  // (AdamUpdateAll fills it).
  int first_block[kMax + 1] = {};
};
void AdamUpdateAll(cudaStream_t s, const AdamBatch& batch, float lr_t, float b1,
                   float b2, float eps);

}  // namespace recflow::train::cuda

#endif  // RECFLOW_TRAIN_CUDA_KERNELS_H_
