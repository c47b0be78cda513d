// CRC-32C (Castagnoli), as used by TFRecord framing, and TensorFlow's masking.
//
// Thread safety: every function here is pure and may be called concurrently.
// The implementation is chosen once, at first use: where the CPU has
// AVX-512 with VPCLMULQDQ, messages of 256 bytes or more are folded with
// carry-less multiplies (~2x the crc32 instruction's rate) and shorter ones
// go through the crc32 instruction; else SSE4.2's crc32 instruction over
// three interleaved lanes; else a portable slicing-by-8 table loop (see
// crc32c.cc for why each).
#ifndef RECFLOW_RECORDS_CRC32C_H_
#define RECFLOW_RECORDS_CRC32C_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace recflow::records::crc32c {

// Returns the CRC-32C of `data` appended to a message whose CRC-32C was `crc`
// (pass 0 to start).  Extend(Extend(0, a), b) == Value(a + b).
uint32_t Extend(uint32_t crc, const char* data, size_t n);

inline uint32_t Value(const char* data, size_t n) { return Extend(0, data, n); }
inline uint32_t Value(std::string_view data) {
  return Extend(0, data.data(), data.size());
}

// out[i] = Value(data[i], sizes[i]) for i < count.  Independent messages are
// interleaved so that short ones (records of ~100 bytes) do not each wait
// out the crc32 instruction's latency; where folding is available, three
// in a row of 512 bytes or more are folded one by one instead.
void ValueMany(const char* const* data, const size_t* sizes, uint32_t* out,
               size_t count);

// The implementations, exposed for tests and benchmarks.  ExtendHardware
// (the crc32 instruction in three lanes) must only be called when
// HardwareAvailable() is true.
uint32_t ExtendPortable(uint32_t crc, const char* data, size_t n);
uint32_t ExtendHardware(uint32_t crc, const char* data, size_t n);
// ValueMany on the crc32 instruction alone, three messages interleaved:
// the baseline for folding the long ones.  HardwareAvailable() only.
void ValueManyHardware(const char* const* data, const size_t* sizes,
                       uint32_t* out, size_t count);
// One lane of the crc32 instruction, 8 bytes at a time: the baseline the
// three-lane version is measured against.
uint32_t ExtendHardwareOneLane(uint32_t crc, const char* data, size_t n);
bool HardwareAvailable();
// Carry-less multiply folding (AVX-512 VPCLMULQDQ) for messages of 256
// bytes or more, one lane of the crc32 instruction below that: what
// Extend() runs where FoldAvailable().  Must only be called when
// FoldAvailable() is true.
uint32_t ExtendFold(uint32_t crc, const char* data, size_t n);
bool FoldAvailable();
// "avx512-vpclmulqdq", "sse4.2-3way" or "portable-slicing8": what Extend()
// uses on this machine.
const char* ImplementationName();

// TensorFlow's (and LevelDB's) masking of stored CRCs, so that the CRC of a
// string that itself holds CRCs is not degenerate.
inline constexpr uint32_t kMaskDelta = 0xa282ead8u;
inline constexpr uint32_t Mask(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + kMaskDelta;
}
inline constexpr uint32_t Unmask(uint32_t masked) {
  const uint32_t rot = masked - kMaskDelta;
  return (rot >> 17) | (rot << 15);
}

}  // namespace recflow::records::crc32c

#endif  // RECFLOW_RECORDS_CRC32C_H_
