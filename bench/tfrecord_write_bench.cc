// Write throughput per compression and level (1 KiB records of text-like
// bytes, to a file in $TMPDIR), next to the baseline of write()ing the same
// framed bytes; ZSTD also with its frames compressed on every core
// (WriterOptions::compression_threads), next to one thread.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "records/tfrecord_writer.h"

namespace {

using namespace recflow::records;

constexpr size_t kRecords = 16384;
constexpr size_t kRecordBytes = 1024;

// Compressible like real serialized Examples: words and small numbers.
const std::vector<std::string>& Records() {
  static const std::vector<std::string> records = [] {
    std::mt19937_64 rng(3);
    static const char* kWords[] = {"image", "label", "feature", "float",
                                   "int64", "bytes", "train",   "42",
                                   "0.125", "class", "text",    "shard"};
    std::vector<std::string> out(kRecords);
    for (auto& r : out) {
      while (r.size() < kRecordBytes) {
        r += kWords[rng() % 12];
        r += static_cast<char>(rng() % 4 == 0 ? rng() : ' ');
      }
      r.resize(kRecordBytes);
    }
    return out;
  }();
  return records;
}

std::string OutPath() {
  return (std::filesystem::temp_directory_path() / "recflow-write-bench")
      .string();
}

// Args: level (0: the codec's default), compression threads.
void BM_Write(benchmark::State& state, Compression c) {
  const auto& records = Records();
  const int level = static_cast<int>(state.range(0));
  const int threads = static_cast<int>(state.range(1));
  for (auto _ : state) {
    TFRecordWriter writer(OutPath(), {.compression = c,
                                      .level = level,
                                      .atomic = false,
                                      .compression_threads = threads});
    for (const auto& r : records) writer.Write(r);
    writer.Close();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kRecords *
                                               (kRecordBytes + 16)));
  state.counters["ratio"] =
      static_cast<double>(kRecords * (kRecordBytes + 16)) /
      static_cast<double>(std::filesystem::file_size(OutPath()));
}
BENCHMARK_CAPTURE(BM_Write, none, Compression::kNone)
    ->Name("write/none")
    ->ArgNames({"level", "threads"})
    ->Args({0, 1});
BENCHMARK_CAPTURE(BM_Write, zlib, Compression::kZlib)
    ->Name("write/zlib")
    ->ArgNames({"level", "threads"})
    ->Args({0, 1});
BENCHMARK_CAPTURE(BM_Write, gzip, Compression::kGzip)
    ->Name("write/gzip")
    ->ArgNames({"level", "threads"})
    ->ArgsProduct({{1, 6, 9}, {1}});
// Wall time: the threaded writer's work is on its workers.
BENCHMARK_CAPTURE(BM_Write, zstd, Compression::kZstd)
    ->Name("write/zstd")
    ->ArgNames({"level", "threads"})
    ->ArgsProduct({{1, 3, 9, 19},
                   {1, std::max(2, static_cast<int>(
                                       std::thread::hardware_concurrency()))}})
    ->UseRealTime();

// Baseline: the same number of bytes through write() in 1 MiB calls.
void BM_PlainWrite(benchmark::State& state) {
  const std::string block(1 << 20, 'x');
  const size_t total = kRecords * (kRecordBytes + 16);
  for (auto _ : state) {
    const int fd = open(OutPath().c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    for (size_t done = 0; done < total; done += block.size()) {
      benchmark::DoNotOptimize(
          write(fd, block.data(), std::min(block.size(), total - done)));
    }
    close(fd);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * total));
}
BENCHMARK(BM_PlainWrite)->Name("write/plain_write_baseline");

}  // namespace
