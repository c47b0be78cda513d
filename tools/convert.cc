// recflow convert: the command over recflow::convert (convert/convert.h):
// its options, the progress line, and the summary it prints.
#include "convert/convert.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "records/csv_reader.h"
#include "tools/cli.h"

namespace recflow::tools {
namespace {

using convert::ConvertJob;
using convert::ConvertProgress;
using convert::ConvertSummary;

struct ConvertOptions {
  std::string format;
  std::vector<std::string> inputs;
  std::string output;
  uint64_t shards = 1;
  std::string compression = "none";
  int level = 0;  // 0: the codec's default
  bool index = false;
  std::string spec;
  std::string delimiter;  // csv; empty: a comma
  bool skip_bad = false;
  uint64_t max_record_bytes = records::kDefaultMaxRecordBytes;
  uint64_t max_row_bytes = records::kDefaultMaxRowBytes;  // csv, jsonl
  std::string images, labels;
  int threads = 0;
  bool json = false;
};

// The progress line, on a terminal only: records, MB/s of input, ETA; for
// the typing pass of CSV and JSON Lines (every row read once before any
// is converted), rows typed, its own rate and the ETA of that pass.
class Progress {
 public:
  Progress() : tty_(isatty(STDERR_FILENO) == 1) {}
  ~Progress() { Finish(); }
  void Update(const ConvertProgress& p) {
    if (!tty_) return;
    const auto now = std::chrono::steady_clock::now();
    if (typing_ && !p.typing) {  // the conversion starts: its own rate
      typing_ = false;
      start_ = now;
    }
    if (now - last_ < std::chrono::milliseconds(250)) return;
    last_ = now;
    const double s = std::chrono::duration<double>(now - start_).count();
    const double done = static_cast<double>(p.bytes_read);
    const double total = static_cast<double>(p.total_bytes);
    const double rate = s > 0 ? done / s : 0;
    std::string eta = "-";
    if (rate > 0 && total > done)
      eta = fmt::format("{:.0f} s", (total - done) / rate);
    fmt::print(stderr, "\r{:>12} {}  {:>8.1f} MB/s  ETA {:<8}", p.records,
               p.typing ? "rows typed" : "records   ", rate / 1e6, eta);
  }
  void Finish() {
    if (tty_ && last_ != std::chrono::steady_clock::time_point{}) {
      fmt::print(stderr, "\r{:60}\r", "");
      last_ = {};
    }
  }

 private:
  const bool tty_;
  bool typing_ = true;  // until the first report that is not the typing's
  std::chrono::steady_clock::time_point start_ =
      std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_{};
};

// One byte, or "tab" / "\t" for a tab (a shell passes "\t" as two).
char DelimiterArg(const std::string& text) {
  const char c = text == "tab" || text == "\\t" ? '\t' : text[0];
  if (text.size() != 1 && c != '\t') {
    throw UsageError(
        fmt::format("--delimiter '{}': expected one character (or tab)", text));
  }
  try {
    records::CheckCsvDelimiter(c);
  } catch (const records::Error& e) {
    throw UsageError(fmt::format("--delimiter: {}", e.what()));
  }
  return c;
}

int RunConvert(const ConvertOptions& o) {
  if (std::find(std::begin(convert::kFormats), std::end(convert::kFormats),
                o.format) == std::end(convert::kFormats)) {
    throw UsageError(
        fmt::format("unknown format '{}': expected csv, jsonl, "
                    "npy, npz, idx or images",
                    o.format));
  }
  std::vector<std::string> paths = o.inputs;
  for (const std::string* p : {&o.images, &o.labels}) {
    if (!p->empty()) paths.push_back(*p);
  }
  for (const std::string& path : paths) {
    if (!std::filesystem::exists(path)) {
      throw UsageError(fmt::format("{}: no such file or directory", path));
    }
  }
  CheckEachFileOnce(o.inputs, "convert would convert its rows twice");
  // ZSTD frames are compressed on the cores the writer threads leave
  // (ConvertJob::compression_threads).
  const records::WriterOptions writer =
      ShardWriterOptions(o.output, o.shards, o.compression, o.index, o.level);
  std::optional<records::FeatureSpec> spec;
  if (!o.spec.empty()) spec = records::FeatureSpec::FromFile(o.spec);
  ConvertJob job;
  job.format = o.format;
  job.inputs = {o.inputs, o.images, o.labels, spec ? &*spec : nullptr};
  if (!o.delimiter.empty()) {
    if (o.format != "csv") {
      throw UsageError(fmt::format("--delimiter is for csv, not {}", o.format));
    }
    job.inputs.delimiter = DelimiterArg(o.delimiter);
  }
  if (o.max_row_bytes != records::kDefaultMaxRowBytes) {
    if (o.format != "csv" && o.format != "jsonl") {
      throw UsageError(fmt::format(
          "--max-row-bytes is for csv and jsonl, not {}", o.format));
    }
    job.inputs.max_row_bytes = o.max_row_bytes;
  }
  job.output = o.output;
  job.shards = o.shards;
  job.writer = writer;
  job.threads = o.threads;
  job.skip_bad = o.skip_bad;
  job.max_record_bytes = o.max_record_bytes;
  Progress progress;
  job.progress = [&](const ConvertProgress& p) { progress.Update(p); };
  const ConvertSummary s = convert::Convert(job);
  progress.Finish();
  const double rate = s.seconds > 0 ? s.records / s.seconds : 0;
  if (o.json) {
    nlohmann::json shards = nlohmann::json::array();
    for (const auto& shard : s.shards) {
      shards.push_back({{"path", shard.path},
                        {"records", shard.records},
                        {"bytes", shard.bytes}});
    }
    fmt::print("{}\n", nlohmann::json{{"records", s.records},
                                      {"skipped", s.skipped},
                                      {"bytes", s.bytes},
                                      {"seconds", s.seconds},
                                      {"records_per_s", rate},
                                      {"shards", shards},
                                      {"warnings", s.warnings}}
                           .dump());
  } else {
    fmt::print(
        "converted {} record{} ({}) into {} shard{}, {} bytes ({}), in "
        "{:.2f} s ({:.0f} records/s)\n",
        s.records, s.records == 1 ? "" : "s", o.format, o.shards,
        o.shards == 1 ? "" : "s", s.bytes,
        records::CompressionName(writer.compression), s.seconds, rate);
    fmt::print("  {}\n", s.shards.front().path);
    if (o.shards > 1) fmt::print("  ...\n  {}\n", s.shards.back().path);
    if (!s.labels_file.empty()) fmt::print("  {}\n", s.labels_file);
  }
  for (const std::string& w : s.warnings) {
    fmt::print(stderr, "recflow: warning: {}\n", w);
  }
  if (s.skipped > 0) {
    fmt::print(stderr, "recflow: skipped {} bad rows; the first: {}\n",
               s.skipped, s.first_skipped);
  }
  return kExitOk;
}

}  // namespace

Runner AddConvertCommand(CLI::App& app) {
  auto o = std::make_shared<ConvertOptions>();
  app.add_option("FORMAT", o->format, "csv, jsonl, npy, npz, idx or images")
      ->required();
  app.add_option("INPUT", o->inputs,
                 "input files (csv, jsonl, npy: one or more; npz: one; "
                 "images: one directory with a subfolder per class)");
  app.add_option("--output,-o", o->output,
                 "output prefix: PREFIX-00000-of-0000N.tfrecord[.zz|.gz|.zst]")
      ->required();
  app.add_option("--shards,-n", o->shards, "number of shards")
      ->capture_default_str();
  app.add_option("--compression", o->compression,
                 "none, zlib, gzip (TensorFlow reads these) or zstd "
                 "(recflow only)")
      ->capture_default_str();
  app.add_option("--compression-level", o->level,
                 "gzip, zlib: 1 (fastest) to 9 (smallest), default 6; zstd: "
                 "1 to 19, default 3 (ZSTD frames are compressed on the cores "
                 "the shard writers leave)");
  app.add_flag("--index", o->index, "write FILE.idx beside every shard");
  app.add_option("--spec", o->spec,
                 "FeatureSpec JSON giving the dtype of csv columns or jsonl "
                 "keys (others are inferred)");
  app.add_option("--delimiter", o->delimiter,
                 "csv: the field delimiter, one character or tab (default: "
                 "a comma)");
  app.add_flag("--skip-bad", o->skip_bad,
               "skip rows that cannot be converted, and count them");
  app.add_option("--max-record-bytes", o->max_record_bytes,
                 "a row whose record (its serialized Example) is longer is a "
                 "bad row: readers refuse longer records by default")
      ->check(Positive())
      ->capture_default_str();
  app.add_option("--max-row-bytes", o->max_row_bytes,
                 "csv, jsonl: a row (a CSV record's cells and delimiters, a "
                 "JSON line) that is longer ends the conversion with an error, "
                 "the file read no further (a quote never closed, or no line "
                 "ends)")
      ->check(Positive())
      ->capture_default_str();
  app.add_option("--images", o->images, "idx: the images file (.gz or not)");
  app.add_option("--labels", o->labels, "idx: the labels file (.gz or not)");
  app.add_option("--threads", o->threads, "writer threads (0: one per core)")
      ->check(NonNegative());
  app.add_flag("--json", o->json, "print one JSON object as the last line");
  app.footer(
      "Features: csv: one per column (header row; int64, float or bytes "
      "inferred from all cells; an empty cell leaves the feature out of "
      "that record). jsonl: one per key (numbers, strings, booleans and "
      "lists of one of them; null leaves it out). npy/npz: one per array, "
      "named after the file or member, one Example per row of the first "
      "axis. idx: image (raw bytes), label, height, width. images: "
      "image/encoded, image/format, image/height, image/width, "
      "image/class/label, image/class/text, image/filename, and "
      "PREFIX-labels.txt. Shards are balanced to within 256 records "
      "(chunks go round-robin). Exit status 1 for bad input (the error "
      "names the file and line or row), 2 for usage or I/O errors.");
  return [o] { return RunConvert(*o); };
}

}  // namespace recflow::tools
