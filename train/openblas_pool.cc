// Compiled into every executable that links recflow_train (CMake adds it
// to their sources), not into the library: a program that loads recflow
// as a library (the Python module) may use the same OpenBLAS for its own
// products (Debian's numpy does, through libblas.so.3), and keeps its pool
// and thread count until it makes a CPU backend (cpu_backend.cc sets one
// thread then, as before).
//
// OpenBLAS's pthread build starts a server thread for every core but one
// as it loads, and each waits for work spinning on sched_yield for 2^28
// cycles (~0.1 s) before it sleeps.  The CPU backend never gives them work
// (it calls OpenBLAS with one thread from each of its team's threads), so
// every recflow program spent its first tenth of a second with a spinning
// thread on each other core: a tenth of a CPU-second of a 0.27 CPU-second
// `recflow bench` here, 15 such threads on 16 cores
// (docs/PERFORMANCE.md).  Setting one thread stops none already started;
// so once the libraries are loaded (a constructor of the executable runs
// after the libraries' own), OpenBLAS gets one thread and its pool is
// shut down with blas_thread_shutdown_, what OpenBLAS runs itself before a
// fork.  It is looked up weakly: a build without it (the sequential one)
// keeps what it has.  A pool shut down is started again by any later
// openblas_set_num_threads, which recflow's code then no longer calls
// (it asks only when the count is not already one).

// The same constructor then checks the kernels OpenBLAS chose for this
// CPU, and chooses better ones where it fell back to its generic x86-64
// kernels on a CPU with AVX (train/openblas_core.h says why).

#include "train/openblas_core.h"

// OpenBLAS's own functions, declared here: the executable that compiles
// this file does not see the library's include directory (cblas.h, private
// to recflow_train), only links it.
extern "C" {
int openblas_get_num_threads(void);
void openblas_set_num_threads(int threads);
int blas_thread_shutdown_(void) __attribute__((weak));
}

namespace {

// Priority 200: before the program's own static initialisers (default
// priority), which may time or count threads (openblas_pool_test.cc).
__attribute__((constructor(200))) void PrepareOpenBlas() {
  if (blas_thread_shutdown_ != nullptr) {
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
    blas_thread_shutdown_();
  }
  // No thread makes a BLAS call yet.
  recflow::train::openblas::UpgradeGenericCore();
}

}  // namespace
