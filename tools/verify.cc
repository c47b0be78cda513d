// recflow verify: checks every record; with --salvage writes the readable
// ones to a new file and says what was lost.
#include <fmt/format.h>
#include <sys/stat.h>

#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "records/file_list.h"
#include "records/index.h"
#include "records/tfrecord_format.h"
#include "records/tfrecord_reader.h"
#include "records/tfrecord_writer.h"
#include "tools/cli.h"
#include "tools/read_options.h"

namespace recflow::tools {
namespace {

struct VerifyOptions {
  std::vector<std::string> inputs;
  std::string salvage;
  std::string output_compression = "auto";
  bool json = false;
  ReadFlags read;
};

// Prints each problem on stderr as it is found.
class StderrReporter final : public records::Reporter {
 public:
  void Skipped(const records::RecordError& error, uint64_t bytes) override {
    fmt::print(stderr, "{} ({} bytes skipped)\n", error.what(), bytes);
    ++problems;
  }
  uint64_t problems = 0;
};

// FILE.idx beside an input, checked against the records as they are read:
// the index DALI, `recflow bench` and the global shuffle would trust.
class IndexCheck {
 public:
  explicit IndexCheck(const std::string& record_path)
      : path_(records::IndexPathFor(record_path)) {
    struct stat st;
    if (::stat(path_.c_str(), &st) != 0) return;  // none: nothing to check
    present_ = true;
    try {
      index_ = records::ReadIndex(path_);
    } catch (const records::Error& e) {
      problem_ = e.what();
    }
  }
  bool present() const { return present_; }
  // Record i, read at `offset` of the (decoded) stream, `frame` bytes long
  // with its framing.  `zstd_frames`: the ZSTD frames the reader has
  // decoded whole so far (ReaderOptions::track_zstd_frames), or null.  A
  // ZSTD record waits until its frame is whole; an uncompressed one is
  // compared at once.  Either way the file is read once.
  void Record(uint64_t i, uint64_t offset, uint64_t frame,
              records::Compression compression,
              const std::vector<records::ZstdFrame>* zstd_frames) {
    // An index of another kind of file is Finish's to report.
    if (!index_ || !problem_.empty() || index_->compression != compression) {
      return;
    }
    if (index_->compression == records::Compression::kZstd) {
      pending_.push_back({i, offset, frame});
      if (zstd_frames != nullptr) MatchFrames(*zstd_frames);
      return;
    }
    if (i >= index_->entries.size()) return;  // counted at the end
    const records::IndexEntry& e = index_->entries[i];
    if (e.offset != offset || e.size != frame) {
      problem_ = fmt::format(
          "{}: stale index: record {} is {} bytes at byte {} of the file, "
          "the index says {} bytes at byte {}",
          path_, i, frame, offset, e.size, e.offset);
    }
  }
  // After every record was read: the count, and a zstd index against the
  // file's frames.  Returns the problem, "" when the index is the file's.
  std::string Finish(records::Compression compression, uint64_t records,
                     const std::vector<records::ZstdFrame>* zstd_frames) {
    if (!present_ || !problem_.empty()) return problem_;
    const bool zstd = compression == records::Compression::kZstd;
    if (compression != records::Compression::kNone && !zstd) {
      return fmt::format(
          "{}: an index beside a {} file, which cannot have "
          "one",
          path_, records::CompressionName(compression));
    }
    if (index_->compression != compression) {
      return fmt::format("{}: an index of a {} file beside a {} one", path_,
                         records::CompressionName(index_->compression),
                         records::CompressionName(compression));
    }
    if (index_->entries.size() != records) {
      return fmt::format("{}: stale index: {} records, the file has {}", path_,
                         index_->entries.size(), records);
    }
    if (zstd && zstd_frames != nullptr) MatchFrames(*zstd_frames);
    if (problem_.empty() && !pending_.empty()) {
      problem_ = fmt::format(
          "{}: stale index: record {} lies in no whole zstd frame of the "
          "file",
          path_, pending_.front().record);
    }
    return problem_;
  }

 private:
  // A ZSTD record read but not yet compared: its number, stream offset and
  // size with its framing.
  struct Pending {
    uint64_t record, offset, size;
  };

  // Compares the pending ZSTD records whose frames are whole with their
  // entries.
  void MatchFrames(const std::vector<records::ZstdFrame>& frames) {
    while (!pending_.empty() && problem_.empty()) {
      const Pending& r = pending_.front();
      const uint64_t i = r.record;
      records::IndexEntry want;
      const records::FrameFit fit =
          records::LocateInFrame(frames, &frame_, r.offset, r.size, &want);
      if (fit == records::FrameFit::kNoFrame) return;  // not whole yet
      if (fit == records::FrameFit::kSpans) {
        problem_ = fmt::format(
            "{}: record {} spans two zstd frames, so no index can reach it "
            "(`recflow reshard --compression zstd` rewrites the file with "
            "whole records in each frame)",
            path_, i);
        return;
      }
      if (i < index_->entries.size() && !(index_->entries[i] == want)) {
        const records::IndexEntry& e = index_->entries[i];
        problem_ = fmt::format(
            "{}: stale index: record {} is {} bytes at byte {} of the zstd "
            "frame at file byte {} ({} bytes); the index says {} bytes at "
            "byte {} of the frame at {} ({} bytes)",
            path_, i, want.size, want.offset, want.frame_offset,
            want.frame_bytes, e.size, e.offset, e.frame_offset, e.frame_bytes);
      }
      pending_.pop_front();
    }
  }

  std::string path_;
  bool present_ = false;
  std::optional<records::Index> index_;
  std::deque<Pending> pending_;
  size_t frame_ = 0;  // the frame being matched
  std::string problem_;
};

int RunVerify(const VerifyOptions& o) {
  const std::vector<std::string> files = ExpandInputs(o.inputs);
  std::optional<records::TFRecordWriter> out;
  if (!o.salvage.empty()) {
    // Salvaging into a file being verified would replace it (the damaged
    // original, which another tool might still recover more from).
    // (The salvage file against each input on its own: inputs that name
    // one file twice are no salvage problem.)
    for (const std::string& f : files) {
      if (records::FindFileNamedTwice({o.salvage, f})) {
        throw UsageError(fmt::format(
            "--salvage {} is {}, one of the files being verified: write the "
            "salvaged records elsewhere",
            o.salvage, f));
      }
    }
    records::WriterOptions wo;
    if (o.output_compression == "auto") {
      wo.compression = records::CompressionFromSuffix(o.salvage);
    } else {
      const auto c = records::ParseCompression(o.output_compression);
      if (!c) {
        throw UsageError(
            fmt::format("--output-compression {}: expected "
                        "auto, none, zlib, gzip or zstd",
                        o.output_compression));
      }
      wo.compression = *c;
    }
    out.emplace(o.salvage, wo);
  }
  nlohmann::json per_file = nlohmann::json::array();
  uint64_t total_problems = 0, total_records = 0, total_lost = 0;
  for (const std::string& path : files) {
    StderrReporter reporter;
    records::ReaderOptions options = o.read.ToReaderOptions();
    options.salvage = true;
    options.reporter = &reporter;
    IndexCheck index(path);
    options.track_zstd_frames = index.present();
    records::TFRecordReader reader(path, options);
    std::string_view record;
    for (uint64_t i = 0; reader.ReadRecord(&record); ++i) {
      if (out) out->Write(record);
      index.Record(i, reader.last_offset(),
                   record.size() + records::kFrameOverhead,
                   reader.compression(), reader.zstd_frames());
    }
    const records::ReadStats stats = reader.stats();
    // A damaged file's index is not checked: its records are not where an
    // index of the file could put them.
    const std::string index_problem =
        reporter.problems == 0
            ? index.Finish(reader.compression(), stats.records,
                           reader.zstd_frames())
            : "";
    if (!index_problem.empty()) {
      fmt::print(stderr, "{}\n", index_problem);
      ++reporter.problems;
    }
    total_problems += reporter.problems;
    total_records += stats.records;
    total_lost += stats.skipped_bytes;
    if (!o.json) {
      if (reporter.problems == 0) {
        fmt::print("OK       {:>12} records  {}\n", stats.records, path);
      } else if (!index_problem.empty()) {  // the records are all good
        fmt::print(
            "BAD IDX  {:>12} records  {} (its index is not the "
            "file's: `recflow index` writes it again)\n",
            stats.records, path);
      } else {
        fmt::print(
            "DAMAGED  {:>12} readable records, {} problem(s), {} bytes "
            "unreadable  {}\n",
            stats.records, reporter.problems, stats.skipped_bytes, path);
      }
    }
    per_file.push_back({{"path", path},
                        {"records", stats.records},
                        {"problems", reporter.problems},
                        {"skipped_bytes", stats.skipped_bytes},
                        {"index", !index.present()        ? "none"
                                  : index_problem.empty() ? "ok"
                                                          : "stale"},
                        {"ok", reporter.problems == 0}});
  }
  if (out) {
    out->Close();
    if (!o.json) {
      fmt::print("salvaged {} records into {}{}\n", out->records_written(),
                 o.salvage,
                 total_lost > 0
                     ? fmt::format(" ({} bytes could not be read)", total_lost)
                     : "");
    }
  }
  if (o.json) {
    nlohmann::json result = {{"ok", total_problems == 0},
                             {"records", total_records},
                             {"problems", total_problems},
                             {"skipped_bytes", total_lost},
                             {"files", per_file}};
    if (out) result["salvaged_to"] = o.salvage;
    fmt::print("{}\n", result.dump());
  }
  return total_problems == 0 ? kExitOk : kExitDamage;
}

}  // namespace

Runner AddVerifyCommand(CLI::App& app) {
  auto o = std::make_shared<VerifyOptions>();
  app.add_option("FILE", o->inputs, "record files, or directories of them")
      ->required();
  app.add_option("--salvage", o->salvage,
                 "write every readable record of all inputs, in order, to "
                 "this file (written atomically)");
  app.add_option("--output-compression", o->output_compression,
                 "compression of the --salvage file: auto (from its suffix: "
                 ".gz, .zz, .zst), none, zlib, gzip or zstd")
      ->capture_default_str();
  app.add_flag("--json", o->json,
               "print one JSON object as the last line instead of the table");
  o->read.Register(app);
  app.footer(
      "Exit status: 0 when every record checks, 1 when damage was found (one "
      "line per problem on stderr: file, record offset in the uncompressed "
      "stream, record index, kind, and bytes skipped), 2 for usage or I/O "
      "errors. An index beside a file (FILE.idx) is checked too: every "
      "entry where its record is, and as many as there are records. After a "
      "bad data CRC the record is skipped; after a bad "
      "length the reader resynchronises at the next valid record header.");
  return [o] { return RunVerify(*o); };
}

}  // namespace recflow::tools
