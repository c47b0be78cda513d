#include "train/openblas_core.h"

#include <cblas.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <optional>

// OpenBLAS's kernel selection (driver/others/dynamic.c), exported by its
// DYNAMIC_ARCH builds only: weak, so that another build links and keeps
// what it has.
extern "C" {
void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));
}

namespace recflow::train::openblas {

CpuFeatures CpuFeatures::OfThisCpu() {
  CpuFeatures f;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  f.avx = __builtin_cpu_supports("avx");
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.avx512 =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
      __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#endif
  return f;
}

std::string BetterCore(std::string_view detected, const CpuFeatures& cpu) {
  // OpenBLAS's x86-64 cores from before AVX (its corename strings).
  constexpr std::array<std::string_view, 16> kBeforeAvx = {
      "Katmai",       "Coppermine", "Northwood", "Prescott",
      "Banias",       "Atom",       "Core2",     "Penryn",
      "Dunnington",   "Nehalem",    "Athlon",    "Opteron",
      "Opteron_SSE3", "Barcelona",  "Nano",      "Bobcat"};
  if (std::ranges::find(kBeforeAvx, detected) == kBeforeAvx.end()) return "";
  if (cpu.avx512 && cpu.avx2 && cpu.fma) return "SkylakeX";
  if (cpu.avx2 && cpu.fma) return "Haswell";
  if (cpu.avx) return "Sandybridge";
  return "";
}

std::string CurrentCore() {
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "";
}

bool SelectCore(const std::string& name) {
  if (gotoblas_dynamic_init == nullptr || gotoblas_dynamic_quit == nullptr) {
    return false;
  }
  // OpenBLAS reads OPENBLAS_CORETYPE as it selects: set for the call, then
  // as it was.
  const char* was = std::getenv("OPENBLAS_CORETYPE");
  const std::optional<std::string> before =
      was != nullptr ? std::optional<std::string>(was) : std::nullopt;
  if (name.empty()) {
    unsetenv("OPENBLAS_CORETYPE");
  } else {
    setenv("OPENBLAS_CORETYPE", name.c_str(), 1);
  }
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  if (before) {
    setenv("OPENBLAS_CORETYPE", before->c_str(), 1);
  } else {
    unsetenv("OPENBLAS_CORETYPE");
  }
  return true;
}

std::string UpgradeGenericCore() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return "";
  const std::string better =
      BetterCore(CurrentCore(), CpuFeatures::OfThisCpu());
  if (better.empty() || !SelectCore(better)) return "";
  return CurrentCore() == better ? better : "";
}

}  // namespace recflow::train::openblas
