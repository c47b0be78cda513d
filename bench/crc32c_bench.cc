// crc32c throughput: the three-lane hardware path next to its baselines in
// the same run — one lane of the same instruction, and the portable table
// loop — on 1 MiB buffers, and short messages singly and interleaved.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "records/crc32c.h"

namespace {

using namespace recflow::records;

std::vector<char> RandomBuffer(size_t n) {
  std::vector<char> v(n);
  std::mt19937_64 rng(1);
  for (auto& c : v) c = static_cast<char>(rng());
  return v;
}

template <uint32_t (*Fn)(uint32_t, const char*, size_t)>
void BM_Crc32c(benchmark::State& state) {
  if (Fn != crc32c::ExtendPortable && !crc32c::HardwareAvailable()) {
    state.SkipWithError("no SSE4.2");
    return;
  }
  const auto buffer = RandomBuffer(static_cast<size_t>(state.range(0)));
  for (auto _ : state) {
    benchmark::DoNotOptimize(Fn(0, buffer.data(), buffer.size()));
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          state.range(0));
}
BENCHMARK_TEMPLATE(BM_Crc32c, crc32c::ExtendHardware)
    ->Name("crc32c/three_lanes")
    ->Arg(1 << 20)
    ->Arg(100)
    ->Arg(4096);
BENCHMARK_TEMPLATE(BM_Crc32c, crc32c::ExtendHardwareOneLane)
    ->Name("crc32c/one_lane_baseline")
    ->Arg(1 << 20)
    ->Arg(100)
    ->Arg(4096);
BENCHMARK_TEMPLATE(BM_Crc32c, crc32c::ExtendPortable)
    ->Name("crc32c/portable")
    ->Arg(1 << 20)
    ->Arg(100)
    ->Arg(4096);

// 32 messages of state.range(0) bytes: one at a time, and interleaved.
void BM_ManyMessages(benchmark::State& state, bool interleaved) {
  const size_t n = static_cast<size_t>(state.range(0));
  constexpr size_t kCount = 32;
  const auto buffer = RandomBuffer(n * kCount + 64);
  const char* data[kCount];
  size_t sizes[kCount];
  uint32_t out[kCount];
  for (size_t i = 0; i < kCount; ++i) {
    data[i] = buffer.data() + i * (n + 1) % (buffer.size() - n);
    sizes[i] = n;
  }
  for (auto _ : state) {
    if (interleaved) {
      crc32c::ValueMany(data, sizes, out, kCount);
    } else {
      for (size_t i = 0; i < kCount; ++i) out[i] = crc32c::Value(data[i], n);
    }
    benchmark::DoNotOptimize(out);
  }
  state.SetBytesProcessed(
      static_cast<int64_t>(state.iterations() * n * kCount));
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kCount));
}
BENCHMARK_CAPTURE(BM_ManyMessages, one_at_a_time, false)
    ->Name("crc32c/32_messages_one_at_a_time")
    ->Arg(100)
    ->Arg(1000);
BENCHMARK_CAPTURE(BM_ManyMessages, interleaved, true)
    ->Name("crc32c/32_messages_interleaved")
    ->Arg(100)
    ->Arg(1000);

}  // namespace
