// The CUDA backend against the CPU backend: every Backend operation's
// forward and backward on random inputs (tolerances per op below), one
// whole training step of each canned model, checkpoints moving between the
// devices, the caching allocator, device errors and host-only accessors,
// input from pinned memory, and the gradients' NCCL all-reduce (one rank:
// one GPU).
// Label `gpu`.  Without a usable GPU (or in a build without CUDA) every
// test but the first is skipped with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <thread>

#include "pipeline/dataset.h"
#include "test_util.h"
#include "train/backend.h"
#include "train/canned.h"
#if RECFLOW_CUDA_BUILT
#include "train/cuda_allocator.h"
#endif
#include "train/checkpoint.h"
#include "train/estimator.h"
#include "train/ops.h"
#include "train_test_util.h"

namespace recflow::train {
namespace {

namespace fs = std::filesystem;

// The GPU backend in full float32 (no TF32), or why there is none.
std::unique_ptr<Backend>& Gpu(std::string* why) {
  static std::string reason;
  static std::unique_ptr<Backend> backend = [] {
    try {
      return MakeCudaBackend(0, /*allow_tf32=*/false);
    } catch (const CudaUnavailable& e) {
      reason = e.what();
      return std::unique_ptr<Backend>();
    }
  }();
  if (why != nullptr) *why = reason;
  return backend;
}

Backend& Cpu() {
  static const std::unique_ptr<Backend> backend = MakeCpuBackend(2);
  return *backend;
}

#define REQUIRE_GPU()                                             \
  do {                                                            \
    std::string why;                                              \
    if (!Gpu(&why)) GTEST_SKIP() << "no GPU to test on: " << why; \
  } while (0)

Tensor Random(const Shape& s, uint64_t seed, float lo = -1, float hi = 1) {
  Tensor t = Tensor::Allocate(DType::kFloat32, s);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> u(lo, hi);
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    t.mutable_data<float>()[i] = u(rng);
  }
  return t;
}

Tensor Ids(std::vector<int64_t> v) {
  return Tensor::FromValues<int64_t>(v, Shape{int64_t(v.size())});
}

Tensor HostCopy(const Tensor& t) {
  Tensor c = Tensor::Allocate(t.dtype(), t.shape());
  std::memcpy(const_cast<char*>(c.raw_data()), t.raw_data(), t.byte_size());
  return c;
}

// Runs `op` on `be` over buffers holding copies of `inputs` and returns
// every buffer afterwards, on the host.
using Op = std::function<void(Backend&, std::vector<Tensor>&)>;
std::vector<Tensor> Run(Backend& be, const std::vector<Tensor>& inputs,
                        const Op& op) {
  std::vector<Tensor> bufs;
  for (const Tensor& t : inputs) bufs.push_back(be.ToDevice(HostCopy(t)));
  op(be, bufs);
  std::vector<Tensor> out;
  for (const Tensor& t : bufs) out.push_back(HostCopy(be.ToHost(t)));
  return out;
}

float* F(std::vector<Tensor>& b, int i) { return b[i].mutable_data<float>(); }
const int64_t* I(std::vector<Tensor>& b, int i) { return b[i].data<int64_t>(); }

// Every buffer equal within atol + rtol * |cpu value| (exact for integers);
// on `gpu`, or the tests' GPU backend.
void ExpectSame(const std::vector<Tensor>& inputs, const Op& op,
                double rtol = 1e-5, double atol = 1e-5,
                Backend* gpu_backend = nullptr) {
  const std::vector<Tensor> cpu = Run(Cpu(), inputs, op);
  const std::vector<Tensor> gpu =
      Run(gpu_backend != nullptr ? *gpu_backend : *Gpu(nullptr), inputs, op);
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t b = 0; b < cpu.size(); ++b) {
    ASSERT_EQ(cpu[b].shape(), gpu[b].shape()) << "buffer " << b;
    if (cpu[b].dtype() != DType::kFloat32) {
      EXPECT_TRUE(cpu[b] == gpu[b])
          << "buffer " << b << ": " << cpu[b].DebugString() << " vs "
          << gpu[b].DebugString();
      continue;
    }
    const float* c = cpu[b].data<float>();
    const float* g = gpu[b].data<float>();
    int reported = 0;
    for (int64_t i = 0; i < cpu[b].num_elements(); ++i) {
      const double tol = atol + rtol * std::abs(c[i]);
      if (!(std::abs(double(c[i]) - g[i]) <= tol) && reported++ < 5) {
        ADD_FAILURE() << "buffer " << b << " value " << i << ": cpu " << c[i]
                      << " gpu " << g[i] << " (tolerance " << tol << ")";
      }
    }
  }
}

TEST(CudaBackendTest, SaysClearlyWhenThereIsNoSuchGpu) {
  // Runs everywhere: without a GPU, driver or CUDA build the backend says
  // so in one line; with one, a GPU index past the last says so.
  try {
    MakeCudaBackend(99);
    FAIL() << "cuda:99 should not exist";
  } catch (const CudaUnavailable& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cuda:99"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  EXPECT_EQ(ParseDevice("cuda:3").index, 3);
  EXPECT_EQ(ParseDevice("cuda").device, Device::kCuda);
  EXPECT_EQ(ParseDevice("cpu").device, Device::kCpu);
  EXPECT_THROW(ParseDevice("tpu"), Error);
}

TEST(CudaBackendTest, GemmInEveryTransposition) {
  REQUIRE_GPU();
  const int64_t m = 37, n = 29, k = 53;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "ta=" << ta << " tb=" << tb);
      ExpectSame(
          {Random({m * k}, 1), Random({k * n}, 2), Random({m * n}, 3)},
          [=](Backend& be, std::vector<Tensor>& b) {
            be.Gemm(ta, tb, m, n, k, 0.7f, F(b, 0), F(b, 1), 0.3f, F(b, 2));
          },
          1e-4, 1e-4);
    }
  }
}

TEST(CudaBackendTest, ConvolutionForwardAndBackward) {
  REQUIRE_GPU();
  struct Case {
    int64_t in, window, stride, in_c, out_c;
    Padding padding;
  };
  // The third pads asymmetrically (TF's SAME on an even input, stride 2),
  // which the backend pads explicitly for cuDNN.
  for (const Case& c : {Case{9, 3, 1, 3, 8, Padding::kSame},
                        Case{11, 5, 2, 4, 6, Padding::kValid},
                        Case{8, 3, 2, 2, 5, Padding::kSame}}) {
    Window2D g;
    g.batch = 3;
    g.in_h = g.in_w = c.in;
    g.in_c = c.in_c;
    g.window_h = g.window_w = c.window;
    g.stride_h = g.stride_w = c.stride;
    g.padding = c.padding;
    g.out_c = c.out_c;
    g.Resolve();
    SCOPED_TRACE(::testing::Message() << "in " << c.in << " window " << c.window
                                      << " stride " << c.stride);
    const int64_t nx = g.batch * g.in_h * g.in_w * g.in_c;
    const int64_t nw = c.window * c.window * c.in_c * c.out_c;
    const int64_t ny = g.batch * g.out_h * g.out_w * g.out_c;
    ExpectSame(
        {Random({nx}, 4), Random({nw}, 5), Random({ny}, 6)},
        [=](Backend& be, std::vector<Tensor>& b) {
          be.Conv2D(g, F(b, 0), F(b, 1), F(b, 2));
        },
        1e-4, 1e-4);
    // Backward accumulates into what dx and dw hold.
    ExpectSame(
        {Random({nx}, 7), Random({nw}, 8), Random({ny}, 9), Random({nx}, 10),
         Random({nw}, 11)},
        [=](Backend& be, std::vector<Tensor>& b) {
          be.Conv2DBackward(g, F(b, 0), F(b, 1), F(b, 2), F(b, 3), F(b, 4));
        },
        1e-4, 1e-4);
  }
}

// RECFLOW_CUDNN_AUTOTUNE=0's backends: cuDNN's heuristics choose, so two
// backends choose alike (measured choices may differ from backend to
// backend), and their convolutions match the CPU's as the measured ones do.
TEST(CudaBackendTest, ConvolutionsChosenByHeuristicsAreChosenAlike) {
  REQUIRE_GPU();
  Window2D g;
  g.batch = 8;
  g.in_h = g.in_w = 28;
  g.in_c = 1;
  g.window_h = g.window_w = 5;
  g.stride_h = g.stride_w = 1;
  g.padding = Padding::kSame;
  g.out_c = 32;
  g.Resolve();
  const int64_t nx = g.batch * g.in_h * g.in_w * g.in_c;
  const int64_t nw = g.window_h * g.window_w * g.in_c * g.out_c;
  const int64_t ny = g.batch * g.out_h * g.out_w * g.out_c;
  const std::vector<Tensor> inputs = {Random({nx}, 21), Random({nw}, 22),
                                      Random({ny}, 23), Random({nx}, 24),
                                      Random({nw}, 25)};
  const Op conv = [=](Backend& be, std::vector<Tensor>& b) {
    be.Conv2D(g, F(b, 0), F(b, 1), F(b, 2));
    be.Conv2DBackward(g, F(b, 0), F(b, 1), F(b, 2), F(b, 3), F(b, 4));
  };
  std::vector<std::vector<std::string>> choices;
  for (bool autotune : {false, false, true}) {
    SCOPED_TRACE(autotune ? "autotuned" : "heuristics");
    const std::unique_ptr<Backend> be = MakeCudaBackend(0, false, autotune);
    EXPECT_TRUE(be->ConvolutionChoices().empty());  // nothing planned yet
    ExpectSame(inputs, conv, 1e-4, 1e-4, be.get());
    choices.push_back(be->ConvolutionChoices());
    ASSERT_EQ(choices.back().size(), 1u);
    EXPECT_TRUE(choices.back()[0].starts_with("8x28x28x1 k5x5->32: fwd "))
        << choices.back()[0];
  }
  EXPECT_EQ(choices[0], choices[1]);
}

TEST(CudaBackendTest, PoolingForwardAndBackward) {
  REQUIRE_GPU();
  // 7x7 SAME 2/2 pads only at the bottom/right; 3/2 VALID overlaps.
  for (const testing::PoolCase& c :
       {testing::PoolCase{8, 2, 2, Padding::kValid},
        testing::PoolCase{7, 2, 2, Padding::kSame},
        testing::PoolCase{9, 3, 2, Padding::kValid}}) {
    for (Pooling kind : {Pooling::kMax, Pooling::kAverage}) {
      const Window2D g = c.Window(/*batch=*/2, /*channels=*/5);
      SCOPED_TRACE(::testing::Message()
                   << (kind == Pooling::kMax ? "max" : "avg") << " in " << c.in
                   << " window " << c.window);
      const int64_t nx = g.batch * g.in_h * g.in_w * g.in_c;
      const int64_t ny = g.batch * g.out_h * g.out_w * g.out_c;
      ExpectSame({Random({nx}, 12), Random({ny}, 13), Random({ny}, 14),
                  Random({nx}, 15)},
                 [=](Backend& be, std::vector<Tensor>& b) {
                   be.Pool2D(kind, g, F(b, 0), F(b, 1));
                   be.Pool2DBackward(kind, g, F(b, 0), F(b, 1), F(b, 2),
                                     F(b, 3));
                 });
    }
  }
}

TEST(CudaBackendTest, ActivationsSoftmaxAndLosses) {
  REQUIRE_GPU();
  for (Activation f : {Activation::kLinear, Activation::kRelu,
                       Activation::kSigmoid, Activation::kTanh}) {
    SCOPED_TRACE(std::string(ActivationName(f)));
    ExpectSame({Random({1000}, 16, -3, 3), Random({1000}, 17),
                Random({1000}, 18), Random({1000}, 19)},
               [=](Backend& be, std::vector<Tensor>& b) {
                 be.ActivationForward(f, 1000, F(b, 0), F(b, 1));
                 be.ActivationBackward(f, 1000, F(b, 1), F(b, 2), 1.0f,
                                       F(b, 3));
                 be.ActivationBackward(f, 600, F(b, 1), F(b, 3), 0.0f, F(b, 2));
               });
  }
  const int64_t rows = 70, cols = 45;
  ExpectSame({Random({rows * cols}, 20, -4, 4), Random({rows * cols}, 21),
              Random({rows * cols}, 22), Random({rows * cols}, 23)},
             [=](Backend& be, std::vector<Tensor>& b) {
               be.Softmax(rows, cols, F(b, 0), F(b, 1));
               be.SoftmaxBackward(rows, cols, F(b, 1), F(b, 2), F(b, 3));
             });
  std::vector<int64_t> labels;
  for (int64_t r = 0; r < rows; ++r) labels.push_back((r * 7) % cols);
  ExpectSame({Random({rows * cols}, 24, -5, 5), Ids(labels), Random({rows}, 25),
              Random({rows * cols}, 26)},
             [=](Backend& be, std::vector<Tensor>& b) {
               be.SparseSoftmaxCrossEntropy(rows, cols, F(b, 0), I(b, 1),
                                            F(b, 2), F(b, 3), 0.25f);
             });
  ExpectSame({Random({500}, 27, -6, 6), Random({500}, 28, 0, 1),
              Random({500}, 29), Random({500}, 30)},
             [=](Backend& be, std::vector<Tensor>& b) {
               be.SigmoidCrossEntropy(500, F(b, 0), F(b, 1), F(b, 2), F(b, 3),
                                      0.5f);
             });
}

TEST(CudaBackendTest, ElementwiseReductionsAndConversions) {
  REQUIRE_GPU();
  const int64_t n = 5000;
  ExpectSame({Random({n}, 31), Random({n}, 32), Random({n}, 33),
              Random({n}, 34), Random({n}, 35), Random({1}, 36)},
             [=](Backend& be, std::vector<Tensor>& b) {
               be.Axpby(n, 0.5f, F(b, 0), 0.0f, F(b, 1));
               be.Axpby(n, 1.5f, F(b, 0), 1.0f, F(b, 2));
               be.Axpby(n, -2.0f, F(b, 1), 0.25f, F(b, 3));
               be.Multiply(n, F(b, 0), F(b, 3), F(b, 4));
               be.AxpyScalar(n, F(b, 5), F(b, 0), 1.0f, F(b, 2));
               be.AxpyScalar(n, F(b, 5), nullptr, 1.0f, F(b, 3));
               be.AxpyScalar(n / 2, F(b, 5), F(b, 2), 0.0f, F(b, 1));
               be.AxpyScalar(n / 3, F(b, 5), nullptr, 0.0f, F(b, 4));
               be.Copy(n / 2, F(b, 4), F(b, 0));
               be.Fill(100, 0.0f, F(b, 1));
               be.Fill(100, 3.5f, F(b, 1) + 200);
             });
  // Column sums over several 1024-row chunks; a sum of 5000.
  const int64_t rows = 3000, cols = 37;
  ExpectSame(
      {Random({rows * cols}, 37), Random({cols}, 38), Random({rows * cols}, 39),
       Random({cols}, 40), Random({1}, 41)},
      [=](Backend& be, std::vector<Tensor>& b) {
        be.ColumnSum(rows, cols, F(b, 0), 0.5f, F(b, 1));
        be.BiasAdd(rows, cols, F(b, 0), F(b, 1), F(b, 2));
        be.ColumnSum(rows, cols, F(b, 2), 0.0f, F(b, 3));
        be.Sum(rows * cols, F(b, 0), 0.5f, F(b, 4));
      },
      1e-5, 2e-4);
  ExpectSame({Random({12 * 10}, 42), Random({12 * 30}, 43)},
             [](Backend& be, std::vector<Tensor>& b) {
               be.CopyBlock(12, 10, F(b, 0), 10, F(b, 1) + 5, 30, false);
               be.CopyBlock(12, 10, F(b, 0), 10, F(b, 1) + 17, 30, true);
               be.CopyBlock(6, 10, F(b, 1) + 1, 30, F(b, 0), 20, true);
             });
  // Conversions from every numeric dtype; masks and argmax exactly.
  std::vector<uint8_t> bytes(300);
  std::vector<int32_t> i32(300);
  std::vector<double> f64(300);
  for (int i = 0; i < 300; ++i) {
    bytes[i] = uint8_t(i * 37);
    i32[i] = i * 13 - 1000;
    f64[i] = i * 0.37 - 20;
  }
  ExpectSame(
      {Tensor::FromValues<uint8_t>(bytes, Shape{300}),
       Tensor::FromValues<int32_t>(i32, Shape{300}),
       Tensor::FromValues<double>(f64, Shape{300}), Random({900}, 44),
       Ids(std::vector<int64_t>(600, 0))},
      [](Backend& be, std::vector<Tensor>& b) {
        be.Convert(DType::kUInt8, 300, b[0].raw_data(), 1.0f / 255, F(b, 3));
        be.Convert(DType::kInt32, 300, b[1].raw_data(), 2.0f, F(b, 3) + 300);
        be.Convert(DType::kFloat64, 300, b[2].raw_data(), 1.0f, F(b, 3) + 600);
        int64_t* ids = b[4].mutable_data<int64_t>();
        be.ToInt64(DType::kUInt8, 300, b[0].raw_data(), ids);
        be.ToInt64(DType::kInt32, 300, b[1].raw_data(), ids + 300);
      });
  ExpectSame(
      {Tensor::Allocate(DType::kFloat32, Shape{10000}) /* mask */,
       Random({200 * 13}, 45), Ids(std::vector<int64_t>(200 + 2600, 0))},
      [](Backend& be, std::vector<Tensor>& b) {
        be.DropoutMask(10000, 0.3f, 12345, F(b, 0));
        int64_t* out = b[2].mutable_data<int64_t>();
        be.ArgMax(200, 13, F(b, 1), out);
        be.GreaterThan(200 * 13, F(b, 1), 0.1f, out + 200);
      },
      0, 0);
}

TEST(CudaBackendTest, EmbeddingsBatchNormAndOptimizers) {
  REQUIRE_GPU();
  // Repeated ids: their gradients add up.
  const Tensor ids = Ids({3, 0, 7, 3, 3, 9, 0});
  ExpectSame({Random({10 * 6}, 46), ids, Random({7 * 6}, 47),
              Random({7 * 6}, 48), Random({10 * 6}, 49)},
             [](Backend& be, std::vector<Tensor>& b) {
               be.Gather(10, 6, F(b, 0), 7, I(b, 1), F(b, 2));
               be.ScatterAdd(6, 7, I(b, 1), F(b, 3), F(b, 4));
             });
  const int64_t rows = 2500, cols = 19;
  for (bool training : {true, false}) {
    SCOPED_TRACE(training ? "training" : "inference");
    ExpectSame(
        {Random({rows * cols}, 50, -2, 3), Random({cols}, 51, 0.5, 1.5),
         Random({cols}, 52), Random({cols}, 53), Random({cols}, 54, 0.5, 2),
         Random({cols}, 55), Random({cols}, 56), Random({rows * cols}, 57),
         Random({rows * cols}, 58), Random({rows * cols}, 59),
         Random({cols}, 60), Random({cols}, 61)},
        [=](Backend& be, std::vector<Tensor>& b) {
          be.BatchNormForward(rows, cols, F(b, 0), F(b, 1), F(b, 2), 1e-3f,
                              training, 0.9f, F(b, 3), F(b, 4), F(b, 5),
                              F(b, 6), F(b, 7));
          be.BatchNormBackward(rows, cols, training, F(b, 0), F(b, 1), F(b, 5),
                               F(b, 6), F(b, 8), F(b, 9), F(b, 10), F(b, 11));
        },
        1e-4, 1e-4);
  }
  const int64_t n = 3000;
  ExpectSame(
      {Random({n}, 62), Random({n}, 63), Random({n}, 64), Random({n}, 65, 0, 1),
       Random({n}, 66), Random({n}, 67)},
      [=](Backend& be, std::vector<Tensor>& b) {
        be.SgdUpdate(n, 0.1f, F(b, 0), F(b, 1));
        be.MomentumUpdate(n, 0.1f, 0.9f, false, F(b, 0), F(b, 2), F(b, 1));
        be.MomentumUpdate(n, 0.1f, 0.9f, true, F(b, 0), F(b, 2), F(b, 4));
        be.AdamUpdate(n, 0.01f, 0.9f, 0.999f, 1e-7f, F(b, 0), F(b, 5), F(b, 3),
                      F(b, 1));
      });
  // Every variable in one call: 40 of them (two launches of up to 32),
  // empty ones, and one past the largest grid (2.2 M values: the blocks
  // stride); every gradient is zeroed.
  std::vector<int64_t> sizes;
  for (int64_t k = 0; k < 40; ++k) sizes.push_back(k % 7 == 3 ? 0 : k * 131);
  sizes[17] = 2200000;
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  ExpectSame({Random({total}, 68), Random({total}, 69),
              Random({total}, 70, 0, 1), Random({total}, 71)},
             [=](Backend& be, std::vector<Tensor>& b) {
               std::vector<Backend::AdamVariable> vars;
               int64_t at = 0;
               for (int64_t s : sizes) {
                 vars.push_back({.n = s,
                                 .g = F(b, 0) + at,
                                 .m = F(b, 1) + at,
                                 .v = F(b, 2) + at,
                                 .w = F(b, 3) + at});
                 at += s;
               }
               be.AdamUpdateAll(vars, 0.01f, 0.9f, 0.999f, 1e-7f);
             });
}

TEST(CudaBackendTest, DeviceErrorsSayWhatTheCpuSays) {
  REQUIRE_GPU();
  Backend& gpu = *Gpu(nullptr);
  auto message = [](Backend& be, const std::function<void(Backend&)>& f) {
    try {
      f(be);
      be.Synchronize();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto bad_label = [](Backend& be) {
    Var logits = ops::Constant(be, Random({4, 3}, 68));
    ops::SparseSoftmaxCrossEntropy(be, logits, Ids({0, 2, 5, 1}));
  };
  auto bad_id = [](Backend& be) {
    Var table = ops::Constant(be, Random({5, 2}, 69));
    ops::Gather(be, table, Ids({1, -1}));
  };
  EXPECT_EQ(message(gpu, bad_label), message(Cpu(), bad_label));
  EXPECT_EQ(message(gpu, bad_id), message(Cpu(), bad_id));
  EXPECT_NE(message(gpu, bad_label).find("label 5 of row 2"),
            std::string::npos);
  // The backend works on after an error.
  EXPECT_EQ(
      message(gpu, [](Backend& be) { ops::Constant(be, Random({3}, 70)); }),
      "no error");
}

TEST(CudaBackendTest, DeviceTensorsRefuseHostReadsAndPrefetchedInputArrives) {
  REQUIRE_GPU();
  Backend& gpu = *Gpu(nullptr);
  const Tensor host = Random({64}, 71);
  const Tensor d = gpu.ToDevice(host);
  EXPECT_EQ(d.device(), Device::kCuda);
  EXPECT_THROW(d.values<float>(), pipeline::Error);
  EXPECT_THROW(d.scalar<float>(), pipeline::Error);
  EXPECT_THROW((void)(d == host), pipeline::Error);
  EXPECT_TRUE(gpu.ToHost(d) == host);
  // A prefetched element: numbers and fixed-length bytes (as uint8 rows).
  for (int round = 0; round < 5; ++round) {
    pipeline::Element e;
    e.Set("x", Random({8, 5}, 72 + round));
    std::vector<std::string> rows;
    for (int r = 0; r < 8; ++r)
      rows.push_back(std::string(4, char('a' + r + round)));
    e.Set("raw", Tensor::FromStrings(rows, Shape{8}));
    gpu.Prefetch(e);
    const Tensor x = gpu.ToHost(gpu.ToDevice(e["x"]));
    EXPECT_TRUE(x == e["x"]);
    const Tensor raw = gpu.ToHost(gpu.ToDevice(e["raw"]));
    ASSERT_EQ(raw.shape(), (Shape{8, 4}));
    EXPECT_EQ(raw.values<uint8_t>()[4 * 3], uint8_t('a' + 3 + round));
  }
  // A prefetched tensor still held while its slot comes round again keeps
  // its values.
  pipeline::Element first;
  first.Set("x", Random({256}, 90));
  gpu.Prefetch(first);
  const Tensor held = gpu.ToDevice(first["x"]);
  for (int round = 0; round < 7; ++round) {
    pipeline::Element e;
    e.Set("x", Random({256}, 91 + round));
    gpu.Prefetch(e);
    EXPECT_TRUE(gpu.ToHost(gpu.ToDevice(e["x"])) == e["x"]);
  }
  EXPECT_TRUE(gpu.ToHost(held) == first["x"]);
}

// Input already in InputMemory() (pinned: the pipeline delivers batches
// there for the Estimator) is copied from where it is, beside pageable
// tensors of the same element that Prefetch packs; a pinned tensor given
// to ToDevice is held until its copy has run, so its block is not handed
// out again and rewritten before.
TEST(CudaBackendTest, InputInPinnedMemoryIsCopiedFromWhereItIs) {
  REQUIRE_GPU();
  Backend& gpu = *Gpu(nullptr);
  const std::shared_ptr<pipeline::Allocator> pinned = gpu.InputMemory();
  ASSERT_NE(pinned, nullptr);
  EXPECT_EQ(pinned->kind(), pipeline::MemoryKind::kPinnedHost);
  EXPECT_EQ(Cpu().InputMemory(), nullptr);
  for (int round = 0; round < 7; ++round) {
    pipeline::Element e;
    e.Set("x", Random({8, 5}, 100 + round).CopyInto(pinned));
    e.Set("y", Random({33}, 200 + round));
    std::vector<std::string> rows;
    for (int r = 0; r < 8; ++r) {
      rows.push_back(std::string(4, char('a' + r + round)));
    }
    e.Set("raw", Tensor::FromStrings(rows, Shape{8}).CopyInto(pinned));
    gpu.Prefetch(e);
    EXPECT_TRUE(gpu.ToHost(gpu.ToDevice(e["x"])) == e["x"]) << round;
    EXPECT_TRUE(gpu.ToHost(gpu.ToDevice(e["y"])) == e["y"]) << round;
    const Tensor raw = gpu.ToHost(gpu.ToDevice(e["raw"]));
    ASSERT_EQ(raw.shape(), (Shape{8, 4}));
    EXPECT_EQ(raw.values<uint8_t>()[4 * 3], uint8_t('a' + 3 + round));
  }
  // A long product first, so that the copy below is still queued when
  // its source goes.
  constexpr int64_t kN = 2048;
  const Tensor a = gpu.ToDevice(Random({kN, kN}, 301));
  Tensor c = gpu.Allocate(DType::kFloat32, Shape{kN, kN});
  for (int i = 0; i < 8; ++i) {
    gpu.Gemm(false, false, kN, kN, kN, 1.0f, a.data<float>(), a.data<float>(),
             0.0f, c.mutable_data<float>());
  }
  const Tensor want = Random({4096}, 300);
  Tensor d;
  const char* block = nullptr;
  {
    const Tensor source = want.CopyInto(pinned);
    block = source.raw_data();
    d = gpu.ToDevice(source);
  }
  Tensor next = Tensor::Allocate(DType::kFloat32, Shape{4096}, pinned);
  EXPECT_NE(next.raw_data(), block) << "a pinned source was reused";
  std::memset(next.mutable_data<float>(), 0xff, next.byte_size());
  EXPECT_TRUE(gpu.ToHost(d) == want);
}

// The pinned allocator tells its own blocks (handed out or cached) from
// other memory without asking the driver: Prefetch copies such tensors
// from where they are, and packs anything else first.
TEST(CudaBackendTest, PinnedAllocatorKnowsItsOwnBlocks) {
#if RECFLOW_CUDA_BUILT
  REQUIRE_GPU();
  cuda::CachingAllocator pinned(pipeline::MemoryKind::kPinnedHost, 0);
  char* small = static_cast<char*>(pinned.Allocate(100));
  char* large = static_cast<char*>(pinned.Allocate(3 << 20));
  const size_t small_size = cuda::CachingAllocator::RoundUp(100);
  for (const char* p : {small, small + 99, small + small_size - 1, large,
                        large + (3 << 20) - 1}) {
    EXPECT_TRUE(pinned.Owns(p)) << static_cast<const void*>(p);
  }
  const std::vector<char> pageable(4096);
  const int on_stack = 0;
  EXPECT_FALSE(pinned.Owns(pageable.data()));
  EXPECT_FALSE(pinned.Owns(&on_stack));
  EXPECT_FALSE(pinned.Owns(nullptr));
  // Cached after Deallocate (it may be handed out again), gone once
  // given back to CUDA.
  pinned.Deallocate(small, 100);
  EXPECT_TRUE(pinned.Owns(small));
  pinned.ReleaseCached();
  EXPECT_FALSE(pinned.Owns(small));
  EXPECT_TRUE(pinned.Owns(large + 5));
  pinned.Deallocate(large, 3 << 20);
#else
  GTEST_SKIP() << "this build has no CUDA backend (RECFLOW_CUDA=OFF or no "
                  "CUDA toolkit with cuDNN)";
#endif
}

// A slot that takes a new device buffer may get a block the host freed
// while kernels queued on the compute stream still write it: the input
// copy (on the copy stream) must wait for them, or they overwrite it.
TEST(CudaBackendTest, PrefetchIntoAReusedBlockWaitsForTheWorkQueuedBefore) {
  REQUIRE_GPU();
  // A backend of its own: its slots are empty, so the first Prefetch
  // takes a new buffer from a cache holding only the product below.
  const std::unique_ptr<Backend> gpu = MakeCudaBackend(0, false);
  const std::shared_ptr<pipeline::Allocator> pinned = gpu->InputMemory();
  // 50 MiB of input: its slot asks for 5/4 of that, the 64 MiB size class
  // of the product.  In pinned memory, so the copy starts at once.
  const Tensor x = Random({13107200}, 401).CopyInto(pinned);
  constexpr int64_t kN = 4096;
  const Tensor a = gpu->ToDevice(Random({kN, kN}, 402));
  const char* product_block = nullptr;
  {
    Tensor c = gpu->Allocate(DType::kFloat32, Shape{kN, kN});
    product_block = c.raw_data();
    for (int i = 0; i < 8; ++i) {  // tens of milliseconds, all queued
      gpu->Gemm(false, false, kN, kN, kN, 1.0f, a.data<float>(),
                a.data<float>(), 0.0f, c.mutable_data<float>());
    }
  }  // freed on the host while the products are still queued
  pipeline::Element e;
  e.Set("x", x);
  gpu->Prefetch(e);
  const Tensor on_device = gpu->ToDevice(x);
  ASSERT_EQ(on_device.raw_data(), product_block)
      << "the slot did not reuse the product's block, so this test tests "
         "nothing";
  EXPECT_TRUE(gpu->ToHost(on_device) == x);
}

// ---- Whole steps through the Estimator ---------------------------------

pipeline::Element SyntheticImages(int64_t n, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<std::string> images;
  std::vector<int64_t> labels, ids;
  std::vector<float> dense;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t label = static_cast<int64_t>(rng() % 4);
    std::string img(12 * 12, '\0');
    for (size_t p = 0; p < img.size(); ++p) {
      img[p] = char((rng() % 64) + (p % 12 == size_t(label) * 3 ? 150 : 0));
    }
    images.push_back(img);
    labels.push_back(label);
    ids.push_back((label * 3 + i) % 11);
    for (int k = 0; k < 3; ++k) dense.push_back(float(label) - 1.5f + k * 0.1f);
  }
  pipeline::Element e;
  e.Set("image", Tensor::FromStrings(images, Shape{n}));
  e.Set("dense", Tensor::FromValues<float>(dense, Shape{n, 3}));
  e.Set("id", Tensor::FromValues<int64_t>(ids, Shape{n}));
  e.Set("label", Tensor::FromValues<int64_t>(labels, Shape{n}));
  return e;
}

InputFn Input(int64_t batch) {
  return [batch] {
    return pipeline::Dataset::FromTensorSlices(SyntheticImages(96, 5))
        .Repeat()
        .Batch(batch, true);
  };
}

std::vector<std::pair<std::string, ModelFn>> CannedModels() {
  const FeatureColumn image =
      RawBytesColumn("image", Shape{12, 12, 1}, 1.0f / 255);
  const std::vector<FeatureColumn> columns = {
      NumericColumn("dense", Shape{3}),
      EmbeddingColumn(CategoricalColumnWithIdentity("id", 11), 4),
      IndicatorColumn(CategoricalColumnWithIdentity("id", 11))};
  CNNOptions cnn;
  cnn.image = image;
  cnn.filters = {8, 16};
  cnn.dense_units = {32};
  cnn.dropout = 0.25f;
  cnn.n_classes = 4;
  cnn.optimizer = "sgd";
  cnn.learning_rate = ConstantLearningRate(0.05f);
  return {
      {"linear",
       LinearClassifierFn({.columns = columns,
                           .n_classes = 4,
                           .optimizer = "sgd",
                           .learning_rate = ConstantLearningRate(0.1f)})},
      {"dnn", DNNClassifierFn({.hidden_units = {16, 8},
                               .columns = columns,
                               .n_classes = 4,
                               .dropout = 0.1f,
                               .batch_norm = true,
                               .optimizer = "momentum",
                               .learning_rate = ConstantLearningRate(0.05f)})},
      {"cnn", CNNClassifierFn(cnn)},
  };
}

std::shared_ptr<Backend> SharedGpu() {
  return std::shared_ptr<Backend>(Gpu(nullptr).get(), [](Backend*) {});
}

// A quiet run (seed 3, no step logs, summaries or log lines) on `backend`
// (null: the CPU backend of config.threads), for a test to vary before
// it makes its Estimators.
struct QuietRun {
  RunConfig config;
  EstimatorOptions options;
};
QuietRun Quiet(std::shared_ptr<Backend> backend) {
  QuietRun run;
  run.config.seed = 3;
  run.config.log_step_count_steps = 0;
  run.config.save_summary_steps = 0;
  run.options.log = [](std::string_view) {};
  run.options.backend = std::move(backend);
  return run;
}

Estimator MakeEstimator(const ModelFn& fn, const std::string& dir, bool gpu) {
  QuietRun run = Quiet(gpu ? SharedGpu() : nullptr);
  run.config.model_dir = dir;
  run.config.threads = 2;
  return Estimator(fn, run.config, run.options);
}

void ExpectSameCheckpoints(const std::string& a, const std::string& b,
                           double tol) {
  const TensorMap ta = ReadCheckpoint(a), tb = ReadCheckpoint(b);
  ASSERT_EQ(ta.size(), tb.size());
  for (const auto& [name, t] : ta) {
    // The input's position is the pipeline's, not the model's.
    if (name == kIteratorStateKey) continue;
    auto it = tb.find(name);
    ASSERT_NE(it, tb.end()) << name;
    ASSERT_EQ(t.shape(), it->second.shape()) << name;
    if (t.dtype() != DType::kFloat32) {
      EXPECT_TRUE(t == it->second) << name;
      continue;
    }
    for (int64_t i = 0; i < t.num_elements(); ++i) {
      ASSERT_NEAR(t.data<float>()[i], it->second.data<float>()[i],
                  tol * (1 + std::abs(t.data<float>()[i])))
          << name << " value " << i;
    }
  }
}

TEST(CudaBackendTest, OneTrainingStepOfEachCannedModelMatchesTheCpu) {
  REQUIRE_GPU();
  for (const auto& [name, fn] : CannedModels()) {
    SCOPED_TRACE(name);
    recflow::testing::TempDir dir;
    Estimator cpu = MakeEstimator(fn, (dir.path() / "cpu").string(), false);
    Estimator gpu = MakeEstimator(fn, (dir.path() / "gpu").string(), true);
    cpu.Train(Input(16), {}, std::nullopt, 1);
    gpu.Train(Input(16), {}, std::nullopt, 1);
    ExpectSameCheckpoints(*cpu.latest_checkpoint(), *gpu.latest_checkpoint(),
                          1e-4);
    const auto a = cpu.Evaluate(Input(16), 2);
    const auto b = gpu.Evaluate(Input(16), 2);
    EXPECT_NEAR(a.at("loss"), b.at("loss"), 1e-4 * (1 + a.at("loss")));
    EXPECT_EQ(a.at("accuracy"), b.at("accuracy"));
  }
}

TEST(CudaBackendTest, CheckpointsMoveBetweenCpuAndGpu) {
  REQUIRE_GPU();
  const ModelFn fn = CannedModels()[2].second;  // the CNN
  recflow::testing::TempDir dir;
  // Trained on the GPU, evaluated on the CPU and the GPU alike...
  Estimator gpu = MakeEstimator(fn, (dir.path() / "m").string(), true);
  gpu.Train(Input(16), {}, std::nullopt, 5);
  Estimator cpu = MakeEstimator(fn, (dir.path() / "m").string(), false);
  const double on_cpu = cpu.Evaluate(Input(16), 3).at("loss");
  const double on_gpu = gpu.Evaluate(Input(16), 3).at("loss");
  EXPECT_NEAR(on_cpu, on_gpu, 1e-4 * (1 + on_cpu));
  // ...then trained on by the CPU, from step 5, and back on the GPU.
  EXPECT_EQ(cpu.Train(Input(16), {}, std::nullopt, 8), 8);
  EXPECT_EQ(gpu.Train(Input(16), {}, std::nullopt, 10), 10);
  const auto last = cpu.Evaluate(Input(16), 3);
  EXPECT_EQ(last.at("global_step"), 10);
  EXPECT_NEAR(last.at("loss"), gpu.Evaluate(Input(16), 3).at("loss"),
              1e-4 * (1 + last.at("loss")));
}

// Counts the allocator's trips to cudaMalloc after the first steps.
class MallocHook : public SessionRunHook {
 public:
  explicit MallocHook(Backend& be) : be_(be) {}
  void after_run(RunContext& run, const SessionRunValues&) override {
    const int64_t step = run.session().global_step();
    if (step == 3) at_step_3 = be_.DeviceMallocs();
    if (step == 20) at_step_20 = be_.DeviceMallocs();
  }
  uint64_t at_step_3 = 0, at_step_20 = 0;

 private:
  Backend& be_;
};

// RunConfig::cuda_graphs: each step after the warm-up captured into a
// CUDA graph and launched as one; the same variables as steps launched
// call by call, over a last partial batch (other shapes: a graph made
// anew, and for the CNN new convolution plans, which end the capture
// early).  A step that throws drops its capture and leaves the backend
// usable.
TEST(CudaBackendTest, StepGraphsTrainAsCallByCall) {
  REQUIRE_GPU();
  const InputFn input = [] {
    return pipeline::Dataset::FromTensorSlices(SyntheticImages(96, 5))
        .Repeat(2)
        .Batch(20);  // 9 batches of 20, then 12
  };
  for (const auto& [name, fn] : CannedModels()) {
    SCOPED_TRACE(name);
    recflow::testing::TempDir dir;
    const std::shared_ptr<Backend> be = MakeCudaBackend(0, false);
    auto [config, options] = Quiet(be);
    config.model_dir = (dir.path() / "calls").string();
    config.cuda_graphs = false;
    Estimator calls(fn, config, options);
    EXPECT_EQ(calls.Train(input, {}, std::nullopt, 100), 10);
    EXPECT_EQ(be->step_graph_stats().launches, 0u);
    config.model_dir = (dir.path() / "graphs").string();
    config.cuda_graphs = true;
    Estimator graphs(fn, config, options);
    EXPECT_EQ(graphs.Train(input, {}, std::nullopt, 100), 10);
    const Backend::StepGraphStats s = be->step_graph_stats();
    // Steps 3 to 10 captured (a capture ended early launches too).
    EXPECT_GE(s.launches, 8u);
    EXPECT_GE(s.instantiations, 1u);
    EXPECT_LT(s.instantiations, s.launches);  // the rest were updates
    ExpectSameCheckpoints(*calls.latest_checkpoint(),
                          *graphs.latest_checkpoint(), 1e-5);

    // A step that throws while it is captured.
    config.model_dir = (dir.path() / "throws").string();
    const ModelFn throwing = [fn = fn](const Features& f, const Tensor* labels,
                                       Mode mode, ModelContext& ctx) {
      EstimatorSpec spec = fn(f, labels, mode, ctx);
      if (ctx.global_step() == 4) throw Error("step 4 fails");
      return spec;
    };
    Estimator failing(throwing, config, options);
    EXPECT_THROW(failing.Train(input, {}, std::nullopt, 100), Error);
    be->Synchronize();
    config.model_dir = (dir.path() / "after").string();
    Estimator after(fn, config, options);
    EXPECT_EQ(after.Train(input, {}, std::nullopt, 100), 10);
    ExpectSameCheckpoints(*calls.latest_checkpoint(),
                          *after.latest_checkpoint(), 1e-5);
  }
}

// The n x n identity (products with it are exact).
Tensor Identity(int64_t n) {
  Tensor eye = Tensor::Allocate(DType::kFloat32, Shape{n, n});
  std::memset(eye.mutable_data<float>(), 0, eye.byte_size());
  for (int64_t i = 0; i < n; ++i) eye.mutable_data<float>()[i * n + i] = 1;
  return eye;
}
// 30 batches of 4 random rows of `cols` floats ("x"), the rows' seeds
// from `seed`, behind a Prefetch(2).
pipeline::Dataset RowBatches(int64_t cols, uint64_t seed) {
  return pipeline::Dataset::Range(0, 120)
      .Map([cols, seed](pipeline::Element e) {
        const int64_t v = e["value"].scalar<int64_t>();
        e.Set("x", Random({cols}, seed + static_cast<uint64_t>(v)));
        return e;
      })
      .Batch(4)
      .Prefetch(2);
}
// Prefetch(batch), then the product of its "x" (RowBatches' 4 x `eye`'s
// size) with the identity `eye` on the device, computed four times over
// (device time for the pipeline to race the queued work): the product,
// queued, not waited for.
Tensor QueueIdentityProduct(Backend& gpu, const pipeline::Element& batch,
                            const Tensor& eye) {
  const int64_t cols = eye.shape()[0];
  gpu.Prefetch(batch);
  const Tensor x = gpu.ToDevice(batch["x"]);
  Tensor out = gpu.Allocate(DType::kFloat32, Shape{4, cols});
  for (int k = 0; k < 4; ++k) {
    gpu.Gemm(false, false, 4, cols, cols, 1.0f, x.data<float>(),
             eye.data<float>(), 0.0f, out.mutable_data<float>());
  }
  return out;
}

// Backend::InputStager: batches staged on another thread (the pipeline's
// prefetch thread) arrive as Prefetch would have copied them, and Prefetch
// takes them staged, also while the device still computes the steps
// before; a tensor handed out from a staging buffer keeps its values while
// it is held (the buffer is not restaged); batches staged by an iterator
// that is gone are let go when the next one stages; with every staging
// buffer taken, Prefetch copies the batch itself.
TEST(CudaBackendTest, InputStagedOnThePipelinesThreadArrivesAsPrefetched) {
  REQUIRE_GPU();
  EXPECT_EQ(Cpu().InputStager(), nullptr);
  const std::unique_ptr<Backend> gpu = MakeCudaBackend(0, false);
  const std::shared_ptr<pipeline::Allocator> pinned = gpu->InputMemory();
  uint64_t seed = 500;
  const auto make = [&] {
    pipeline::Element e;
    e.Set("x", Random({64, 5}, seed++).CopyInto(pinned));
    e.Set("y", Random({33}, seed++));  // pageable: the stager packs it
    return e;
  };
  const auto stage_on_a_thread =
      [](const std::function<void(const pipeline::Element&)>& stager,
         const std::vector<pipeline::Element>& batches) {
        std::thread t([&] {
          for (const auto& e : batches) stager(e);
        });
        t.join();
      };
  const auto expect_arrives = [&](const pipeline::Element& e) {
    gpu->Prefetch(e);
    EXPECT_TRUE(gpu->ToHost(gpu->ToDevice(e["x"])) == e["x"]);
    EXPECT_TRUE(gpu->ToHost(gpu->ToDevice(e["y"])) == e["y"]);
  };
  const std::function<void(const pipeline::Element&)> stager =
      gpu->InputStager();
  ASSERT_NE(stager, nullptr);
  const std::vector<pipeline::Element> first = {make(), make(), make()};
  stage_on_a_thread(stager, first);
  EXPECT_EQ(gpu->input_stats().staged, 3u);
  gpu->Prefetch(first[0]);
  const Tensor held = gpu->ToDevice(first[0]["x"]);
  EXPECT_TRUE(gpu->ToHost(held) == first[0]["x"]);
  expect_arrives(first[1]);
  expect_arrives(first[2]);
  EXPECT_EQ(gpu->input_stats().taken, 3u);
  EXPECT_EQ(gpu->input_stats().unstaged, 0u);

  // Every buffer taken (one held above, the rest staged and not taken):
  // the batches after are copied by Prefetch itself, all in order.
  std::vector<pipeline::Element> many;
  for (int i = 0; i < 9; ++i) many.push_back(make());
  stage_on_a_thread(stager, many);
  // Six buffers: one held, one the last batch's (free at the next
  // Prefetch), four to stage into.
  const Backend::InputStats s = gpu->input_stats();
  EXPECT_EQ(s.staged, 3u + 4u);
  EXPECT_EQ(s.unstaged, 5u);
  for (const auto& e : many) expect_arrives(e);
  EXPECT_EQ(gpu->input_stats().taken, 3u + 4u);

  // As the Estimator stages: an Iterator's Prefetch driver stages each
  // batch as it is made while this thread takes them and queues work that
  // reads them (a product with the identity: exact), synchronising only at
  // the end, so that copies into reused buffers race the steps if they are
  // not ordered after them.
  constexpr int64_t kCols = 256;
  const Tensor d_eye = gpu->ToDevice(Identity(kCols));
  const pipeline::Dataset ds = RowBatches(kCols, 1000);
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round == 0 ? "an iterator left early" : "the next one");
    const uint64_t taken_before = gpu->input_stats().taken;
    pipeline::Iterator it = ds.MakeIterator(
        {.threads = 2, .output_memory = pinned, .prepare = gpu->InputStager()});
    std::vector<pipeline::Element> batches;
    std::vector<Tensor> outs;
    pipeline::Element e;
    while (it.Next(&e)) {
      outs.push_back(QueueIdentityProduct(*gpu, e, d_eye));
      batches.push_back(e);
      // The first iterator goes with batches staged ahead and not taken.
      if (round == 0 && batches.size() == 10) break;
    }
    EXPECT_EQ(batches.size(), round == 0 ? 10u : 30u);
    for (size_t i = 0; i < batches.size(); ++i) {
      EXPECT_TRUE(gpu->ToHost(outs[i]) == batches[i]["x"]) << "batch " << i;
    }
    // Every batch staged, unless all buffers were taken at the time.
    EXPECT_GE(gpu->input_stats().taken - taken_before, batches.size() * 2 / 3);
  }
  // A consumer that takes some batches without a Prefetch (a backend of
  // its own: all six staging buffers end up holding batches never taken):
  // once those are 64 Prefetch calls old they are let go, and the batches
  // after are staged again.
  {
    const std::unique_ptr<Backend> fresh = MakeCudaBackend(0, false);
    const pipeline::Dataset more =
        pipeline::Dataset::Range(0, 4 * 120).Batch(4).Prefetch(2);
    pipeline::Iterator it =
        more.MakeIterator({.threads = 2,
                           .output_memory = fresh->InputMemory(),
                           .prepare = fresh->InputStager()});
    pipeline::Element e;
    for (int i = 0; i < 20; ++i) ASSERT_TRUE(it.Next(&e));
    int n = 0;
    while (it.Next(&e)) {
      fresh->Prefetch(e);
      EXPECT_TRUE(fresh->ToHost(fresh->ToDevice(e["value"])) == e["value"])
          << n;
      ++n;
    }
    EXPECT_EQ(n, 100);
    EXPECT_EQ(fresh->input_stats().staged, fresh->input_stats().taken + 6);
    EXPECT_GE(fresh->input_stats().taken, 25u);
  }
  EXPECT_TRUE(gpu->ToHost(held) == first[0]["x"]);
}

// Each canned model trained twice on one backend, call by call and with
// step graphs, over two Train calls (the second restores the iterator):
// copying each batch in Prefetch, then as `variant` sets the input up;
// the same variables within 1e-5, and `check` on the backend after.
void ExpectTrainsAsCopiedInPrefetch(
    const std::function<void(RunConfig&)>& variant,
    const std::function<void(const Backend&)>& check) {
  const InputFn input = [] {
    return pipeline::Dataset::FromTensorSlices(SyntheticImages(96, 5))
        .Repeat()
        .Batch(16, true)
        .Prefetch(2);
  };
  for (const auto& [name, fn] : CannedModels()) {
    for (bool graphs : {false, true}) {
      SCOPED_TRACE(name + (graphs ? ", step graphs" : ", call by call"));
      recflow::testing::TempDir dir;
      const std::shared_ptr<Backend> be = MakeCudaBackend(0, false);
      auto [config, options] = Quiet(be);
      config.cuda_graphs = graphs;
      config.stage_input = false;
      config.model_dir = (dir.path() / "in_prefetch").string();
      Estimator copied(fn, config, options);
      EXPECT_EQ(copied.Train(input, {}, std::nullopt, 6), 6);
      EXPECT_EQ(copied.Train(input, {}, std::nullopt, 12), 12);
      EXPECT_EQ(be->input_stats().staged, 0u);
      EXPECT_EQ(be->input_stats().in_place, 0u);
      variant(config);
      config.model_dir = (dir.path() / "variant").string();
      Estimator varied(fn, config, options);
      EXPECT_EQ(varied.Train(input, {}, std::nullopt, 6), 6);
      EXPECT_EQ(varied.Train(input, {}, std::nullopt, 12), 12);
      check(*be);
      ExpectSameCheckpoints(*copied.latest_checkpoint(),
                            *varied.latest_checkpoint(), 1e-5);
    }
  }
}

// RunConfig::stage_input: batches copied by the input pipeline's thread as
// they are made train exactly as batches copied by Prefetch on the
// training thread, call by call and with step graphs, also across a
// second Train that restores the iterator (its buffered batches staged
// anew) after the first left batches staged ahead.
TEST(CudaBackendTest, InputStagedOnThePipelinesThreadTrainsAsCopiedInPrefetch) {
  REQUIRE_GPU();
  ExpectTrainsAsCopiedInPrefetch(
      [](RunConfig& c) { c.stage_input = true; },
      [](const Backend& be) { EXPECT_GE(be.input_stats().taken, 10u); });
}

// SetInputInPlace: a batch whose tensors are all pinned and small is read
// where it is: ToDevice gives device tensors at the host addresses, whose
// values the device reads (products, copies, ToHost); a batch with a
// pageable tensor, or over 1 MiB, is copied as before.  Batches the queued
// steps read are held while the pipeline runs ahead, so none is rewritten
// under a step that has not run.
TEST(CudaBackendTest, InputReadInPlaceIsReadWhereThePipelineMadeIt) {
  REQUIRE_GPU();
  const std::unique_ptr<Backend> gpu = MakeCudaBackend(0, false);
  const std::shared_ptr<pipeline::Allocator> pinned = gpu->InputMemory();
  gpu->SetInputInPlace(true);
  pipeline::Element e;
  e.Set("x", Random({64, 5}, 900).CopyInto(pinned));
  const std::vector<int64_t> n = {3, 1, 4};
  e.Set("n", Tensor::FromValues<int64_t>(n, Shape{3}).CopyInto(pinned));
  gpu->Prefetch(e);
  EXPECT_EQ(gpu->input_stats().in_place, 1u);
  const Tensor x = gpu->ToDevice(e["x"]);
  EXPECT_EQ(x.device(), Device::kCuda);
  EXPECT_EQ(x.raw_data(), e["x"].raw_data());
  EXPECT_TRUE(gpu->ToHost(x) == e["x"]);
  EXPECT_TRUE(gpu->ToHost(gpu->ToDevice(e["n"])) == e["n"]);
  Tensor copy = gpu->Allocate(DType::kFloat32, Shape{64, 5});
  gpu->Copy(320, x.data<float>(), copy.mutable_data<float>());
  EXPECT_TRUE(gpu->ToHost(copy) == e["x"]);

  // Pageable, or too large: copied.
  pipeline::Element pageable;
  pageable.Set("x", Random({64, 5}, 901));
  gpu->Prefetch(pageable);
  EXPECT_NE(gpu->ToDevice(pageable["x"]).raw_data(), pageable["x"].raw_data());
  EXPECT_TRUE(gpu->ToHost(gpu->ToDevice(pageable["x"])) == pageable["x"]);
  pipeline::Element large;
  large.Set("x", Random({300, 1000}, 902).CopyInto(pinned));
  gpu->Prefetch(large);
  EXPECT_NE(gpu->ToDevice(large["x"]).raw_data(), large["x"].raw_data());
  EXPECT_TRUE(gpu->ToHost(gpu->ToDevice(large["x"])) == large["x"]);
  EXPECT_EQ(gpu->input_stats().in_place, 1u);

  // As the Estimator reads: an Iterator's batches in pinned memory, each
  // read by queued products (with the identity: exact) and dropped at
  // once, synchronising only at the end, so that a batch given back to the
  // pipeline before its step ran would be rewritten under it.
  constexpr int64_t kCols = 256;
  const Tensor d_eye = gpu->ToDevice(Identity(kCols));
  const pipeline::Dataset ds = RowBatches(kCols, 2000);
  pipeline::Iterator it =
      ds.MakeIterator({.threads = 2, .output_memory = pinned});
  std::vector<Tensor> expected, outs;
  const uint64_t before = gpu->input_stats().in_place;
  pipeline::Element b;
  while (it.Next(&b)) {
    outs.push_back(QueueIdentityProduct(*gpu, b, d_eye));
    expected.push_back(HostCopy(b["x"]));  // a copy of its own
  }
  ASSERT_EQ(outs.size(), 30u);
  EXPECT_EQ(gpu->input_stats().in_place - before, 30u);
  for (size_t i = 0; i < outs.size(); ++i) {
    EXPECT_TRUE(gpu->ToHost(outs[i]) == expected[i]) << "batch " << i;
  }
}

// RunConfig::read_input_in_place: batches read where the pipeline made
// them train exactly as batches copied by Prefetch, call by call and with
// step graphs, also across a second Train that restores the iterator.
TEST(CudaBackendTest, InputReadInPlaceTrainsAsCopiedInPrefetch) {
  REQUIRE_GPU();
  ExpectTrainsAsCopiedInPrefetch(
      [](RunConfig& c) { c.read_input_in_place = true; },
      [](const Backend& be) {
        EXPECT_GE(be.input_stats().in_place, 12u);
        EXPECT_EQ(be.input_stats().staged, 0u);
      });
}

TEST(CudaBackendTest, SteadyStateStepsAllocateNoDeviceMemory) {
  REQUIRE_GPU();
  recflow::testing::TempDir dir;
  Estimator gpu =
      MakeEstimator(CannedModels()[2].second, dir.path().string(), true);
  auto hook = std::make_shared<MallocHook>(*Gpu(nullptr));
  gpu.Train(Input(16), {hook}, std::nullopt, 20);
  EXPECT_GT(hook->at_step_3, 0u);
  EXPECT_EQ(hook->at_step_20, hook->at_step_3) << Gpu(nullptr)->MemoryReport();
}

// NCCL on one GPU: a world of one rank joins once (one unique id
// broadcast, however many all-reduces follow), sums leave the values as
// they are, and a second world is refused.  A backend of its own: the
// communicator stays with the backend.
TEST(CudaBackendTest, NcclAllReduceOfOneRankJoinsOnceAndKeepsTheValues) {
  REQUIRE_GPU();
  if (!NcclBuilt()) GTEST_SKIP() << "this build has no NCCL (nccl.h, libnccl)";
  const std::unique_ptr<Backend> be = MakeCudaBackend(0, false);
  testing::FakeWorld world(1);
  const Tensor a = Random(Shape{40000}, 21), b = Random(Shape{7}, 22);
  Tensor da = be->ToDevice(HostCopy(a)), db = be->ToDevice(HostCopy(b));
  const std::vector<std::span<float>> grads = {
      {da.mutable_data<float>(), 40000}, {db.mutable_data<float>(), 7}};
  be->AllReduceSum(world, grads);
  be->AllReduceSum(world, grads);
  EXPECT_EQ(world.broadcasts, 1);
  const Tensor ha = be->ToHost(da), hb = be->ToHost(db);
  for (int64_t i = 0; i < 40000; ++i) {
    ASSERT_EQ(ha.data<float>()[i], a.data<float>()[i]) << i;
  }
  for (int64_t i = 0; i < 7; ++i)
    ASSERT_EQ(hb.data<float>()[i], b.data<float>()[i]);
  testing::FakeWorld other(1);
  EXPECT_THROW(be->AllReduceSum(other, grads), Error);
}

// A launched job of one rank on the GPU (mpirun -np 1 recflow train
// --device cuda): the gradients go through NCCL every step, none through
// host memory, and training ends where training alone does, to the bit:
// the DNN (cuBLAS and our kernels, deterministic; cuDNN may pick a
// backward-filter algorithm that adds with atomics), on one backend for
// both runs.
TEST(CudaBackendTest, OneRankTrainingThroughNcclMatchesTrainingAlone) {
  REQUIRE_GPU();
  if (!NcclBuilt()) GTEST_SKIP() << "this build has no NCCL (nccl.h, libnccl)";
  const ModelFn fn = CannedModels()[1].second;  // the DNN
  const std::shared_ptr<Backend> be = MakeCudaBackend(0, false);
  recflow::testing::TempDir dir;
  auto [config, options] = Quiet(be);
  config.model_dir = (dir.path() / "alone").string();
  Estimator alone(fn, config, options);
  alone.Train(Input(16), {}, std::nullopt, 4);
  auto world = std::make_shared<testing::FakeWorld>(1);
  options.collective = world;
  config.model_dir = (dir.path() / "nccl").string();
  Estimator launched(fn, config, options);
  launched.Train(Input(16), {}, std::nullopt, 4);
  EXPECT_EQ(world->broadcasts, 1);          // the NCCL unique id
  EXPECT_TRUE(world->float_calls.empty());  // no gradient via the host
  // Not bit for bit: the embedding's gradient is summed with atomic adds,
  // in an order that changes from run to run (as TensorFlow's GPU segment
  // sums); seen 2.7e-7 apart relative after 4 steps on an H200.
  ExpectSameCheckpoints(*alone.latest_checkpoint(),
                        *launched.latest_checkpoint(), 1e-6);
}

}  // namespace
}  // namespace recflow::train
