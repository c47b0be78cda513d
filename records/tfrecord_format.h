// The TFRecord framing, as TensorFlow writes it (record_writer.cc):
//
//   uint64 length                     little-endian
//   uint32 masked_crc32c(length)      of the 8 length bytes
//   byte   data[length]
//   uint32 masked_crc32c(data)
//
// These helpers encode and decode one frame; they allocate nothing and are
// safe to call from any thread.
#ifndef RECFLOW_RECORDS_TFRECORD_FORMAT_H_
#define RECFLOW_RECORDS_TFRECORD_FORMAT_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "records/crc32c.h"
#include "records/errors.h"

namespace recflow::records {

inline constexpr size_t kHeaderBytes = 12;  // length + its CRC
inline constexpr size_t kFooterBytes = 4;   // data CRC
inline constexpr size_t kFrameOverhead = kHeaderBytes + kFooterBytes;

// The on-disk integers are little-endian; so are the hosts recflow builds for
// (x86-64, AArch64), which lets decoding be a plain load.
static_assert(std::endian::native == std::endian::little,
              "recflow assumes a little-endian host");

template <typename T>
inline T DecodeLittleEndian(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename T>
inline void EncodeLittleEndian(char* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

inline uint64_t HeaderLength(const char* header) {
  return DecodeLittleEndian<uint64_t>(header);
}
inline uint32_t HeaderStoredCrc(const char* header) {
  return crc32c::Unmask(DecodeLittleEndian<uint32_t>(header + 8));
}
inline uint32_t HeaderComputedCrc(const char* header) {
  return crc32c::Value(header, 8);
}
// True when the 12 bytes at `header` are a length and its matching CRC.
inline bool HeaderChecks(const char* header) {
  return HeaderStoredCrc(header) == HeaderComputedCrc(header);
}

// The one check of a frame's header, for every reader of frames (the
// streaming reader, the pipeline's reader, the index reader, the parallel
// scan's resynchronisation, saved references): the first thing wrong with
// the frame whose 12-byte header is at `header`, in this order --
//   kLengthCrc: the length does not match its CRC (checked only when
//               `verify_crc`; a caller that verified the frame ahead, with
//               VerifyFramesAhead, passes false);
//   kOverMaximum: the length is over `max_record_bytes`;
//   kPastEnd: the frame (length + 16) is longer than the `left` bytes from
//             its start to the end of the input (UINT64_MAX when unknown).
// Cheap enough to try at every byte offset; FrameFaultDetail says it in
// words only when it is reported.
enum class FrameFault : uint8_t { kNone, kLengthCrc, kOverMaximum, kPastEnd };
inline FrameFault CheckFrameHeader(const char* header, bool verify_crc,
                                   uint64_t max_record_bytes, uint64_t left) {
  if (verify_crc && !HeaderChecks(header)) return FrameFault::kLengthCrc;
  const uint64_t length = HeaderLength(header);
  if (length > max_record_bytes) return FrameFault::kOverMaximum;
  if (left < kFrameOverhead || length > left - kFrameOverhead) {
    return FrameFault::kPastEnd;
  }
  return FrameFault::kNone;
}
// How a fault is reported (RecordError, a salvage report): a length past
// the end is truncated data when the length was verified, and an
// implausible length when not (it may as well be a damaged length).
DamageKind FrameFaultKind(FrameFault fault, bool length_verified);
// Expected against found for a fault of the header at `header`, with the
// `max_record_bytes` and `left` it was checked against.
std::string FrameFaultDetail(FrameFault fault, bool length_verified,
                             const char* header, uint64_t max_record_bytes,
                             uint64_t left);
// For a fault in the first frame of a stream, whose first bytes (`first`,
// up to a header's 12) may be another format: "; the stream starts like
// gzip data, not a TFRecord frame: give --compression gzip" and the like
// for gzip, zstd, zlib, ZIP (.npz), .npy, IDX and text (CSV, JSON Lines);
// "" when they look like nothing known.
std::string StartOfStreamHint(std::string_view first);

// Whether the `length` payload bytes at `data` match the CRC stored in the
// 4 bytes after them.
inline uint32_t StoredDataCrc(const char* data, uint64_t length) {
  return crc32c::Unmask(DecodeLittleEndian<uint32_t>(data + length));
}
inline bool DataChecks(const char* data, uint64_t length) {
  return crc32c::Value(data, length) == StoredDataCrc(data, length);
}
// "payload of N bytes; stored CRC ..., computed ..." for a failed DataChecks.
std::string DataCrcDetail(const char* data, uint64_t length);

inline void EncodeHeader(char* header, uint64_t length) {
  EncodeLittleEndian<uint64_t>(header, length);
  EncodeLittleEndian<uint32_t>(header + 8,
                               crc32c::Mask(crc32c::Value(header, 8)));
}
inline void EncodeFooter(char* footer, const char* data, size_t n) {
  EncodeLittleEndian<uint32_t>(footer, crc32c::Mask(crc32c::Value(data, n)));
}

// Checks both CRCs of the complete frames starting at `p` (up to `end`) of
// up to kVerifyBatch records of at most kBatchedRecordBytes each, three
// records at a time (crc32c::ValueMany), and returns the end of the prefix
// whose frames all check.  Returns `p` when fewer than two frames qualify:
// single records are as fast on the one-record path, which also reports.
inline constexpr size_t kVerifyBatch = 32;
inline constexpr uint64_t kBatchedRecordBytes = 4096;
// A frame VerifyFramesAhead checked: its payload's length and data CRC
// (unmasked, as StoredDataCrc gives it), so that a reader need not read
// its header and footer again.
struct VerifiedFrame {
  uint64_t length = 0;
  uint32_t data_crc = 0;
};
// With `frames`, also appends the frames of the prefix that checks, in
// order.
const char* VerifyFramesAhead(const char* p, const char* end,
                              std::vector<VerifiedFrame>* frames = nullptr);

}  // namespace recflow::records

#endif  // RECFLOW_RECORDS_TFRECORD_FORMAT_H_
