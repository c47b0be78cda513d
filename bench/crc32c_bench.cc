// crc32c throughput: the folding path (AVX-512 VPCLMULQDQ) and the
// three-lane crc32 path next to their baselines in the same run — one lane
// of the crc32 instruction, and the portable table loop — from 1 MiB
// buffers to short messages, and 32 messages singly, through ValueMany, and
// interleaved on the crc32 instruction alone.
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

// 1 MiB, a short record, a page, and the lengths around where folding
// starts to pay.
void Lengths(benchmark::internal::Benchmark* b) {
  for (int64_t n : {1 << 20, 100, 4096, 1024, 512, 256}) b->Arg(n);
}

template <uint32_t (*Fn)(uint32_t, const char*, size_t)>
void BM_Crc32c(benchmark::State& state) {
  if (Fn != crc32c::ExtendPortable && !crc32c::HardwareAvailable()) {
    state.SkipWithError("no SSE4.2");
    return;
  }
  if (Fn == crc32c::ExtendFold && !crc32c::FoldAvailable()) {
    state.SkipWithError("no AVX-512 VPCLMULQDQ");
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
    ->Apply(Lengths);
BENCHMARK_TEMPLATE(BM_Crc32c, crc32c::ExtendFold)
    ->Name("crc32c/fold")
    ->Apply(Lengths);
BENCHMARK_TEMPLATE(BM_Crc32c, crc32c::ExtendHardwareOneLane)
    ->Name("crc32c/one_lane_baseline")
    ->Apply(Lengths);
BENCHMARK_TEMPLATE(BM_Crc32c, crc32c::ExtendPortable)
    ->Name("crc32c/portable")
    ->Apply(Lengths);

// 32 messages of state.range(0) bytes: one at a time, and interleaved.
enum class Many { kOneAtATime, kValueMany, kInterleavedOnly };
void MessageLengths(benchmark::internal::Benchmark* b) {
  for (int64_t n : {100, 256, 512, 1000, 3200}) b->Arg(n);
}
void BM_ManyMessages(benchmark::State& state, Many how) {
  if (how != Many::kOneAtATime && !crc32c::HardwareAvailable()) {
    state.SkipWithError("no SSE4.2");
    return;
  }
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
    switch (how) {
      case Many::kOneAtATime:
        for (size_t i = 0; i < kCount; ++i) {
          out[i] = crc32c::Value(data[i], n);
        }
        break;
      case Many::kValueMany:
        crc32c::ValueMany(data, sizes, out, kCount);
        break;
      case Many::kInterleavedOnly:
        crc32c::ValueManyHardware(data, sizes, out, kCount);
        break;
    }
    benchmark::DoNotOptimize(out);
  }
  state.SetBytesProcessed(
      static_cast<int64_t>(state.iterations() * n * kCount));
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kCount));
}
BENCHMARK_CAPTURE(BM_ManyMessages, one_at_a_time, Many::kOneAtATime)
    ->Name("crc32c/32_messages_one_at_a_time")
    ->Apply(MessageLengths);
BENCHMARK_CAPTURE(BM_ManyMessages, value_many, Many::kValueMany)
    ->Name("crc32c/32_messages_value_many")
    ->Apply(MessageLengths);
BENCHMARK_CAPTURE(BM_ManyMessages, interleaved, Many::kInterleavedOnly)
    ->Name("crc32c/32_messages_interleaved_baseline")
    ->Apply(MessageLengths);

}  // namespace
