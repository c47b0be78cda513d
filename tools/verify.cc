// recflow verify: checks every record; with --salvage writes the readable
// ones to a new file and says what was lost.
#include <fmt/format.h>

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
    records::IndexCheck index(path);
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
