#include "records/compression.h"

#include <algorithm>
#include <cctype>

#include "records/file.h"
#include "records/tfrecord_format.h"

namespace recflow::records {
namespace {

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

std::string_view CompressionName(Compression c) {
  switch (c) {
    case Compression::kNone:
      return "none";
    case Compression::kZlib:
      return "zlib";
    case Compression::kGzip:
      return "gzip";
    case Compression::kZstd:
      return "zstd";
  }
  return "none";
}

std::optional<Compression> ParseCompression(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char ch) { return std::tolower(ch); });
  if (lower.empty() || lower == "none") return Compression::kNone;
  if (lower == "zlib") return Compression::kZlib;
  if (lower == "gzip") return Compression::kGzip;
  if (lower == "zstd") return Compression::kZstd;
  return std::nullopt;
}

std::string_view CompressionSuffix(Compression c) {
  switch (c) {
    case Compression::kNone:
      return "";
    case Compression::kZlib:
      return ".zz";
    case Compression::kGzip:
      return ".gz";
    case Compression::kZstd:
      return ".zst";
  }
  return "";
}

Compression DetectCompression(std::string_view head, std::string_view path) {
  if (head.size() >= kHeaderBytes && HeaderChecks(head.data())) {
    return Compression::kNone;
  }
  if (head.size() >= 2 && static_cast<unsigned char>(head[0]) == 0x1f &&
      static_cast<unsigned char>(head[1]) == 0x8b) {
    return Compression::kGzip;
  }
  if (head.size() >= 4 && head.substr(0, 4) == "\x28\xb5\x2f\xfd") {
    return Compression::kZstd;
  }
  if (EndsWith(path, ".zz") || EndsWith(path, ".zlib")) {
    return Compression::kZlib;
  }
  return Compression::kNone;
}

Compression CompressionFromSuffix(std::string_view path) {
  if (EndsWith(path, ".gz")) return Compression::kGzip;
  if (EndsWith(path, ".zz") || EndsWith(path, ".zlib")) {
    return Compression::kZlib;
  }
  if (EndsWith(path, ".zst") || EndsWith(path, ".zstd")) {
    return Compression::kZstd;
  }
  return Compression::kNone;
}

Compression DetectCompression(const ReadableFile& file) {
  char head[kHeaderBytes];
  const size_t got = file.is_regular() ? file.ReadAt(0, head, sizeof head) : 0;
  return DetectCompression(std::string_view(head, got), file.path());
}

}  // namespace recflow::records
