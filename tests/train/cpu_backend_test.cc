// The CPU backend's parallel paths (products split into blocks of the
// output, convolutions split by images, loops split into ranges) against
// plain loops, on team sizes 1, 2 and 3, at sizes large enough to split;
// and the same numbers on every run with one team size.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "records/aligned_buffer.h"
#include "train/backend.h"
#include "train_test_util.h"

namespace recflow::train {
namespace {

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

void ExpectNear(const std::vector<float>& got, const std::vector<double>& want,
                double tolerance, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tolerance * std::max(1.0, std::abs(want[i])))
        << what << " at " << i;
  }
}

TEST(CpuBackendTest, GemmSplitOverTheTeamMatchesAPlainLoop) {
  // m >= n splits rows, m < n columns; both larger than one block.
  struct Case {
    int64_t m, n, k;
  };
  for (const Case c : {Case{301, 67, 150}, Case{40, 333, 120}}) {
    for (int threads : {1, 2, 3}) {
      auto be = MakeCpuBackend(threads);
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
          for (float beta : {0.0f, 1.0f, 0.5f}) {
            const auto a = Random(c.m * c.k, 1), b = Random(c.k * c.n, 2);
            std::vector<float> out = Random(c.m * c.n, 3);
            std::vector<double> want(out.size());
            for (int64_t i = 0; i < c.m; ++i) {
              for (int64_t j = 0; j < c.n; ++j) {
                double s = 0;
                for (int64_t p = 0; p < c.k; ++p) {
                  const float av = ta ? a[p * c.m + i] : a[i * c.k + p];
                  const float bv = tb ? b[j * c.k + p] : b[p * c.n + j];
                  s += double(av) * bv;
                }
                want[i * c.n + j] = 0.75 * s + beta * out[i * c.n + j];
              }
            }
            be->Gemm(ta, tb, c.m, c.n, c.k, 0.75f, a.data(), b.data(), beta,
                     out.data());
            ExpectNear(out, want, 1e-4,
                       fmt::format("{}x{}x{} ta={} tb={} beta={} threads={}",
                                   c.m, c.n, c.k, ta, tb, beta, threads));
          }
        }
      }
    }
  }
}

// Products run on the team's threads at once only with a BLAS that takes
// concurrent calls; the backend's name says which it found.  The ctest
// train.sequential_openblas runs this file with OpenBLAS's sequential
// build loaded (RECFLOW_EXPECT_SEQUENTIAL_BLAS=1): then the products above
// must still match the plain loop, one call at a time.
TEST(CpuBackendTest, NamesItsBlasAndWhetherCallsRunAtOnce) {
  const std::string name = MakeCpuBackend(2)->name();
  EXPECT_NE(name.find("products: OpenBLAS 0."), std::string::npos) << name;
  const bool sequential = std::getenv("RECFLOW_EXPECT_SEQUENTIAL_BLAS");
  EXPECT_EQ(name.find("one call at a time") != std::string::npos, sequential)
      << name;
}

// Calls fn(xi, wi, yi) for every product x[xi] * w[wi] that a plain
// convolution adds into y[yi] (x NHWC, w HWIO, y NHWC): the forward pass
// and both gradients below come from this one definition.
template <typename Fn>
void ForEachTap(const Window2D& g, const Fn& fn) {
  for (int64_t b = 0; b < g.batch; ++b)
    for (int64_t oh = 0; oh < g.out_h; ++oh)
      for (int64_t ow = 0; ow < g.out_w; ++ow)
        for (int64_t ky = 0; ky < g.window_h; ++ky)
          for (int64_t kx = 0; kx < g.window_w; ++kx) {
            const int64_t iy = oh * g.stride_h - g.pad_top + ky;
            const int64_t ix = ow * g.stride_w - g.pad_left + kx;
            if (iy < 0 || iy >= g.in_h || ix < 0 || ix >= g.in_w) continue;
            for (int64_t c = 0; c < g.in_c; ++c)
              for (int64_t o = 0; o < g.out_c; ++o) {
                fn(((b * g.in_h + iy) * g.in_w + ix) * g.in_c + c,
                   ((ky * g.window_w + kx) * g.in_c + c) * g.out_c + o,
                   ((b * g.out_h + oh) * g.out_w + ow) * g.out_c + o);
              }
          }
}

// y, and dL/dx and dL/dw of L = sum(y * dy), summed in double by the plain
// loops; and the sums of their terms' magnitudes, for tolerances that
// follow how many terms a value adds up.
struct PlainSums {
  std::vector<double> y, dx, dw;
  std::vector<double> y_abs, dx_abs, dw_abs;
};
PlainSums PlainConvolution(const Window2D& g, const std::vector<float>& x,
                           const std::vector<float>& w,
                           const std::vector<float>& dy) {
  PlainSums s{std::vector<double>(dy.size()), std::vector<double>(x.size()),
              std::vector<double>(w.size()),  std::vector<double>(dy.size()),
              std::vector<double>(x.size()),  std::vector<double>(w.size())};
  ForEachTap(g, [&](int64_t xi, int64_t wi, int64_t yi) {
    const double y = double(x[xi]) * w[wi], dx = double(dy[yi]) * w[wi],
                 dw = double(dy[yi]) * x[xi];
    s.y[yi] += y;
    s.dx[xi] += dx;
    s.dw[wi] += dw;
    s.y_abs[yi] += std::abs(y);
    s.dx_abs[xi] += std::abs(dx);
    s.dw_abs[wi] += std::abs(dw);
  });
  return s;
}

// Through im2col (6 channels in; 1 in and 24 filters out where a SIMD
// width is 16 floats, AVX-512) and the direct loops of few input channels
// and whole SIMD widths of filters (1, 3 or 4 in; 16 or 32 out, and 24 on
// AVX2's 8-float width), with windows that the direct dW loops cover in
// one block of taps (3x3), in several (5x5, 2x4) or in a row (1x1); and
// through Winograd's F(2x2, 3x3) (16 or 20 in, 16 or 32 out, 3x3 at stride
// 1: the forward pass, dx and dw), where 11x10 and 9x8 outputs leave a last
// row and column of 2x2 tiles half outside, and SAME and VALID pad the
// tiles differently.
TEST(CpuBackendTest, ConvolutionSplitByImagesMatchesPlainLoops) {
  struct Channels {
    int64_t in, out;
  };
  struct Window {
    int64_t h, w;
  };
  for (const Window window :
       {Window{3, 3}, Window{5, 5}, Window{2, 4}, Window{1, 1}}) {
    for (Padding padding : {Padding::kSame, Padding::kValid}) {
      for (int stride : {1, 2}) {
        for (const Channels ch :
             {Channels{1, 24}, Channels{6, 24}, Channels{1, 32},
              Channels{3, 32}, Channels{4, 16}, Channels{16, 16},
              Channels{20, 32}}) {
          const int64_t in_c = ch.in;
          Window2D g;
          g.batch = 26;
          g.in_h = 11;
          g.in_w = 10;
          g.in_c = in_c;
          g.window_h = window.h;
          g.window_w = window.w;
          g.stride_h = g.stride_w = stride;
          g.padding = padding;
          g.out_c = ch.out;
          g.Resolve();
          const auto x = Random(g.batch * g.in_h * g.in_w * g.in_c, 4);
          const auto w = Random(g.window_h * g.window_w * g.in_c * g.out_c, 5);
          const auto dy = Random(g.batch * g.out_h * g.out_w * g.out_c, 6);
          const PlainSums plain = PlainConvolution(g, x, w, dy);
          const std::vector<double>& want = plain.y;
          const std::vector<double>& dx = plain.dx;
          const std::vector<double>& dw = plain.dw;
          for (int threads : {1, 2, 3}) {
            const std::string what = fmt::format(
                "window={}x{} same={} stride={} in_c={} out_c={} threads={}",
                window.h, window.w, padding == Padding::kSame, stride, in_c,
                ch.out, threads);
            auto be = MakeCpuBackend(threads);
            std::vector<float> y(want.size());
            be->Conv2D(g, x.data(), w.data(), y.data());
            ExpectNear(y, want, 1e-4, what + " y");
            // Accumulates: start from ones.
            std::vector<float> gx(x.size(), 1.0f), gw(w.size(), 1.0f);
            be->Conv2DBackward(g, x.data(), w.data(), dy.data(), gx.data(),
                               gw.data());
            std::vector<double> want_dx = dx, want_dw = dw;
            for (double& v : want_dx) v += 1;
            for (double& v : want_dw) v += 1;
            ExpectNear(gx, want_dx, 1e-4, what + " dx");
            ExpectNear(gw, want_dw, 1e-4, what + " dw");
            // An input that wants no gradient (a first layer): dW alone.
            std::fill(gw.begin(), gw.end(), 1.0f);
            be->Conv2DBackward(g, x.data(), w.data(), dy.data(), nullptr,
                               gw.data());
            ExpectNear(gw, want_dw, 1e-4, what + " dw without dx");
          }
        }
      }
    }
  }
}

// Convolutions work on groups of a bounded size, not on whole images, so
// that a large image's scratch stays bounded: Winograd on runs of 2x2
// tiles (2 MiB of transforms: images of 35 x 33 tiles at 16 -> 16 channels
// are split between groups of 1,024 tiles), im2col on runs of output
// pixels (512 KiB of columns: 655 of a 5x5 window over 8 channels, of
// 4,620 an image).  The results are the plain sums.
TEST(CpuBackendTest, ConvolutionGroupsSplitLargeImagesAndMatchPlainLoops) {
  struct Case {
    int64_t window, in_c, out_c;
  };
  for (const Case k : {Case{3, 16, 16}, Case{5, 8, 12}}) {
    Window2D g;
    g.batch = 3;
    g.in_h = 70;
    g.in_w = 66;
    g.in_c = k.in_c;
    g.window_h = g.window_w = k.window;
    g.padding = Padding::kSame;
    g.out_c = k.out_c;
    g.Resolve();
    const auto x = Random(g.batch * g.in_h * g.in_w * g.in_c, 11);
    const auto w = Random(k.window * k.window * g.in_c * g.out_c, 12);
    const auto dy = Random(g.batch * g.out_h * g.out_w * g.out_c, 13);
    // A dW value sums 13,860 products or more, so float rounding is
    // measured against the sum of their magnitudes.
    const PlainSums plain = PlainConvolution(g, x, w, dy);
    const auto expect =
        [](const std::vector<float>& got, const std::vector<double>& sums,
           const std::vector<double>& magnitudes, const std::string& what) {
          for (size_t i = 0; i < got.size(); ++i) {
            ASSERT_NEAR(got[i], sums[i], 1e-6 * magnitudes[i] + 1e-6)
                << what << " at " << i;
          }
        };
    for (int threads : {1, 2}) {
      const std::string what =
          fmt::format("window={} threads={}", k.window, threads);
      auto be = MakeCpuBackend(threads);
      std::vector<float> y(plain.y.size());
      be->Conv2D(g, x.data(), w.data(), y.data());
      expect(y, plain.y, plain.y_abs, what + " y");
      std::vector<float> gx(x.size(), 0.0f), gw(w.size(), 0.0f);
      be->Conv2DBackward(g, x.data(), w.data(), dy.data(), gx.data(),
                         gw.data());
      expect(gx, plain.dx, plain.dx_abs, what + " dx");
      expect(gw, plain.dw, plain.dw_abs, what + " dw");
    }
  }
}

// dW through im2col (8 channels in) and through Winograd (16 in), and the
// column sums, summed in task order: the same bits on every run.
TEST(CpuBackendTest, SameNumbersOnEveryRunWithOneTeamSize) {
  for (const int64_t in_c : {8, 16}) {
    Window2D g;
    g.batch = 64;
    g.in_h = g.in_w = 14;
    g.in_c = in_c;
    g.window_h = g.window_w = 3;
    g.padding = Padding::kSame;
    g.out_c = 32;
    g.Resolve();
    const auto x = Random(g.batch * 14 * 14 * in_c, 7);
    const auto w = Random(9 * in_c * 32, 8);
    const auto dy = Random(g.batch * 14 * 14 * 32, 9);
    const auto y = Random(g.batch * 14 * 14 * 32, 10);
    auto run = [&] {
      auto be = MakeCpuBackend(3);
      std::vector<float> gw(w.size(), 0.0f), db(32, 0.0f), dz(dy.size()),
          sum(32), gx(x.size(), 0.0f);
      be->Conv2DBackward(g, x.data(), w.data(), dy.data(), gx.data(),
                         gw.data());
      be->BiasActivationBackward(g.batch * 14 * 14, 32, Activation::kTanh,
                                 y.data(), dy.data(), dz.data(), db.data());
      be->ColumnSum(g.batch * 14 * 14, 32, dy.data(), 0.0f, sum.data());
      gw.insert(gw.end(), db.begin(), db.end());
      gw.insert(gw.end(), sum.begin(), sum.end());
      gw.insert(gw.end(), gx.begin(), gx.end());
      return gw;
    };
    const std::vector<float> first = run();
    for (int i = 0; i < 3; ++i) {
      const std::vector<float> again = run();
      ASSERT_EQ(0, std::memcmp(first.data(), again.data(),
                               first.size() * sizeof(float)))
          << "in_c " << in_c << ", run " << i;
    }
  }
}

// The softmax and the cross-entropy give the same bits wherever their
// buffers lie: their exps once took the values before a buffer's first
// aligned SIMD packet through the scalar exp, which differs in the last
// bits, so a scratch buffer placed by the heap made a training run differ
// from run to run.  Here the inputs and outputs lie at every float offset
// of a cache line, on team sizes 1 and 3.
TEST(CpuBackendTest, ExpsGiveTheSameBitsWhereverTheirBuffersLie) {
  constexpr int64_t kRows = 37, kCols = 10;
  const std::vector<float> logits = Random(kRows * kCols, 21);
  std::vector<int64_t> labels(kRows);
  for (int64_t r = 0; r < kRows; ++r) labels[r] = (r * 7) % kCols;
  for (int threads : {1, 3}) {
    auto be = MakeCpuBackend(threads);
    std::vector<float> want_softmax, want_losses, want_dlogits;
    for (int64_t offset = 0; offset < 16; ++offset) {
      SCOPED_TRACE(fmt::format("{} threads, offset {}", threads, offset));
      // 64-byte aligned storage, used from `offset` floats in.
      records::AlignedVector<float> in(kRows * kCols + 16), out(in.size()),
          dl(in.size()), losses(kRows + 16);
      std::copy(logits.begin(), logits.end(), in.begin() + offset);
      be->Softmax(kRows, kCols, in.data() + offset, out.data() + offset);
      be->SparseSoftmaxCrossEntropy(kRows, kCols, in.data() + offset,
                                    labels.data(), losses.data() + offset,
                                    dl.data() + offset, 0.5f);
      std::vector<float> softmax(out.begin() + offset,
                                 out.begin() + offset + kRows * kCols);
      std::vector<float> dlogits(dl.begin() + offset,
                                 dl.begin() + offset + kRows * kCols);
      std::vector<float> loss(losses.begin() + offset,
                              losses.begin() + offset + kRows);
      if (offset == 0) {
        want_softmax = softmax;
        want_dlogits = dlogits;
        want_losses = loss;
        continue;
      }
      EXPECT_EQ(softmax, want_softmax);
      EXPECT_EQ(dlogits, want_dlogits);
      EXPECT_EQ(loss, want_losses);
    }
  }
}

// 19 channels: a SIMD width of them at a time, and the rest one by one.
TEST(CpuBackendTest, MaxPoolBackwardRoutesToTheFirstMaximumOnEveryThread) {
  constexpr int64_t kChannels = 19;
  Window2D g;
  g.batch = 120;
  g.in_h = g.in_w = 8;
  g.in_c = kChannels;
  g.window_h = g.window_w = 2;
  g.stride_h = g.stride_w = 2;
  g.out_c = kChannels;
  g.Resolve();
  // Values in {0, 1, 2}: ties in most windows.
  std::vector<float> x(static_cast<size_t>(g.batch * 8 * 8 * kChannels));
  std::mt19937 rng(3);
  for (float& v : x) v = static_cast<float>(rng() % 3);
  const auto dy = Random(g.batch * 4 * 4 * kChannels, 10);
  std::vector<double> want(x.size(), 0.5);
  for (int64_t b = 0; b < g.batch; ++b)
    for (int64_t oh = 0; oh < 4; ++oh)
      for (int64_t ow = 0; ow < 4; ++ow)
        for (int64_t c = 0; c < kChannels; ++c) {
          int64_t best = -1;
          for (int64_t ky = 0; ky < 2; ++ky)
            for (int64_t kx = 0; kx < 2; ++kx) {
              const int64_t i =
                  ((b * 8 + oh * 2 + ky) * 8 + ow * 2 + kx) * kChannels + c;
              if (best < 0 || x[i] > x[best]) best = i;
            }
          want[best] += dy[((b * 4 + oh) * 4 + ow) * kChannels + c];
        }
  for (int threads : {1, 3}) {
    auto be = MakeCpuBackend(threads);
    std::vector<float> y(dy.size()), dx(x.size(), 0.5f);
    be->Pool2D(Pooling::kMax, g, x.data(), y.data());
    be->Pool2DBackward(Pooling::kMax, g, x.data(), y.data(), dy.data(),
                       dx.data());
    ExpectNear(dx, want, 1e-6, fmt::format("threads={}", threads));
    // Written, not added: whatever dx held is gone.
    std::vector<float> written(x.size(), 7.0f);
    be->Pool2DBackwardWrite(Pooling::kMax, g, x.data(), y.data(), dy.data(),
                            written.data());
    std::vector<double> want_written = want;
    for (double& v : want_written) v -= 0.5;
    ExpectNear(written, want_written, 1e-6,
               fmt::format("write, threads={}", threads));
  }
}

// Pool2DBackwardWrite overwrites dx: windows that tile the input assign
// every cell, windows that leave cells out (VALID on an odd size) or
// overlap (3x3 / 2) zero it first; each gives what adding into zeros gives.
TEST(CpuBackendTest, PoolBackwardWriteEqualsAddingIntoZeros) {
  for (const testing::PoolCase& k :
       {testing::PoolCase{8, 2, 2, Padding::kValid},
        testing::PoolCase{9, 2, 2, Padding::kValid},
        testing::PoolCase{7, 2, 2, Padding::kSame},
        testing::PoolCase{9, 3, 2, Padding::kSame},
        testing::PoolCase{9, 3, 3, Padding::kValid}}) {
    const Window2D g = k.Window(/*batch=*/6, /*channels=*/5);
    const auto x = Random(g.batch * k.in * k.in * g.in_c, 21);
    const auto dy = Random(g.batch * g.out_h * g.out_w * g.in_c, 22);
    for (Pooling kind : {Pooling::kMax, Pooling::kAverage}) {
      for (int threads : {1, 3}) {
        auto be = MakeCpuBackend(threads);
        std::vector<float> y(dy.size()), added(x.size(), 0.0f),
            written(x.size(), 7.0f);
        be->Pool2D(kind, g, x.data(), y.data());
        be->Pool2DBackward(kind, g, x.data(), y.data(), dy.data(),
                           added.data());
        be->Pool2DBackwardWrite(kind, g, x.data(), y.data(), dy.data(),
                                written.data());
        EXPECT_EQ(written, added)
            << "in " << k.in << " window " << k.window << " stride " << k.stride
            << (kind == Pooling::kMax ? " max" : " average") << " threads "
            << threads;
      }
    }
  }
}

// The CPU backend's one-pass epilogue against Backend's default (BiasAdd
// then the activation; Fill, ActivationBackward, ColumnSum), which other
// backends inherit.
TEST(CpuBackendTest, FusedEpilogueEqualsTheDefaultComposition) {
  const int64_t rows = 1500, cols = 48;
  const auto y0 = Random(rows * cols, 11), bias = Random(cols, 12),
             dy = Random(rows * cols, 13);
  for (int threads : {1, 3}) {
    auto be = MakeCpuBackend(threads);
    for (Activation f : {Activation::kLinear, Activation::kRelu,
                         Activation::kSigmoid, Activation::kTanh}) {
      const std::string what =
          fmt::format("{} threads={}", ActivationName(f), threads);
      std::vector<float> fused = y0, composed = y0;
      be->BiasActivation(rows, cols, bias.data(), f, fused.data());
      be->Backend::BiasActivation(rows, cols, bias.data(), f, composed.data());
      std::vector<double> want(composed.begin(), composed.end());
      ExpectNear(fused, want, 1e-6, what + " forward");

      std::vector<float> dz(dy.size()), dz_default(dy.size());
      std::vector<float> db(cols, 1.0f), db_default(cols, 1.0f);
      be->BiasActivationBackward(rows, cols, f, fused.data(), dy.data(),
                                 dz.data(), db.data());
      be->Backend::BiasActivationBackward(rows, cols, f, fused.data(),
                                          dy.data(), dz_default.data(),
                                          db_default.data());
      ExpectNear(dz, std::vector<double>(dz_default.begin(), dz_default.end()),
                 1e-6, what + " dz");
      ExpectNear(db, std::vector<double>(db_default.begin(), db_default.end()),
                 1e-4, what + " db");
    }
  }
}

// The dense forward with its epilogue applied block by block inside the
// split product, against Backend's default (the whole product, then the
// epilogue over all of C), with rows split (m >= n), columns split, and
// one block; a bias or none; every activation.
TEST(CpuBackendTest, GemmWithEpilogueEqualsProductThenEpilogue) {
  struct Case {
    int64_t m, n, k;
  };
  for (const Case c : {Case{301, 67, 150}, Case{40, 333, 120}, Case{9, 7, 5}}) {
    const auto a = Random(c.m * c.k, 21), b = Random(c.k * c.n, 22),
               bias = Random(c.n, 23);
    for (int threads : {1, 2, 3}) {
      auto be = MakeCpuBackend(threads);
      for (Activation f : {Activation::kLinear, Activation::kRelu,
                           Activation::kSigmoid, Activation::kTanh}) {
        for (const float* bb :
             {bias.data(), static_cast<const float*>(nullptr)}) {
          const std::string what = fmt::format(
              "{}x{}x{} {} threads={}{}", c.m, c.n, c.k, ActivationName(f),
              threads, bb == nullptr ? " no bias" : "");
          // Garbage in C first: the product must overwrite it.
          std::vector<float> fused = Random(c.m * c.n, 24),
                             composed = Random(c.m * c.n, 25);
          be->GemmBiasActivation(c.m, c.n, c.k, a.data(), b.data(), bb, f,
                                 fused.data());
          be->Backend::GemmBiasActivation(c.m, c.n, c.k, a.data(), b.data(), bb,
                                          f, composed.data());
          ExpectNear(fused,
                     std::vector<double>(composed.begin(), composed.end()),
                     1e-6, what);
        }
      }
    }
  }
}

// Adam over every variable in one loop split across the team equals
// AdamUpdate then a zeroing Fill per variable: variables of every size,
// empty ones among them, and splits that fall inside and across them.
TEST(CpuBackendTest, AdamOverAllVariablesEqualsAdamPerVariable) {
  std::vector<int64_t> sizes = {5, 0, 70000, 1, 0, 4099, 33000, 7, 250000};
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE(threads);
    auto be = MakeCpuBackend(threads);
    // [g, m, v, w] per path, each variable a slice of the four buffers.
    std::vector<std::vector<float>> one, all;
    for (uint32_t seed = 1; seed <= 4; ++seed) {
      std::vector<float> b = Random(total, seed);
      if (seed == 3) {
        for (float& x : b) x = std::abs(x);  // second moments
      }
      one.push_back(b);
      all.push_back(b);
    }
    std::vector<Backend::AdamVariable> vars;
    int64_t at = 0;
    for (int64_t n : sizes) {
      be->AdamUpdate(n, 0.01f, 0.9f, 0.999f, 1e-7f, one[0].data() + at,
                     one[1].data() + at, one[2].data() + at,
                     one[3].data() + at);
      be->Fill(n, 0.0f, one[0].data() + at);
      vars.push_back({.n = n,
                      .g = all[0].data() + at,
                      .m = all[1].data() + at,
                      .v = all[2].data() + at,
                      .w = all[3].data() + at});
      at += n;
    }
    be->AdamUpdateAll(vars, 0.01f, 0.9f, 0.999f, 1e-7f);
    for (size_t b = 0; b < 4; ++b) {
      for (int64_t i = 0; i < total; ++i) {
        const size_t j = static_cast<size_t>(i);
        if (b == 0) {
          ASSERT_EQ(all[0][j], 0.0f) << "gradient not zeroed at " << i;
          continue;
        }
        // The same formula; where a split falls may move a value between
        // the vectorised body and the scalar tail (a fused multiply-add
        // or not): within a few ulps.
        ASSERT_NEAR(all[b][j], one[b][j], 1e-6f * (1 + std::abs(one[b][j])))
            << "buffer " << b << " value " << i;
      }
    }
  }
}

// The calls that write a fresh gradient never read what it held (it is
// allocated, not zeroed): NaNs there change nothing.
TEST(CpuBackendTest, WritingCallsNeverReadTheirOutput) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int threads : {1, 2}) {
    SCOPED_TRACE(threads);
    auto be = MakeCpuBackend(threads);
    const int64_t n = 70000;
    const std::vector<float> x = Random(n, 9);
    const float alpha = -0.75f;
    std::vector<float> y(n, nan), z(n, nan), relu(n, nan);
    be->AxpyScalar(n, &alpha, x.data(), 0.0f, y.data());
    be->AxpyScalar(n, &alpha, nullptr, 0.0f, z.data());
    be->ActivationBackward(Activation::kRelu, n, x.data(), y.data(), 0.0f,
                           relu.data());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(y[i], alpha * x[i]) << i;
      ASSERT_EQ(z[i], alpha) << i;
      ASSERT_EQ(relu[i], x[i] > 0 ? y[i] : 0.0f) << i;
    }
    const int64_t rows = 300, cols = 7;
    const std::vector<float> logits = Random(rows * cols, 10);
    std::vector<int64_t> labels(rows);
    for (int64_t r = 0; r < rows; ++r) labels[r] = r % cols;
    std::vector<float> losses(rows), d(rows * cols, nan), sd(rows * cols, nan);
    be->SparseSoftmaxCrossEntropy(rows, cols, logits.data(), labels.data(),
                                  losses.data(), d.data(), 0.5f);
    std::vector<float> targets(rows * cols, 0.25f), sl(rows * cols);
    be->SigmoidCrossEntropy(rows * cols, logits.data(), targets.data(),
                            sl.data(), sd.data(), 0.5f);
    for (int64_t i = 0; i < rows * cols; ++i) {
      ASSERT_FALSE(std::isnan(d[i])) << i;
      ASSERT_FALSE(std::isnan(sd[i])) << i;
    }
    // Each row of the softmax gradient sums to scale * (1 - 1) = 0.
    for (int64_t r = 0; r < rows; ++r) {
      double sum = 0;
      for (int64_t c = 0; c < cols; ++c) sum += d[r * cols + c];
      ASSERT_NEAR(sum, 0.0, 1e-6) << r;
    }
  }
}

}  // namespace
}  // namespace recflow::train
