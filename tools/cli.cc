#include "tools/cli.h"

#include <fmt/format.h>

#include <algorithm>

#include "convert/convert.h"
#include "records/errors.h"
#include "records/example_parser.h"
#include "records/file_list.h"

namespace recflow::tools {
std::vector<std::string> ExpandInputs(const std::vector<std::string>& args) {
  try {
    return records::ExpandRecordPaths(args);
  } catch (const records::FileListError& e) {
    throw UsageError(e.what());
  }
}

records::WriterOptions ShardWriterOptions(uint64_t shards,
                                          const std::string& compression,
                                          bool index) {
  if (shards == 0) throw UsageError("--shards must be at least 1");
  const auto c = records::ParseCompression(compression);
  if (!c) {
    throw UsageError(fmt::format(
        "--compression {}: expected none, zlib, gzip or zstd", compression));
  }
  if (index && (*c == records::Compression::kZlib ||
                *c == records::Compression::kGzip)) {
    throw UsageError(
        "--index needs --compression none or zstd: a zlib or gzip stream "
        "cannot be entered in the middle");
  }
  records::WriterOptions options;
  options.compression = *c;
  options.build_index = index;
  return options;
}

std::string FormatRate(double bytes, double seconds) {
  if (seconds <= 0) return "-";
  return fmt::format("{:.1f} MB/s", bytes / seconds / 1e6);
}

int ExitCodeFor(const std::exception& e) {
  const bool damage = dynamic_cast<const records::RecordError*>(&e) ||
                      dynamic_cast<const convert::ConvertError*>(&e) ||
                      dynamic_cast<const records::ParseError*>(&e);
  return damage ? kExitDamage : kExitUsage;
}

}  // namespace recflow::tools
