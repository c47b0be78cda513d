// Every executable that links recflow::train shuts OpenBLAS's idle thread
// pool down as it starts (train/openblas_pool.cc); this test is one.
#include <gtest/gtest.h>
#include <sched.h>

#include <cstdlib>

#include "test_util.h"
#include "train/backend.h"
#include "train/openblas_core.h"

namespace recflow::train {
namespace {

// Counted by this test's static initialisation: after the libraries'
// initialisers (OpenBLAS's starts its pool) and openblas_pool.cc's shut-down
// (a constructor of a higher priority), before main and any test.
const size_t threads_before_main = testing::ThreadsNow();

TEST(OpenBlasPoolTest, NoOpenBlasThreadsAreLeftRunning) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer's runtime starts a thread of its own, so "
                  "the count says nothing about OpenBLAS's";
#endif
  cpu_set_t cpus;
  ASSERT_EQ(sched_getaffinity(0, sizeof(cpus), &cpus), 0);
  if (CPU_COUNT(&cpus) < 2) {
    GTEST_SKIP() << "one core: OpenBLAS starts no pool, so the count cannot "
                    "tell";
  }
  // Its pthread build starts one thread for every core but one (unless
  // OPENBLAS_NUM_THREADS says 1), each spinning for ~0.1 s.
  EXPECT_EQ(testing::ThreadsOnceExitsSettle(1), 1u)
      << threads_before_main
      << " threads before main, and still more than this one after 5 s "
         "(OpenBLAS's pool?); "
         "OPENBLAS_NUM_THREADS="
      << (std::getenv("OPENBLAS_NUM_THREADS")
              ? std::getenv("OPENBLAS_NUM_THREADS")
              : "(unset)");
  // A backend's products then run on its own threads, and start none.
  const auto backend = MakeCpuBackend(1);
  std::vector<float> a(64 * 64, 1.0f), c(64 * 64);
  backend->Gemm(false, false, 64, 64, 64, 1.0f, a.data(), a.data(), 0.0f,
                c.data());
  EXPECT_EQ(c[0], 64.0f);
  EXPECT_EQ(testing::ThreadsNow(), 1u);
}

// Only a core without AVX on a CPU with AVX is replaced, by the newest
// the CPU runs.
TEST(OpenBlasCoreTest, GenericCoresOnCpusWithAvxGetBetterOnes) {
  using openblas::BetterCore;
  using openblas::CpuFeatures;
  const CpuFeatures avx512{
      .avx = true, .avx2 = true, .fma = true, .avx512 = true};
  const CpuFeatures avx2{.avx = true, .avx2 = true, .fma = true};
  const CpuFeatures avx{.avx = true};
  const CpuFeatures sse{};
  EXPECT_EQ(BetterCore("Prescott", avx512), "SkylakeX");
  EXPECT_EQ(BetterCore("Nehalem", avx512), "SkylakeX");
  EXPECT_EQ(BetterCore("Prescott", avx2), "Haswell");
  EXPECT_EQ(BetterCore("Core2", avx), "Sandybridge");
  EXPECT_EQ(BetterCore("Prescott", sse), "");
  // AVX2 without FMA (no Haswell kernels there): AVX's.
  EXPECT_EQ(BetterCore("Prescott", CpuFeatures{.avx = true, .avx2 = true}),
            "Sandybridge");
  // Cores OpenBLAS chose with AVX stay, whatever the CPU has.
  for (const char* core : {"Cooperlake", "SkylakeX", "Haswell", "Zen",
                           "Sandybridge", "SapphireRapids"}) {
    EXPECT_EQ(BetterCore(core, avx512), "") << core;
  }
}

// The selection runs live: a generic core chosen on purpose is replaced by
// the upgrade, and the products stay right with every core.
TEST(OpenBlasCoreTest, AGenericCoreIsUpgradedAndProductsStayRight) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) {
    GTEST_SKIP() << "OPENBLAS_CORETYPE is set: the upgrade leaves it be";
  }
  const std::string want =
      openblas::BetterCore("Prescott", openblas::CpuFeatures::OfThisCpu());
  if (want.empty()) GTEST_SKIP() << "this CPU has no AVX";
  const std::string detected = openblas::CurrentCore();
  if (!openblas::SelectCore("Prescott")) {
    GTEST_SKIP() << "this OpenBLAS is not a DYNAMIC_ARCH build";
  }
  ASSERT_EQ(openblas::CurrentCore(), "Prescott");
  EXPECT_EQ(std::getenv("OPENBLAS_CORETYPE"), nullptr)
      << "the variable is left as it was";
  const auto product = [] {
    const auto backend = MakeCpuBackend(1);
    constexpr int64_t kM = 37, kN = 53, kK = 71;
    std::vector<float> a(kM * kK), b(kK * kN), c(kM * kN);
    for (size_t i = 0; i < a.size(); ++i) a[i] = float(i % 7) - 3.0f;
    for (size_t i = 0; i < b.size(); ++i) b[i] = float(i % 5) - 2.0f;
    backend->Gemm(false, false, kM, kN, kK, 1.0f, a.data(), b.data(), 0.0f,
                  c.data());
    float worst = 0;
    for (int64_t i = 0; i < kM; ++i) {
      for (int64_t j = 0; j < kN; ++j) {
        float want = 0;
        for (int64_t p = 0; p < kK; ++p) want += a[i * kK + p] * b[p * kN + j];
        worst = std::max(worst, std::abs(c[i * kN + j] - want));
      }
    }
    return worst;
  };
  EXPECT_EQ(product(), 0.0f) << "small integers: exact with any kernels";
  EXPECT_EQ(openblas::UpgradeGenericCore(), want);
  EXPECT_EQ(openblas::CurrentCore(), want);
  EXPECT_EQ(product(), 0.0f);
  // Back to what this process ran before (by name: what OpenBLAS
  // detected, or the upgrade this program made as it started).
  ASSERT_TRUE(openblas::SelectCore(detected));
  EXPECT_EQ(openblas::CurrentCore(), detected);
}

}  // namespace
}  // namespace recflow::train
