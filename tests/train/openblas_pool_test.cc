// Every executable that links recflow::train shuts OpenBLAS's idle thread
// pool down as it starts (train/openblas_pool.cc); this test is one.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sched.h>

#include <cstdlib>

#include "train/backend.h"

namespace recflow::train {
namespace {

int ThreadsNow() {
  int threads = 0;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++threads;
  }
  closedir(dir);
  return threads;
}

// Counted by this test's static initialisation: after the libraries'
// initialisers (OpenBLAS's starts its pool) and openblas_pool.cc's shut-down
// (a constructor of a higher priority), before main and any test.
const int threads_before_main = ThreadsNow();

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
  EXPECT_EQ(threads_before_main, 1)
      << "threads before main (OpenBLAS's pool?); OPENBLAS_NUM_THREADS="
      << (std::getenv("OPENBLAS_NUM_THREADS")
              ? std::getenv("OPENBLAS_NUM_THREADS")
              : "(unset)");
  // A backend's products then run on its own threads, and start none.
  const auto backend = MakeCpuBackend(1);
  std::vector<float> a(64 * 64, 1.0f), c(64 * 64);
  backend->Gemm(false, false, 64, 64, 64, 1.0f, a.data(), a.data(), 0.0f,
                c.data());
  EXPECT_EQ(c[0], 64.0f);
  EXPECT_EQ(ThreadsNow(), 1);
}

}  // namespace
}  // namespace recflow::train
