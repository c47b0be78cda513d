// recflow reshard: rewrites records, in order, into N balanced shards.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

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
  // Pass 2: shard s gets records [s*total/shards, (s+1)*total/shards).  All
  // shards are finished under temporary names and committed together at
  // the end, so a failure leaves none of them under a final name.
  writer_options.build_index = write_index;
  std::vector<std::unique_ptr<records::TFRecordWriter>> writers;
  const std::string_view suffix =
      records::CompressionSuffix(writer_options.compression);
  uint64_t next = 0;
  uint64_t shard = 0;
  uint64_t shard_end = 0;
  auto open_next_shard = [&] {
    if (!writers.empty()) writers.back()->Finish();
    writers.push_back(std::make_unique<records::TFRecordWriter>(
        ShardName(prefix, shard, shards, suffix), writer_options));
    shard_end = (shard + 1) * total / shards;
    ++shard;
  };
  open_next_shard();
  for (const std::string& path : files) {
    records::TFRecordReader reader(path, reader_options);
    std::string_view record;
    while (reader.ReadRecord(&record)) {
      while (next >= shard_end && shard < shards) open_next_shard();
      if (next >= total) {
        throw records::Error(fmt::format(
            "{}: holds more records than when it was counted; was it "
            "changed during resharding?",
            path));
      }
      writers.back()->Write(record);
      ++next;
    }
  }
  while (shard < shards) open_next_shard();
  if (next != total) {
    throw records::Error(fmt::format(
        "the inputs held {} records when counted but {} when copied; were "
        "they changed during resharding?",
        total, next));
  }
  writers.back()->Finish();
  for (auto& w : writers) w->Commit();
  std::vector<ShardResult> results;
  for (auto& w : writers) {
    if (write_index) {
      records::WriteIndex(records::IndexPathFor(w->path()), w->index());
    }
    results.push_back({w->path(), w->records_written(), w->file_bytes()});
  }
  return results;
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
  const std::vector<ShardResult> written =
      Reshard(files, o.output, o.shards, wo, o.read.ToReaderOptions(), o.index);
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
  if (o.json) {
    fmt::print("{}\n", nlohmann::json{{"records", records},
                                      {"bytes", bytes},
                                      {"seconds", seconds},
                                      {"shards", shards}}
                           .dump());
  } else {
    fmt::print("wrote {} records into {} shards ({}) in {:.2f} s\n", records,
               written.size(), records::CompressionName(wo.compression),
               seconds);
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
  o->read.Register(app, "--input-compression");
  app.footer(
      "Records keep their order: shard 0 holds the first records. Shard "
      "sizes differ by at most one record. All shards appear together, or "
      "none (a failure or interruption leaves no file under a shard's "
      "name).");
  return [o] { return RunReshard(*o); };
}

}  // namespace recflow::tools
