#include "records/tfrecord_format.h"

#include <fmt/format.h>

#include <algorithm>

#include "records/compression.h"

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

std::string StartOfStreamHint(std::string_view first) {
  const auto byte = [&](size_t i) {
    return i < first.size() ? static_cast<unsigned char>(first[i]) : 0u;
  };
  const auto starts = [&](std::string_view magic) {
    return first.substr(0, magic.size()) == magic;
  };
  std::string what, advice;
  // gzip and zstd by their magic, as a reader told "auto" finds them.
  if (const Compression c = DetectCompression(first, "");
      c == Compression::kGzip || c == Compression::kZstd) {
    what = fmt::format("{} data", CompressionName(c));
    advice = fmt::format("give --compression {}", CompressionName(c));
  } else if (first.size() >= 2 && (byte(0) & 0x0f) == 8 &&
             (byte(0) * 256 + byte(1)) % 31 == 0) {
    what = "ZLIB data";
    advice = "give --compression zlib (or name it .zz)";
  } else if (starts("PK\x03\x04")) {
    what = "a ZIP archive";
    advice = "an .npz converts with `recflow convert npz`";
  } else if (starts("\x93NUMPY")) {
    what = "a NumPy .npy file";
    advice = "convert it with `recflow convert npy`";
  } else if (first.size() >= 4 && byte(0) == 0 && byte(1) == 0 &&
             byte(2) == 8 && byte(3) >= 1 && byte(3) <= 4) {
    what = "an IDX file";
    advice = "convert it with `recflow convert idx`";
  } else if (!first.empty() &&
             std::all_of(first.begin(), first.end(), [](char c) {
               const auto u = static_cast<unsigned char>(c);
               return u >= 0x20 || c == '\n' || c == '\r' || c == '\t';
             })) {
    what = "text";
    advice =
        "if it is CSV or JSON Lines, convert it with `recflow convert "
        "csv|jsonl`";
  }
  if (what.empty()) return "";
  return fmt::format("; the stream starts like {}, not a TFRecord frame: {}",
                     what, advice);
}

std::string DataCrcDetail(const char* data, uint64_t length) {
  return fmt::format(
      "payload of {} bytes; stored CRC {:#010x}, computed "
      "{:#010x}",
      length, StoredDataCrc(data, length), crc32c::Value(data, length));
}

const char* VerifyFramesAhead(const char* p, const char* end,
                              std::vector<VerifiedFrame>* frames) {
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
    if (frames != nullptr) frames->push_back({lengths[i], data_crcs[i]});
  }
  return p;
}

}  // namespace recflow::records
