// Internal to train/ (not installed): which kernels OpenBLAS runs.
//
// OpenBLAS (Debian 12's 0.3.21, a DYNAMIC_ARCH build) picks its kernels
// for the CPU it detects as it loads.  On a CPU it does not recognise it
// can fall back to its generic x86-64 kernels ("Prescott": SSE3, no AVX),
// and it did on the 16-core Intel Xeon of the machine lent with the GPU
// (2026-11-26: `cpu_backend: ... OpenBLAS 0.3.21 Prescott`, on a CPU with
// AVX-512).  Those kernels cost 2.7x the DNN's step and 2.3x the CNN's on
// this project's AVX-512 VM (OPENBLAS_CORETYPE=Prescott against the
// Cooperlake it detects; docs/PERFORMANCE.md).  So every recflow program
// (train/openblas_pool.cc, before main) checks what OpenBLAS chose, and
// where a CPU with AVX got a core without it, chooses from the CPU's own
// features, as OPENBLAS_CORETYPE would have.  A user's OPENBLAS_CORETYPE
// is left as it is.
//
// Thread safety: SelectCore and UpgradeGenericCore change what every BLAS
// call runs: only while no thread makes one (before main).  The rest may
// be called from any thread.
#ifndef RECFLOW_TRAIN_OPENBLAS_CORE_H_
#define RECFLOW_TRAIN_OPENBLAS_CORE_H_

#include <string>
#include <string_view>

namespace recflow::train::openblas {

// What the CPU runs, as far as OpenBLAS's x86-64 kernels care.
struct CpuFeatures {
  bool avx = false;
  bool avx2 = false;
  bool fma = false;
  // SkylakeX's kernels use AVX-512 F, CD, BW, DQ and VL.
  bool avx512 = false;
  static CpuFeatures OfThisCpu();
};

// The core OpenBLAS should run instead of `detected` (openblas_get_corename)
// on a CPU with `cpu`'s features: empty when `detected` is fine.  Only a
// core without AVX on a CPU with AVX is replaced, by the newest of
// "SkylakeX", "Haswell" and "Sandybridge" the CPU runs.
std::string BetterCore(std::string_view detected, const CpuFeatures& cpu);

// The core OpenBLAS runs now.
std::string CurrentCore();

// Selects OpenBLAS's kernels anew, as OPENBLAS_CORETYPE=`name` at load
// would have (empty: as OpenBLAS detects them).  False when this OpenBLAS
// cannot (not a DYNAMIC_ARCH build).  A name OpenBLAS does not know gets
// what it detects from the CPU's features.
bool SelectCore(const std::string& name);

// BetterCore of what OpenBLAS chose, selected, unless OPENBLAS_CORETYPE is
// set: the core now run when it changed, else empty.
std::string UpgradeGenericCore();

}  // namespace recflow::train::openblas

#endif  // RECFLOW_TRAIN_OPENBLAS_CORE_H_
