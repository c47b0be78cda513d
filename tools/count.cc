// recflow count: records per file and in total, verifying both CRCs.
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "records/parallel_scan.h"
#include "records/tfrecord_reader.h"
#include "tools/cli.h"
#include "tools/read_options.h"

namespace recflow::tools {
namespace {

struct CountOptions {
  std::vector<std::string> inputs;
  bool json = false;
  bool no_verify = false;
  int threads = 0;
  ReadFlags read;
};

int RunCount(const CountOptions& o) {
  const std::vector<std::string> files = ExpandInputs(o.inputs);
  const auto start = std::chrono::steady_clock::now();
  nlohmann::json per_file = nlohmann::json::array();
  uint64_t records = 0, bytes = 0, payload = 0, stream = 0;
  int rc = kExitOk;
  for (const std::string& path : files) {
    records::ReaderOptions options = o.read.ToReaderOptions();
    options.verify_checksums = !o.no_verify;
    nlohmann::json entry = {{"path", path}};
    records::ScanResult scan;
    try {
      scan = records::ScanFile(path, options, o.threads);
    } catch (const records::RecordError& e) {
      // Damage: say where, and still count what a reader gets before it.
      fmt::print(stderr, "{}\n", e.what());
      entry["error"] = e.what();
      scan.records = e.record_index();
      rc = kExitDamage;
    }
    // A pipe has no size: what was read from it.
    std::error_code no_size;
    uint64_t file_bytes = std::filesystem::file_size(path, no_size);
    if (no_size) file_bytes = scan.file_bytes;
    entry["records"] = scan.records;
    entry["bytes"] = file_bytes;
    if (!entry.contains("error")) {
      entry["payload_bytes"] = scan.payload_bytes;
      entry["compression"] = records::CompressionName(scan.compression);
    }
    records += scan.records;
    bytes += file_bytes;
    payload += scan.payload_bytes;
    stream += scan.stream_bytes;
    if (!o.json) {
      fmt::print("{:>12} records {:>15} bytes  {}{}\n", scan.records,
                 file_bytes, path,
                 entry.contains("error") ? "  (damaged: records before the "
                                           "damage)"
                                         : "");
    }
    per_file.push_back(std::move(entry));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  if (o.json) {
    nlohmann::json out = {
        {"records", records},       {"bytes", bytes},
        {"payload_bytes", payload}, {"stream_bytes", stream},
        {"files", per_file},        {"verified", !o.no_verify},
        {"ok", rc == kExitOk},      {"seconds", seconds}};
    fmt::print("{}\n", out.dump());
  } else if (files.size() > 1) {
    fmt::print("{:>12} records {:>15} bytes  total ({} files)\n", records,
               bytes, files.size());
  }
  return rc;
}

}  // namespace

Runner AddCountCommand(CLI::App& app) {
  auto o = std::make_shared<CountOptions>();
  app.add_option("FILE", o->inputs, "record files, or directories of them")
      ->required();
  app.add_flag("--json", o->json,
               "print one JSON object as the last line: records, bytes (file "
               "bytes on disk), payload_bytes, stream_bytes (uncompressed "
               "framed bytes), and per file the same under \"files\"");
  app.add_flag("--no-verify", o->no_verify,
               "do not check the CRCs (faster; damage may go unnoticed)");
  app.add_option("--threads", o->threads,
                 "threads verifying segments of one uncompressed file at "
                 "once (0: one per core); the result is exactly that of a "
                 "sequential read")
      ->capture_default_str()
      ->check(NonNegative());
  o->read.Register(app);
  app.footer(
      "Exits 1 when a file is damaged (the error names the file, record "
      "offset and index), as `recflow verify` does; 2 on usage or I/O "
      "errors.");
  return [o] { return RunCount(*o); };
}

}  // namespace recflow::tools
