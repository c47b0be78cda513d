// recflow reshard: rewrites records, in order or shuffled, into N balanced
// shards.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "pipeline/dataset.h"
#include "records/file_list.h"
#include "records/index.h"
#include "records/tfrecord_reader.h"
#include "records/tfrecord_writer.h"
#include "tools/cli.h"
#include "tools/read_options.h"

namespace recflow::tools {
namespace {

struct ReshardOptions {
  std::vector<std::string> inputs;
  uint64_t shards = 1;
  std::string compression = "none";
  std::string output;
  bool index = false;
  bool json = false;
  int level = 0;
  ReadFlags read;
  std::optional<uint64_t> shuffle;  // the seed
};

}  // namespace

namespace {

// `total` records into `shards` files written one after another: shard s
// gets records [s*total/shards, (s+1)*total/shards), so sizes differ by at
// most one.  The shards are finished under temporary names and committed
// together by Finish, so a failure leaves none under a final name.
class BalancedShards {
 public:
  BalancedShards(const std::string& prefix, uint64_t shards, uint64_t total,
                 records::WriterOptions options, bool write_index)
      : prefix_(prefix),
        shards_(shards),
        total_(total),
        options_(std::move(options)),
        write_index_(write_index) {
    options_.build_index = write_index;
    OpenNext();
  }
  uint64_t written() const { return next_; }
  // False, writing nothing, for a record past `total`.
  bool Write(std::string_view record) {
    while (next_ >= shard_end_ && shard_ < shards_) OpenNext();
    if (next_ >= total_) return false;
    writers_.back()->Write(record);
    ++next_;
    return true;
  }
  // Opens the shards left empty, commits every shard and writes the
  // indexes.  The caller checks written() == total first.
  std::vector<ShardResult> Finish() {
    while (shard_ < shards_) OpenNext();
    writers_.back()->Finish();
    for (auto& w : writers_) w->Commit();
    std::vector<ShardResult> results;
    for (auto& w : writers_) {
      if (write_index_) {
        records::WriteIndex(records::IndexPathFor(w->path()), w->index());
      }
      results.push_back({w->path(), w->records_written(), w->file_bytes()});
    }
    return results;
  }

 private:
  void OpenNext() {
    if (!writers_.empty()) writers_.back()->Finish();
    writers_.push_back(std::make_unique<records::TFRecordWriter>(
        ShardName(prefix_, shard_, shards_,
                  records::CompressionSuffix(options_.compression)),
        options_));
    shard_end_ = (shard_ + 1) * total_ / shards_;
    ++shard_;
  }

  std::string prefix_;
  uint64_t shards_, total_;
  records::WriterOptions options_;
  bool write_index_;
  std::vector<std::unique_ptr<records::TFRecordWriter>> writers_;
  uint64_t next_ = 0, shard_ = 0, shard_end_ = 0;
};

}  // namespace

std::vector<ShardResult> Reshard(const std::vector<std::string>& files,
                                 const std::string& prefix, uint64_t shards,
                                 records::WriterOptions writer_options,
                                 const records::ReaderOptions& reader_options,
                                 bool write_index) {
  // Pass 1: count (and verify) so that the shards can be balanced.
  records::RequireRegularFiles(
      files, "reshard reads its inputs twice (to count, then to copy)");
  uint64_t total = 0;
  for (const std::string& path : files) {
    records::TFRecordReader reader(path, reader_options);
    std::string_view record;
    while (reader.ReadRecord(&record)) ++total;
  }
  // Pass 2: copy.
  BalancedShards out(prefix, shards, total, std::move(writer_options),
                     write_index);
  for (const std::string& path : files) {
    records::TFRecordReader reader(path, reader_options);
    std::string_view record;
    while (reader.ReadRecord(&record)) {
      if (!out.Write(record)) {
        throw records::Error(fmt::format(
            "{}: holds more records than when it was counted; was it "
            "changed during resharding?",
            path));
      }
    }
  }
  if (out.written() != total) {
    throw records::Error(fmt::format(
        "the inputs held {} records when counted but {} when copied; were "
        "they changed during resharding?",
        total, out.written()));
  }
  return out.Finish();
}

std::vector<ShardResult> ReshardShuffled(const std::vector<std::string>& files,
                                         const std::string& prefix,
                                         uint64_t shards, uint64_t seed,
                                         records::WriterOptions writer_options,
                                         bool write_index) {
  // Every record once, in a uniform random order, read by index; its
  // cardinality is the count of the indexes.
  pipeline::GlobalShuffleOptions o;
  o.seed = seed;
  const pipeline::Dataset ds =
      pipeline::Dataset::FromTFRecordsGlobalShuffle(files, o);
  const auto total = static_cast<uint64_t>(ds.Cardinality());
  BalancedShards out(prefix, shards, total, std::move(writer_options),
                     write_index);
  pipeline::Iterator it = ds.MakeIterator();
  pipeline::Element e;
  while (it.Next(&e)) {
    if (!out.Write(e["record"].bytes(0))) {
      throw records::Error(
          fmt::format("the inputs gave more than the {} records their "
                      "indexes hold; were they changed during resharding?",
                      total));
    }
  }
  if (out.written() != total) {
    throw records::Error(fmt::format(
        "the indexes held {} records but {} were read; were the inputs "
        "changed during resharding?",
        total, out.written()));
  }
  return out.Finish();
}

namespace {

int RunReshard(const ReshardOptions& o) {
  const std::vector<std::string> files = ExpandInputs(o.inputs);
  CheckEachFileOnce(files, "reshard would copy its records twice");
  // One shard is written at a time: its ZSTD frames use every core.
  records::WriterOptions wo =
      ShardWriterOptions(o.output, o.shards, o.compression, o.index, o.level);
  wo.compression_threads =
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const auto start = std::chrono::steady_clock::now();
  std::vector<ShardResult> written;
  if (o.shuffle) {
    // The global shuffle detects each file's compression and reads its
    // records by index: the reading flags do not apply.
    if (o.read.compression != "auto" ||
        o.read.max_record_bytes != records::kDefaultMaxRecordBytes) {
      throw UsageError(
          "--shuffle reads records by index (FILE.idx, or indexed in memory) "
          "and detects each file's compression; --input-compression and "
          "--max-record-bytes do not apply to it");
    }
    written =
        ReshardShuffled(files, o.output, o.shards, *o.shuffle, wo, o.index);
  } else {
    written = Reshard(files, o.output, o.shards, wo, o.read.ToReaderOptions(),
                      o.index);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  uint64_t records = 0, bytes = 0;
  nlohmann::json shards = nlohmann::json::array();
  for (const ShardResult& s : written) {
    records += s.records;
    bytes += s.bytes;
    shards.push_back(
        {{"path", s.path}, {"records", s.records}, {"bytes", s.bytes}});
    if (!o.json) {
      fmt::print("{:>12} records {:>15} bytes  {}\n", s.records, s.bytes,
                 s.path);
    }
  }
  std::vector<std::string> warnings;
  if (auto other = convert::OtherShardsWarning(
          o.output, o.shards, records::CompressionSuffix(wo.compression))) {
    warnings.push_back(std::move(*other));
  }
  if (o.json) {
    fmt::print("{}\n", nlohmann::json{{"records", records},
                                      {"bytes", bytes},
                                      {"seconds", seconds},
                                      {"shards", shards},
                                      {"warnings", warnings}}
                           .dump());
  } else {
    fmt::print("wrote {} record{} into {} shard{} ({}) in {:.2f} s\n", records,
               records == 1 ? "" : "s", written.size(),
               written.size() == 1 ? "" : "s",
               records::CompressionName(wo.compression), seconds);
  }
  for (const std::string& w : warnings) {
    fmt::print(stderr, "recflow: warning: {}\n", w);
  }
  return kExitOk;
}

}  // namespace

Runner AddReshardCommand(CLI::App& app) {
  auto o = std::make_shared<ReshardOptions>();
  app.add_option("FILE", o->inputs, "record files, or directories of them")
      ->required();
  app.add_option("--shards,-n", o->shards, "number of output shards")
      ->required();
  app.add_option("--compression", o->compression,
                 "output compression: none, zlib, gzip (TensorFlow reads "
                 "these) or zstd (recflow's own, in independent ~1 MiB "
                 "frames; TensorFlow cannot read it, the zstd command can "
                 "decompress it)")
      ->capture_default_str();
  app.add_option("--compression-level,--level", o->level,
                 "gzip, zlib: 1 (fastest) to 9 (smallest), default 6; zstd: "
                 "1 to 19, default 3 (ZSTD frames are compressed on every "
                 "core)");
  app.add_option("--output,-o", o->output,
                 "output prefix: shards are PREFIX-00000-of-0000N.tfrecord "
                 "(+ .zz, .gz or .zst)")
      ->required();
  app.add_flag("--index", o->index,
               "also write PREFIX-...tfrecord.idx for every shard");
  app.add_flag("--json", o->json, "print one JSON object as the last line");
  app.add_option("--shuffle", o->shuffle,
                 "SEED: write the records in a uniform random order instead "
                 "(every record once; the same seed, the same shards), read "
                 "by index: FILE.idx, or each file indexed in memory first; "
                 "uncompressed or ZSTD inputs");
  o->read.Register(app, "--input-compression");
  app.footer(
      "Records keep their order (unless --shuffle): shard 0 holds the first "
      "records. Shard sizes differ by at most one record. All shards appear "
      "together, or none (a failure or interruption leaves no file under a "
      "shard's name).");
  return [o] { return RunReshard(*o); };
}

}  // namespace recflow::tools
