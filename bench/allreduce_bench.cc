// The gradient all-reduce alone, as data-parallel training runs it
// (Collective::AllReduce over MPI, float32 sum, in place), for gradient
// sizes from 1 K to 16 M parameters.  Run under mpirun:
//
//   mpirun -np 2 build/bench/allreduce_bench [REPEATS]
//
// Prints, on rank 0, per size: the median time of REPEATS all-reduces (each
// preceded by a barrier, so every rank starts together), the bytes each
// rank sends in a ring all-reduce (2 (N-1)/N x the gradient's bytes) and
// the bandwidth that implies.  A plain program rather than Google
// Benchmark: every rank must run exactly the same number of iterations,
// which Benchmark's adaptive iteration counts do not promise.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <vector>

#include "train/collective.h"

int main(int argc, char** argv) {
  using recflow::train::ReduceOp;
  auto world = recflow::train::MpiWorld();
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 50;
  const int n = world->size();
  if (world->is_chief()) {
    fmt::print("{} ranks, {} all-reduces per size (median)\n", n, repeats);
    fmt::print("{:>12} {:>10} {:>12} {:>14} {:>12}\n", "parameters", "MB", "us",
               "ring MB/rank", "GB/s");
  }
  for (int64_t params = 1024; params <= (int64_t{1} << 24); params *= 4) {
    std::vector<float> g(static_cast<size_t>(params), 1.0f);
    std::vector<double> us;
    for (int r = 0; r < repeats + 2; ++r) {
      world->Barrier();
      const auto t0 = std::chrono::steady_clock::now();
      world->AllReduce(std::span(g), ReduceOp::kSum);
      const auto t1 = std::chrono::steady_clock::now();
      if (r >= 2) {
        us.push_back(
            std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
      std::fill(g.begin(), g.end(), 1.0f);
    }
    std::sort(us.begin(), us.end());
    const double median = us[us.size() / 2];
    const double mb = params * 4.0 / 1e6;
    const double ring = 2.0 * (n - 1) / n * mb;
    if (world->is_chief()) {
      fmt::print("{:>12} {:>10.3f} {:>12.1f} {:>14.3f} {:>12.2f}\n", params, mb,
                 median, ring, ring / 1e3 / (median / 1e6));
    }
  }
  return 0;
}
