#include "records/errors.h"

#include <fmt/format.h>

#include <cstring>

namespace recflow::records {
namespace {

std::string IoMessage(const std::string& path, const std::string& what,
                      int errno_value) {
  if (errno_value == 0) return fmt::format("{}: {}", path, what);
  return fmt::format("{}: {}: {}", path, what, std::strerror(errno_value));
}

}  // namespace

IoError::IoError(std::string path, std::string what, int errno_value)
    : Error(IoMessage(path, what, errno_value)),
      path_(std::move(path)),
      detail_(std::move(what)),
      errno_(errno_value) {}

std::string_view DamageKindName(DamageKind kind) {
  switch (kind) {
    case DamageKind::kLengthCrcMismatch:
      return "length CRC mismatch";
    case DamageKind::kDataCrcMismatch:
      return "data CRC mismatch";
    case DamageKind::kTruncatedHeader:
      return "truncated header";
    case DamageKind::kTruncatedData:
      return "truncated data";
    case DamageKind::kImplausibleLength:
      return "implausible length";
    case DamageKind::kDecompressionError:
      return "decompression error";
  }
  return "unknown damage";
}

RecordError::RecordError(std::string path, uint64_t offset,
                         uint64_t record_index, DamageKind kind,
                         std::string detail)
    : Error(fmt::format("{}: record {} at byte offset {}: {}: {}", path,
                        record_index, offset, DamageKindName(kind), detail)),
      path_(std::move(path)),
      offset_(offset),
      record_index_(record_index),
      kind_(kind),
      detail_(std::move(detail)) {}

}  // namespace recflow::records
