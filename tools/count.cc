// recflow count: records per file and in total, verifying both CRCs.
#include <fmt/format.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>

#include "records/tfrecord_reader.h"
#include "tools/cli.h"
#include "tools/read_options.h"

namespace recflow::tools {
namespace {

struct CountOptions {
  std::vector<std::string> inputs;
  bool json = false;
  bool no_verify = false;
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
    records::TFRecordReader reader(path, options);
    std::string_view record;
    nlohmann::json entry = {{"path", path}};
    try {
      while (reader.ReadRecord(&record)) {
      }
    } catch (const records::RecordError& e) {
      fmt::print(stderr, "{}\n", e.what());
      entry["error"] = e.what();
      rc = kExitDamage;
    }
    const records::ReadStats stats = reader.stats();
    entry["records"] = stats.records;
    entry["bytes"] = reader.file_size();
    entry["payload_bytes"] = stats.payload_bytes;
    entry["compression"] = records::CompressionName(reader.compression());
    records += stats.records;
    bytes += reader.file_size();
    payload += stats.payload_bytes;
    stream += stats.stream_bytes;
    if (!o.json) {
      fmt::print("{:>12} records {:>15} bytes  {}{}\n", stats.records,
                 reader.file_size(), path,
                 entry.contains("error") ? "  (damaged: counted up to the "
                                           "damage)"
                                         : "");
    }
    per_file.push_back(std::move(entry));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  if (o.json) {
    nlohmann::json out = {{"records", records},
                          {"bytes", bytes},
                          {"payload_bytes", payload},
                          {"stream_bytes", stream},
                          {"files", per_file},
                          {"verified", !o.no_verify},
                          {"ok", rc == kExitOk},
                          {"seconds", seconds}};
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
  app.add_option("FILE", o->inputs,
                 "record files, or directories of them")
      ->required();
  app.add_flag("--json", o->json,
               "print one JSON object as the last line: records, bytes (file "
               "bytes on disk), payload_bytes, stream_bytes (uncompressed "
               "framed bytes), and per file the same under \"files\"");
  app.add_flag("--no-verify", o->no_verify,
               "do not check the CRCs (faster; damage may go unnoticed)");
  o->read.Register(app);
  app.footer(
      "Exits 1 when a file is damaged (the error names the file, record "
      "offset and index), as `recflow verify` does; 2 on usage or I/O "
      "errors.");
  return [o] { return RunCount(*o); };
}

}  // namespace recflow::tools
