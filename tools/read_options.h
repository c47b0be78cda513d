// Reader flags shared by the commands that read records.
#ifndef RECFLOW_TOOLS_READ_OPTIONS_H_
#define RECFLOW_TOOLS_READ_OPTIONS_H_

#include <CLI/CLI.hpp>
#include <string>

#include "records/tfrecord_reader.h"

namespace recflow::tools {

struct ReadFlags {
  std::string compression = "auto";
  uint64_t max_record_bytes = records::kDefaultMaxRecordBytes;

  // Adds `compression_flag` (--compression, or --input-compression where
  // --compression names the output's) and --max-record-bytes to `app`.
  void Register(CLI::App& app,
                const std::string& compression_flag = "--compression");
  // Throws UsageError for an unknown compression name.
  records::ReaderOptions ToReaderOptions() const;
};

}  // namespace recflow::tools

#endif  // RECFLOW_TOOLS_READ_OPTIONS_H_
