// recflow index: writes FILE.idx, the text index of DALI's tfrecord2idx and
// the Python tfrecord package (recflow's zstd variant for zstd files).
#include <fmt/format.h>

#include <memory>

#include "records/index.h"
#include "tools/cli.h"

namespace recflow::tools {
namespace {

struct IndexOptions {
  std::vector<std::string> inputs;
  std::string output;
};

int RunIndex(const IndexOptions& o) {
  const std::vector<std::string> files = ExpandInputs(o.inputs);
  if (!o.output.empty() && files.size() != 1) {
    throw UsageError(fmt::format(
        "--output names one index file, but {} record files were given",
        files.size()));
  }
  for (const std::string& path : files) {
    const records::Index index = records::BuildIndex(path);
    const std::string out =
        o.output.empty() ? records::IndexPathFor(path) : o.output;
    records::WriteIndex(out, index);
    fmt::print("{:>12} records  {} -> {}\n", index.entries.size(), path, out);
  }
  return kExitOk;
}

}  // namespace

Runner AddIndexCommand(CLI::App& app) {
  auto o = std::make_shared<IndexOptions>();
  app.add_option("FILE", o->inputs, "record files, or directories of them")
      ->required();
  app.add_option("--output,-o", o->output,
                 "index file to write (only with a single input; default "
                 "FILE.idx)");
  app.footer(
      "Uncompressed files get DALI's format: one 'offset size' line per "
      "record, size = 16 + payload length. ZSTD files get recflow's zstd "
      "index (docs/FORMATS.md), which maps each record to its frame. ZLIB "
      "and GZIP streams cannot be indexed. Every record is verified while "
      "indexing. With an index next to it, an uncompressed file of 16 MiB or "
      "more is read by ranges on several threads (recflow bench, train, "
      "Python), and it can be globally shuffled.");
  return [o] { return RunIndex(*o); };
}

}  // namespace recflow::tools
