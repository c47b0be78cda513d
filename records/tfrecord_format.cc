#include "records/tfrecord_format.h"

#include <fmt/format.h>

namespace recflow::records {

DamageKind FrameFaultKind(FrameFault fault, bool length_verified) {
  switch (fault) {
    case FrameFault::kLengthCrc:
      return DamageKind::kLengthCrcMismatch;
    case FrameFault::kPastEnd:
      if (length_verified) return DamageKind::kTruncatedData;
      break;
    case FrameFault::kNone:
    case FrameFault::kOverMaximum:
      break;
  }
  return DamageKind::kImplausibleLength;
}

std::string FrameFaultDetail(FrameFault fault, bool length_verified,
                             const char* header, uint64_t max_record_bytes,
                             uint64_t left) {
  const uint64_t length = HeaderLength(header);
  switch (fault) {
    case FrameFault::kLengthCrc:
      return fmt::format(
          "length field reads {}; stored CRC {:#010x}, computed {:#010x}",
          length, HeaderStoredCrc(header), HeaderComputedCrc(header));
    case FrameFault::kOverMaximum:
      return fmt::format("length {} exceeds the maximum record size {}", length,
                         max_record_bytes);
    case FrameFault::kPastEnd:
      if (length_verified) {
        return fmt::format(
            "a record of {} bytes needs {} bytes with its framing, but the "
            "file ends {} bytes after its start",
            length, length + kFrameOverhead, left);
      }
      return fmt::format(
          "length {} runs past the end of the file ({} bytes left)", length,
          left);
    case FrameFault::kNone:
      break;
  }
  return "no fault";
}

std::string DataCrcDetail(const char* data, uint64_t length) {
  return fmt::format(
      "payload of {} bytes; stored CRC {:#010x}, computed "
      "{:#010x}",
      length, StoredDataCrc(data, length), crc32c::Value(data, length));
}

const char* VerifyFramesAhead(const char* p, const char* end) {
  const char* headers[kVerifyBatch];
  const char* data[kVerifyBatch];
  size_t eight[kVerifyBatch];
  size_t lengths[kVerifyBatch];
  uint32_t header_crcs[kVerifyBatch];
  uint32_t data_crcs[kVerifyBatch];
  size_t count = 0;
  const char* const start = p;
  while (count < kVerifyBatch && static_cast<size_t>(end - p) >= kHeaderBytes) {
    const uint64_t length = HeaderLength(p);
    if (length > kBatchedRecordBytes ||
        static_cast<size_t>(end - p) < length + kFrameOverhead) {
      break;
    }
    headers[count] = p;
    eight[count] = 8;
    data[count] = p + kHeaderBytes;
    lengths[count] = length;
    ++count;
    p += length + kFrameOverhead;
  }
  if (count < 2) return start;
  crc32c::ValueMany(headers, eight, header_crcs, count);
  crc32c::ValueMany(data, lengths, data_crcs, count);
  for (size_t i = 0; i < count; ++i) {
    if (header_crcs[i] != HeaderStoredCrc(headers[i]) ||
        data_crcs[i] != StoredDataCrc(data[i], lengths[i])) {
      return headers[i];
    }
  }
  return p;
}

}  // namespace recflow::records
