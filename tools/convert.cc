// recflow convert: users' datasets into sharded TFRecords of tf.Example.
//
// One thread reads the input in chunks of rows; the cores build them into
// Examples; chunk j goes, in input order, to shard j mod N, and writer
// threads (up to one per core) frame, compress and write the shards side by
// side.  Every shard is written under a
// temporary name and all appear together at the end, or none does.
#include <fmt/format.h>
#include <tbb/parallel_pipeline.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <unordered_map>

#include "records/file.h"
#include "records/tfrecord_writer.h"
#include "tools/cli.h"
#include "tools/converters.h"

namespace recflow::tools {
namespace {

struct ConvertOptions {
  std::string format;
  std::vector<std::string> inputs;
  std::string output;
  uint64_t shards = 1;
  std::string compression = "none";
  bool index = false;
  std::string spec;
  bool skip_bad = false;
  std::string images, labels;
  int threads = 0;
  bool json = false;
};

// Records per chunk: large enough to amortise the hand-over, small enough
// to keep shards balanced (they differ by at most one chunk).
constexpr size_t kChunkRecords = 256;
// Chunks waiting per writer thread: what bounds memory.
constexpr size_t kQueuedChunks = 8;

// Chunks of rows being built into Examples at once: what bounds the rows
// in memory between reading and writing.
constexpr size_t kChunksInFlight = 16;

struct RowChunk {
  std::vector<Row> rows;
};

struct Chunk {
  size_t shard = 0;
  std::vector<std::string> records;
};

// A bounded queue of chunks for one writer thread.
class ChunkQueue {
 public:
  void Push(std::unique_ptr<Chunk> c) {
    std::unique_lock lock(mu_);
    space_.wait(lock, [&] { return queue_.size() < kQueuedChunks || failed_; });
    queue_.push_back(std::move(c));
    ready_.notify_one();
  }
  // nullptr once closed and drained.
  std::unique_ptr<Chunk> Pop() {
    std::unique_lock lock(mu_);
    ready_.wait(lock, [&] { return !queue_.empty() || closed_; });
    if (queue_.empty()) return nullptr;
    auto c = std::move(queue_.front());
    queue_.pop_front();
    space_.notify_one();
    return c;
  }
  void Close() {
    std::lock_guard lock(mu_);
    closed_ = true;
    ready_.notify_all();
  }
  // The writer failed: let the reader stop waiting for room.
  void Fail() {
    std::lock_guard lock(mu_);
    failed_ = true;
    space_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable ready_, space_;
  std::deque<std::unique_ptr<Chunk>> queue_;
  bool closed_ = false;
  bool failed_ = false;
};

// The progress line, on a terminal only: records, MB/s of input, ETA.
class Progress {
 public:
  explicit Progress(const ExampleSource& source)
      : source_(source), tty_(isatty(STDERR_FILENO) == 1) {}
  void Update(uint64_t records, bool force = false) {
    if (!tty_) return;
    const auto now = std::chrono::steady_clock::now();
    if (!force && now - last_ < std::chrono::milliseconds(250)) return;
    last_ = now;
    const double s = std::chrono::duration<double>(now - start_).count();
    const double done = static_cast<double>(source_.bytes_read());
    const double total = static_cast<double>(source_.total_bytes());
    const double rate = s > 0 ? done / s : 0;
    std::string eta = "-";
    if (rate > 0 && total > done)
      eta = fmt::format("{:.0f} s", (total - done) / rate);
    fmt::print(stderr, "\r{:>12} records  {:>8.1f} MB/s  ETA {:<8}", records,
               rate / 1e6, eta);
  }
  void Finish() {
    if (tty_) fmt::print(stderr, "\r{:60}\r", "");
  }

 private:
  const ExampleSource& source_;
  const bool tty_;
  const std::chrono::steady_clock::time_point start_ =
      std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace

ConvertSummary Convert(const ConvertJob& job) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<ExampleSource> source = OpenSource(job.format, job.inputs);

  // Writers: all shards open at once, each finished under its temporary
  // name when its thread is done, committed together at the end.
  const std::string_view suffix =
      records::CompressionSuffix(job.writer.compression);
  std::vector<std::unique_ptr<records::TFRecordWriter>> writers;
  for (uint64_t s = 0; s < job.shards; ++s) {
    writers.push_back(std::make_unique<records::TFRecordWriter>(
        ShardName(job.output, s, job.shards, suffix), job.writer));
  }
  const size_t cores = std::max(1u, std::thread::hardware_concurrency());
  const size_t threads = std::min<size_t>(
      job.shards, job.threads > 0 ? static_cast<size_t>(job.threads) : cores);
  std::vector<ChunkQueue> queues(threads);
  std::vector<std::exception_ptr> errors(threads);
  std::atomic<bool> writer_failed{false};
  std::vector<std::thread> workers;
  for (size_t t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      try {
        while (auto chunk = queues[t].Pop()) {
          for (const auto& r : chunk->records) writers[chunk->shard]->Write(r);
        }
        for (size_t s = t; s < writers.size(); s += threads) {
          writers[s]->Finish();
        }
      } catch (...) {
        errors[t] = std::current_exception();
        writer_failed = true;
        queues[t].Fail();
        while (queues[t].Pop()) {
        }
      }
    });
  }
  auto stop_workers = [&] {
    for (auto& q : queues) q.Close();
    for (auto& w : workers) w.join();
    workers.clear();
  };

  // Rows are read on one thread, built into Examples on all cores, and
  // handed to the writers in input order, so that the first bad row
  // reported is the first in the input and shards hold rows in order.
  ConvertSummary summary;
  Progress progress(*source);
  size_t chunk_index = 0;
  bool writers_stopped_early = false;
  // The chunks between the stages.  They travel as raw pointers and are
  // owned here: when an error cancels the pipeline, oneTBB drops the items
  // in flight without destroying them, so owning tokens would leak.
  std::mutex live_mu;
  std::unordered_map<RowChunk*, std::unique_ptr<RowChunk>> live;
  auto read_rows = [&](tbb::flow_control& fc) -> RowChunk* {
    auto owned = std::make_unique<RowChunk>();
    RowChunk* chunk = owned.get();
    chunk->rows.resize(kChunkRecords);
    size_t n = 0;
    while (n < kChunkRecords && source->NextRow(&chunk->rows[n])) ++n;
    if (n == 0) {
      fc.stop();
      return nullptr;
    }
    chunk->rows.resize(n);
    std::lock_guard<std::mutex> lock(live_mu);
    live.emplace(chunk, std::move(owned));
    return chunk;
  };
  auto build_examples = [&](RowChunk* chunk) {
    records::ExampleBuilder builder;
    for (Row& row : chunk->rows) {
      if (row.built || !row.error.empty()) continue;
      builder.Clear();
      try {
        source->Build(row, &builder);
        row.example.assign(builder.Serialize());
      } catch (const ConvertError& e) {
        if (!e.row_level()) throw;
        row.error = e.what();
      }
    }
    return chunk;
  };
  auto hand_to_writers = [&](RowChunk* rows) {
    if (writer_failed) {
      writers_stopped_early = true;
      throw ConvertError("a shard writer failed", /*row_level=*/false);
    }
    auto chunk = std::make_unique<Chunk>();
    chunk->shard = chunk_index % job.shards;
    for (Row& row : rows->rows) {
      if (!row.error.empty()) {
        if (!job.skip_bad) throw ConvertError(row.error, /*row_level=*/true);
        if (summary.skipped++ == 0) summary.first_skipped = row.error;
        continue;
      }
      chunk->records.push_back(std::move(row.example));
    }
    {
      std::lock_guard<std::mutex> lock(live_mu);
      live.erase(rows);
    }
    summary.records += chunk->records.size();
    if (!chunk->records.empty()) {
      queues[chunk->shard % threads].Push(std::move(chunk));
      ++chunk_index;
    }
    progress.Update(summary.records);
  };
  try {
    tbb::parallel_pipeline(
        kChunksInFlight,
        tbb::make_filter<void, RowChunk*>(tbb::filter_mode::serial_in_order,
                                          read_rows) &
            tbb::make_filter<RowChunk*, RowChunk*>(tbb::filter_mode::parallel,
                                                   build_examples) &
            tbb::make_filter<RowChunk*, void>(tbb::filter_mode::serial_in_order,
                                              hand_to_writers));
  } catch (...) {
    progress.Finish();
    stop_workers();
    if (writers_stopped_early) {
      for (auto& e : errors) {
        if (e) std::rethrow_exception(e);
      }
    }
    throw;  // the writers, unfinished or uncommitted, leave nothing
  }
  stop_workers();
  progress.Finish();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }

  std::unique_ptr<records::WritableFile> labels;
  if (job.format == "images") {
    labels = std::make_unique<records::WritableFile>(job.output + "-labels.txt",
                                                     /*atomic=*/true);
    const auto classes = ImageClassNames(job.inputs.files.at(0));
    for (size_t i = 0; i < classes.size(); ++i) {
      labels->Append(fmt::format("{}:{}\n", i, classes[i]));
    }
    labels->Finish();
  }
  for (auto& w : writers) w->Commit();
  if (labels) {
    labels->Commit();
    summary.labels_file = labels->path();
  }
  for (auto& w : writers) {
    if (job.writer.build_index) {
      records::WriteIndex(records::IndexPathFor(w->path()), w->index());
    }
    summary.bytes += w->file_bytes();
    summary.shards.push_back(
        {w->path(), w->records_written(), w->file_bytes()});
  }
  summary.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return summary;
}

namespace {

int RunConvert(const ConvertOptions& o) {
  static const std::set<std::string> kFormats = {"csv", "jsonl", "npy",
                                                 "npz", "idx",   "images"};
  if (!kFormats.count(o.format)) {
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
  const records::WriterOptions writer =
      ShardWriterOptions(o.shards, o.compression, o.index);
  std::optional<records::FeatureSpec> spec;
  if (!o.spec.empty()) spec = records::FeatureSpec::FromFile(o.spec);
  ConvertJob job;
  job.format = o.format;
  job.inputs = {o.inputs, o.images, o.labels, spec ? &*spec : nullptr};
  job.output = o.output;
  job.shards = o.shards;
  job.writer = writer;
  job.threads = o.threads;
  job.skip_bad = o.skip_bad;
  const ConvertSummary s = Convert(job);
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
                                      {"shards", shards}}
                           .dump());
  } else {
    fmt::print(
        "converted {} records ({}) into {} shards, {} bytes ({}), in "
        "{:.2f} s ({:.0f} records/s)\n",
        s.records, o.format, o.shards, s.bytes,
        records::CompressionName(writer.compression), s.seconds, rate);
    fmt::print("  {}\n", s.shards.front().path);
    if (o.shards > 1) fmt::print("  ...\n  {}\n", s.shards.back().path);
    if (!s.labels_file.empty()) fmt::print("  {}\n", s.labels_file);
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
  app.add_flag("--index", o->index, "write FILE.idx beside every shard");
  app.add_option("--spec", o->spec,
                 "FeatureSpec JSON giving the dtype of csv columns or jsonl "
                 "keys (others are inferred)");
  app.add_flag("--skip-bad", o->skip_bad,
               "skip rows that cannot be converted, and count them");
  app.add_option("--images", o->images, "idx: the images file (.gz or not)");
  app.add_option("--labels", o->labels, "idx: the labels file (.gz or not)");
  app.add_option("--threads", o->threads, "writer threads (0: one per core)");
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
