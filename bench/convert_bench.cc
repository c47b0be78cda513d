// Conversion benchmarks (convert::Convert, as `recflow convert` runs it),
// each format next to its baselines in the same run:
//
//   Convert/format:F   the same 200,000 rows as CSV (F = 0) and as JSON
//                      Lines (F = 1) into 2 shards, the same Examples:
//                      records/s of the whole job, its typing pass
//                      included (a row: an int64 id, a float, a short
//                      string, an int64 label and a constant string)
//   Lines/format:F     the same files' lines read alone
//                      (records::ByteReader::GetLine), the reading floor
//
// The files are written once to $TMPDIR/recflow-convert-bench/ (made if
// missing) and the shards there too, each run over the last's.
//
//   build/bench/convert_bench --benchmark_repetitions=5
//   (add --benchmark_report_aggregates_only=true for medians alone)
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <utility>

#include "convert/convert.h"
#include "records/file.h"
#include "records/input_stream.h"

namespace {

using namespace recflow;

constexpr int kRows = 200000;

std::filesystem::path Dir() {
  const char* tmp = std::getenv("TMPDIR");
  const std::filesystem::path dir =
      std::filesystem::path(tmp != nullptr ? tmp : "/tmp") /
      "recflow-convert-bench";
  std::filesystem::create_directories(dir);
  return dir;
}

// The input of `format` (0: CSV, 1: JSON Lines), written on first use.
const std::string& Input(int format) {
  static const std::array<std::string, 2> paths = [] {
    const std::filesystem::path dir = Dir();
    const std::string csv = (dir / "rows.csv").string();
    const std::string jsonl = (dir / "rows.jsonl").string();
    std::mt19937_64 rng(1);
    std::string c = "id,x,name,label,s\n", j;
    for (int i = 0; i < kRows; ++i) {
      const double x = static_cast<double>(rng() >> 11) / 0x1p53;
      const int label = static_cast<int>(rng() % 10);
      c += fmt::format("{},{:.17g},n{},{},abc\n", i, x, i, label);
      j += fmt::format(
          "{{\"id\": {}, \"x\": {:.17g}, \"name\": \"n{}\", \"label\": {}, "
          "\"s\": \"abc\"}}\n",
          i, x, i, label);
    }
    // Through the atomic writer: an error (a full disk) is thrown, naming
    // the file, and never leaves a part of the input to be timed.
    for (const auto& [path, text] : {std::pair{&csv, &c}, {&jsonl, &j}}) {
      records::WritableFile f(*path, /*atomic=*/true);
      f.Append(*text);
      f.Close();
    }
    return std::array<std::string, 2>{csv, jsonl};
  }();
  return paths[format];
}

void BM_Convert(benchmark::State& state) {
  const int format = static_cast<int>(state.range(0));
  convert::ConvertJob job;
  job.format = format == 0 ? "csv" : "jsonl";
  job.inputs.files = {Input(format)};
  job.output = (Dir() / ("out-" + job.format)).string();
  job.shards = 2;
  uint64_t records = 0;
  for (auto _ : state) {
    const convert::ConvertSummary s = convert::Convert(job);
    if (s.records != kRows) {
      state.SkipWithError("a row was lost");
      return;
    }
    records += s.records;
  }
  state.counters["records/s"] = benchmark::Counter(static_cast<double>(records),
                                                   benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Convert)
    ->ArgName("format")
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_Lines(benchmark::State& state) {
  const std::string& path = Input(static_cast<int>(state.range(0)));
  uint64_t lines = 0, bytes = 0;
  std::string line;
  for (auto _ : state) {
    records::ByteReader in(path);
    while (in.GetLine(&line)) {
      ++lines;
      bytes += line.size() + 1;
    }
  }
  state.counters["lines/s"] = benchmark::Counter(static_cast<double>(lines),
                                                 benchmark::Counter::kIsRate);
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}
BENCHMARK(BM_Lines)
    ->ArgName("format")
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
