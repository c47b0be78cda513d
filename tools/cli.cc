#include "tools/cli.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

namespace recflow::tools {
namespace {

bool IsRecordFileName(const std::string& name) {
  if (name.empty() || name[0] == '.') return false;
  if (name.size() >= 4 && name.compare(name.size() - 4, 4, ".idx") == 0) {
    return false;
  }
  return name.find("tfrecord") != std::string::npos ||
         name.find("tfrec") != std::string::npos;
}

}  // namespace

std::vector<std::string> ExpandInputs(const std::vector<std::string>& args) {
  std::vector<std::string> files;
  for (const std::string& arg : args) {
    struct stat st;
    if (stat(arg.c_str(), &st) != 0) {
      throw UsageError(fmt::format("{}: no such file or directory", arg));
    }
    if (!S_ISDIR(st.st_mode)) {
      files.push_back(arg);
      continue;
    }
    std::vector<std::string> found;
    for (const auto& entry : std::filesystem::directory_iterator(arg)) {
      if (!entry.is_regular_file()) continue;
      if (IsRecordFileName(entry.path().filename().string())) {
        found.push_back(entry.path().string());
      }
    }
    if (found.empty()) {
      throw UsageError(
          fmt::format("{}: directory holds no record files (names containing "
                      "'tfrecord' or 'tfrec', not hidden, not .idx)",
                      arg));
    }
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
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

std::string ShardName(const std::string& prefix, uint64_t shard,
                      uint64_t shards, std::string_view suffix) {
  return fmt::format("{}-{:05d}-of-{:05d}.tfrecord{}", prefix, shard, shards,
                     suffix);
}

std::string FormatRate(double bytes, double seconds) {
  if (seconds <= 0) return "-";
  return fmt::format("{:.1f} MB/s", bytes / seconds / 1e6);
}

}  // namespace recflow::tools
