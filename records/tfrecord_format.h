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

#include "records/crc32c.h"

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
const char* VerifyFramesAhead(const char* p, const char* end);

}  // namespace recflow::records

#endif  // RECFLOW_RECORDS_TFRECORD_FORMAT_H_
