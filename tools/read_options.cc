#include "tools/read_options.h"

#include <fmt/format.h>

#include "tools/cli.h"

namespace recflow::tools {

void ReadFlags::Register(CLI::App& app, const std::string& compression_flag) {
  app.add_option(compression_flag, compression,
                 "input compression: auto (detected from the gzip / zstd "
                 "magic bytes, or a .zz / .zlib suffix for ZLIB), none, "
                 "zlib, gzip or zstd")
      ->capture_default_str();
  app.add_option("--max-record-bytes", max_record_bytes,
                 "a record length above this is reported as damage")
      ->capture_default_str();
}

records::ReaderOptions ReadFlags::ToReaderOptions() const {
  records::ReaderOptions options;
  if (compression != "auto") {
    const auto c = records::ParseCompression(compression);
    if (!c) {
      throw UsageError(
          fmt::format("compression {}: expected auto, none, zlib, gzip or zstd",
                      compression));
    }
    options.compression = *c;
  }
  options.max_record_bytes = max_record_bytes;
  return options;
}

}  // namespace recflow::tools
