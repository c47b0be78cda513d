// The sharded, atomic conversion job (convert.h).
//
// One thread reads the input in chunks of rows; the cores build them into
// Examples; chunk j goes, in input order, to shard j mod N, and writer
// threads (up to one per core) frame, compress and write the shards side by
// side.  Every shard is written under a temporary name and all appear
// together at the end, or none does.
#include "convert/convert.h"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "convert/ring.h"
#include "convert/sources.h"
#include "records/file.h"
#include "records/index.h"
#include "records/tfrecord_writer.h"

namespace recflow::convert {
namespace {

// Records per chunk: large enough to amortise the hand-over, small enough
// to keep shards balanced (they differ by at most one chunk).
constexpr size_t kChunkRecords = 256;
// Chunks waiting per writer thread: what bounds memory.
constexpr size_t kQueuedChunks = 8;

// Chunks of rows being built into Examples at once: what bounds the rows
// in memory between reading and writing.
constexpr size_t kChunksInFlight = 16;
// A record string larger than this is freed once written rather than
// reused for another row's Example: reuse spares small records an
// allocation each, while a large one's allocation is small beside its
// bytes, and keeping it would hold memory that is no longer in flight.
constexpr size_t kKeptRecordBytes = 4096;

struct RowChunk {
  std::vector<Row> rows;
  uint64_t bytes_read = 0;  // the source's, once these rows were read
};

// Records for one shard.  Chunks are recycled (ChunkPool) with their
// strings: a record's string goes back to a row, swapped for the Example
// built there, so that neither building nor writing allocates per row
// once the first chunks have gone round.
struct Chunk {
  size_t shard = 0;
  std::vector<std::string> records;  // [0, used): this chunk's
  size_t used = 0;
};

// Chunks written and free again, for the next hand-over.  Thread-safe.
class ChunkPool {
 public:
  std::unique_ptr<Chunk> Take() {
    std::lock_guard lock(mu_);
    if (free_.empty()) return std::make_unique<Chunk>();
    auto c = std::move(free_.back());
    free_.pop_back();
    return c;
  }
  void Give(std::unique_ptr<Chunk> c) {
    std::lock_guard lock(mu_);
    free_.push_back(std::move(c));
  }

 private:
  std::mutex mu_;
  std::vector<std::unique_ptr<Chunk>> free_;
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

}  // namespace

ConvertSummary Convert(const ConvertJob& job) {
  if (const auto problem = ShardPrefixProblem(job.output, job.shards)) {
    throw ConvertError("output " + *problem, /*row_level=*/false);
  }
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<ExampleSource> source =
      OpenSource(job.format, job.inputs, job.progress);
  const double opening =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  ConvertSummary summary = ConvertSource(job, std::move(source));
  summary.seconds += opening;
  return summary;
}

ConvertSummary ConvertSource(const ConvertJob& job,
                             std::unique_ptr<ExampleSource> source) {
  const auto start = std::chrono::steady_clock::now();
  const uint64_t total_bytes = source->total_bytes();
  source->set_max_record_bytes(job.max_record_bytes);
  if (const auto problem = ShardPrefixProblem(job.output, job.shards)) {
    throw ConvertError("output " + *problem, /*row_level=*/false);
  }

  // Writers: all shards open at once, each finished under its temporary
  // name when its thread is done, committed together at the end.
  const std::string_view suffix =
      records::CompressionSuffix(job.writer.compression);
  const size_t cores = std::max(1u, std::thread::hardware_concurrency());
  const size_t threads = std::min<size_t>(
      job.shards, job.threads > 0 ? static_cast<size_t>(job.threads) : cores);
  records::WriterOptions writer_options = job.writer;
  writer_options.compression_threads =
      job.compression_threads > 0
          ? job.compression_threads
          : static_cast<int>(std::max<size_t>(1, cores / threads));
  std::vector<std::unique_ptr<records::TFRecordWriter>> writers;
  for (uint64_t s = 0; s < job.shards; ++s) {
    writers.push_back(std::make_unique<records::TFRecordWriter>(
        ShardName(job.output, s, job.shards, suffix), writer_options));
  }
  std::vector<ChunkQueue> queues(threads);
  ChunkPool pool;
  std::vector<std::exception_ptr> errors(threads);
  std::atomic<bool> writer_failed{false};
  std::vector<std::thread> workers;
  for (size_t t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      try {
        while (auto chunk = queues[t].Pop()) {
          for (size_t i = 0; i < chunk->used; ++i) {
            std::string& record = chunk->records[i];
            writers[chunk->shard]->Write(record);
            if (record.capacity() > kKeptRecordBytes)
              std::string().swap(record);
          }
          pool.Give(std::move(chunk));
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
  size_t chunk_index = 0;
  bool writers_stopped_early = false;
  // A slot's rows keep their strings' storage: a source reads the next
  // rows into it (CSV's cells, a JSON line, the path) without allocating.
  auto read_rows = [&](RowChunk& chunk) {
    chunk.rows.resize(kChunkRecords);
    size_t n = 0;
    while (n < kChunkRecords && source->NextRow(&chunk.rows[n])) ++n;
    if (n == 0) return false;
    chunk.rows.resize(n);
    // Read here: the source is only ever touched by the reading stage,
    // which runs on while later stages report progress.
    chunk.bytes_read = source->bytes_read();
    return true;
  };
  auto build_examples = [&](RowChunk& chunk) {
    records::ExampleBuilder builder;
    for (Row& row : chunk.rows) {
      if (row.built || !row.error.empty()) continue;
      builder.Clear();
      try {
        source->Build(row, &builder);
        row.example.assign(builder.Serialize());
        if (row.example.size() > job.max_record_bytes) {
          RecordTooLong(row.example.size(), job.max_record_bytes,
                        fmt::format("{}:{}", row.path, row.line));
        }
      } catch (const ConvertError& e) {
        if (!e.row_level()) throw;
        row.error = e.what();
      }
    }
  };
  auto hand_to_writers = [&](RowChunk& rows) {
    if (writer_failed) {
      writers_stopped_early = true;
      throw ConvertError("a shard writer failed", /*row_level=*/false);
    }
    auto chunk = pool.Take();
    chunk->shard = chunk_index % job.shards;
    chunk->used = 0;
    for (Row& row : rows.rows) {
      if (!row.error.empty()) {
        if (!job.skip_bad) throw ConvertError(row.error, /*row_level=*/true);
        if (summary.skipped++ == 0) summary.first_skipped = row.error;
        continue;
      }
      // The row takes a written record's string (its storage) for the
      // next Example built in its place.
      if (chunk->used == chunk->records.size()) chunk->records.emplace_back();
      std::swap(chunk->records[chunk->used++], row.example);
    }
    summary.records += chunk->used;
    if (chunk->used > 0) {
      queues[chunk->shard % threads].Push(std::move(chunk));
      ++chunk_index;
    } else {
      pool.Give(std::move(chunk));
    }
    if (job.progress) {
      job.progress({summary.records, rows.bytes_read, total_bytes});
    }
  };
  try {
    RunRing<RowChunk>(kChunksInFlight, read_rows, build_examples,
                      hand_to_writers);
  } catch (...) {
    stop_workers();
    if (writers_stopped_early) {
      for (auto& e : errors) {
        if (e) std::rethrow_exception(e);
      }
    }
    throw;  // the writers, unfinished or uncommitted, leave nothing
  }
  stop_workers();
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
  summary.warnings = source->warnings();
  if (auto other = OtherShardsWarning(
          job.output, job.shards,
          records::CompressionSuffix(job.writer.compression))) {
    summary.warnings.push_back(std::move(*other));
  }
  summary.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return summary;
}

}  // namespace recflow::convert
