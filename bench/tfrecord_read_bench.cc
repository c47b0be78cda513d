// Sequential reads of an uncompressed TFRecord file from the page cache:
// records verified (both CRCs) and unverified, next to the baseline of
// plain read() calls over the same file in the same run.
//
// The files (256 MiB each) are written once to $TMPDIR/recflow-bench/.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <random>
#include <string>

#include "records/tfrecord_reader.h"
#include "records/tfrecord_writer.h"

namespace {

using namespace recflow::records;

constexpr uint64_t kFileBytes = uint64_t{256} << 20;

std::string BenchFile(size_t record_bytes) {
  const auto dir = std::filesystem::temp_directory_path() / "recflow-bench";
  std::filesystem::create_directories(dir);
  const std::string path =
      (dir / ("records-" + std::to_string(record_bytes) + ".tfrecord"))
          .string();
  if (std::filesystem::exists(path)) return path;
  std::mt19937_64 rng(1);
  std::string record(record_bytes, '\0');
  for (auto& c : record) c = static_cast<char>(rng());
  TFRecordWriter writer(path);
  for (uint64_t n = 0; n < kFileBytes; n += record_bytes + 16) {
    record[n % record_bytes] ^= 1;
    writer.Write(record);
  }
  writer.Close();
  return path;
}

// Baseline: read() of the whole file into a buffer of the reader's size.
void BM_PlainRead(benchmark::State& state) {
  const std::string path = BenchFile(static_cast<size_t>(state.range(0)));
  std::unique_ptr<char[]> buffer(new char[1 << 20]);
  uint64_t bytes = 0;
  for (auto _ : state) {
    const int fd = open(path.c_str(), O_RDONLY);
    ssize_t n;
    while ((n = read(fd, buffer.get(), 1 << 20)) > 0) bytes += n;
    close(fd);
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}

void BM_ReadRecords(benchmark::State& state, bool verify) {
  const size_t record_bytes = static_cast<size_t>(state.range(0));
  const std::string path = BenchFile(record_bytes);
  uint64_t bytes = 0, records = 0;
  ReaderOptions options;
  options.verify_checksums = verify;
  for (auto _ : state) {
    TFRecordReader reader(path, options);
    std::string_view record;
    while (reader.ReadRecord(&record)) {
      benchmark::DoNotOptimize(record.data());
      ++records;
    }
    bytes += reader.stats().stream_bytes;
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.SetItemsProcessed(static_cast<int64_t>(records));
}

BENCHMARK(BM_PlainRead)
    ->Name("read/plain_read_baseline")
    ->Arg(100)
    ->Arg(1024)
    ->Arg(102400)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_ReadRecords, verified, true)
    ->Name("read/records_verified")
    ->Arg(100)
    ->Arg(1024)
    ->Arg(102400)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_ReadRecords, unverified, false)
    ->Name("read/records_unverified")
    ->Arg(100)
    ->Arg(1024)
    ->Arg(102400)
    ->Unit(benchmark::kMillisecond);

}  // namespace
