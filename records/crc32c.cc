#include "records/crc32c.h"

#include <algorithm>
#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace recflow::records::crc32c {
namespace {

// Reflected Castagnoli polynomial.
constexpr uint32_t kPoly = 0x82f63b78u;

// Slicing-by-8 tables: kTables[k][b] is the CRC state after byte b followed
// by k zero bytes.  Built at compile time.
constexpr std::array<std::array<uint32_t, 256>, 8> MakeTables() {
  std::array<std::array<uint32_t, 256>, 8> t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int i = 0; i < 8; ++i) c = (c >> 1) ^ ((c & 1) ? kPoly : 0);
    t[0][b] = c;
  }
  for (int k = 1; k < 8; ++k) {
    for (uint32_t b = 0; b < 256; ++b) {
      t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
    }
  }
  return t;
}
constexpr auto kTables = MakeTables();

inline uint64_t Load64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Raw (not pre/post inverted) state update; the state is the CRC register.
uint32_t RawPortable(uint32_t s, const char* data, size_t n) {
  auto p = reinterpret_cast<const unsigned char*>(data);
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    s = (s >> 8) ^ kTables[0][(s ^ *p++) & 0xff];
    --n;
  }
  while (n >= 8) {
    const uint64_t v = Load64(reinterpret_cast<const char*>(p)) ^ s;
    s = kTables[7][v & 0xff] ^ kTables[6][(v >> 8) & 0xff] ^
        kTables[5][(v >> 16) & 0xff] ^ kTables[4][(v >> 24) & 0xff] ^
        kTables[3][(v >> 32) & 0xff] ^ kTables[2][(v >> 40) & 0xff] ^
        kTables[1][(v >> 48) & 0xff] ^ kTables[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) s = (s >> 8) ^ kTables[0][(s ^ *p++) & 0xff];
  return s;
}

#if defined(__x86_64__)
// The crc32 instruction has a latency of three cycles and a throughput of
// one per cycle, so one dependent chain uses a third of the unit.  Three
// independent lanes over adjacent blocks keep it busy; their states are then
// combined with a "shift by L zero bytes" operator, which is linear over
// GF(2) and so a 4x256 table lookup (the approach of Intel's white paper
// "Fast CRC Computation for iSCSI Polynomial Using CRC32 Instruction").
// Two block lengths: long blocks for the bulk, short ones for the rest.
constexpr size_t kLongBlock = 8192;
constexpr size_t kShortBlock = 256;

struct ShiftTable {
  uint32_t t[4][256];
  uint32_t Apply(uint32_t s) const {
    return t[0][s & 0xff] ^ t[1][(s >> 8) & 0xff] ^ t[2][(s >> 16) & 0xff] ^
           t[3][s >> 24];
  }
};

ShiftTable MakeShiftTable(size_t zero_bytes) {
  static const char kZeros[kLongBlock] = {};
  uint32_t basis[32];
  for (int bit = 0; bit < 32; ++bit) {
    basis[bit] = RawPortable(uint32_t{1} << bit, kZeros, zero_bytes);
  }
  ShiftTable table{};
  for (int k = 0; k < 4; ++k) {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t v = 0;
      for (int bit = 0; bit < 8; ++bit) {
        if (b & (1u << bit)) v ^= basis[8 * k + bit];
      }
      table.t[k][b] = v;
    }
  }
  return table;
}

// Unaligned 8-byte loads cost nothing extra on the CPUs that have crc32,
// so no byte-wise alignment prologue: a short record's CRC is a chain of
// n/8 crc32q plus at most three shorter steps for the tail.
__attribute__((target("sse4.2"))) inline uint32_t RawOneLane(uint32_t s,
                                                             const char* p,
                                                             size_t n) {
  uint64_t c = s;
  while (n >= 8) {
    c = _mm_crc32_u64(c, Load64(p));
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  if (n & 4) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    c32 = _mm_crc32_u32(c32, v);
    p += 4;
  }
  if (n & 2) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    c32 = _mm_crc32_u16(c32, v);
    p += 2;
  }
  if (n & 1) c32 = _mm_crc32_u8(c32, static_cast<unsigned char>(*p));
  return c32;
}

template <size_t kBlock>
__attribute__((target("sse4.2"))) inline const char* ThreeLanes(
    uint64_t& c0, const char* p, size_t blocks, const ShiftTable& shift) {
  for (size_t i = 0; i < blocks; ++i) {
    uint64_t c1 = 0, c2 = 0;
    const char* end = p + kBlock;
    do {
      c0 = _mm_crc32_u64(c0, Load64(p));
      c1 = _mm_crc32_u64(c1, Load64(p + kBlock));
      c2 = _mm_crc32_u64(c2, Load64(p + 2 * kBlock));
      p += 8;
    } while (p < end);
    c0 = shift.Apply(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1);
    c0 = shift.Apply(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c2);
    p += 2 * kBlock;
  }
  return p;
}

__attribute__((target("sse4.2"))) uint32_t RawThreeLanes(uint32_t s,
                                                         const char* p,
                                                         size_t n) {
  static const ShiftTable kLongShift = MakeShiftTable(kLongBlock);
  static const ShiftTable kShortShift = MakeShiftTable(kShortBlock);
  uint64_t c0 = s;
  const size_t long_blocks = n / (3 * kLongBlock);
  p = ThreeLanes<kLongBlock>(c0, p, long_blocks, kLongShift);
  n -= long_blocks * 3 * kLongBlock;
  const size_t short_blocks = n / (3 * kShortBlock);
  p = ThreeLanes<kShortBlock>(c0, p, short_blocks, kShortShift);
  n -= short_blocks * 3 * kShortBlock;
  return RawOneLane(static_cast<uint32_t>(c0), p, n);
}

// What is left of a message: short tails inline, long ones in three lanes.
__attribute__((target("sse4.2"))) inline uint32_t RawTail(uint32_t s,
                                                          const char* p,
                                                          size_t n) {
  return n < 3 * kShortBlock ? RawOneLane(s, p, n) : RawThreeLanes(s, p, n);
}

bool DetectHardware() { return __builtin_cpu_supports("sse4.2"); }

// Folding with carry-less multiplies (VPCLMULQDQ on 512-bit registers),
// for long messages.  The crc32 instruction takes 8 bytes a cycle at most,
// even in three lanes; a carry-less multiply folds 16 bytes of the message
// forward onto bytes further on, and one 512-bit VPCLMULQDQ does four of
// those, so four accumulators of 64 bytes fold 256 bytes an iteration with
// the multiplies' latency hidden (the method of Intel's white paper "Fast
// CRC Computation for Generic Polynomials Using PCLMULQDQ Instruction",
// widened to AVX-512).
//
// In the reflected bit order of the crc32 instruction, a 16-byte block X
// at some place in the message stands for L(x) * x^64 + H(x), L and H its
// low and high 8 bytes read as reflected 64-bit polynomials.  Moving it D
// bytes on multiplies it by x^(8D); modulo P that is
// L * (x^(8D+64) mod P) + H * (x^(8D) mod P), and CRC-wise a value is as
// good as any other congruent to it modulo P.  A carry-less multiply of
// two reflected 64-bit values gives their product times x, and a 32-bit
// constant in the low half of a 64-bit lane stands for itself times x^32:
// hence the constants x^(8D+31) and x^(8D-33) (FoldConstants).  Once
// everything is folded onto the last 16 bytes, the crc32 instruction
// reduces those to the register, which is the CRC of the folded prefix.
constexpr size_t kFoldBlock = 256;

// x^n mod P, as a register value (reflected: bit 31 is x^0).
uint32_t XPowModP(size_t n) {
  uint32_t r = 0x80000000u;
  for (size_t i = 0; i < n; ++i) r = (r >> 1) ^ ((r & 1) ? kPoly : 0);
  return r;
}

// The multipliers that move a 16-byte block `bytes` bytes on: for its low
// qword (in lane 0) and its high qword (lane 1).
struct FoldConstants {
  uint32_t low;
  uint32_t high;
  explicit FoldConstants(size_t bytes)
      : low(XPowModP(8 * bytes + 31)), high(XPowModP(8 * bytes - 33)) {}
};

__attribute__((target("sse4.2,pclmul"))) inline __m128i Fold128(__m128i x,
                                                                __m128i k) {
  return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00),
                       _mm_clmulepi64_si128(x, k, 0x11));
}

__attribute__((target("sse4.2,pclmul"))) inline __m128i Constants128(
    const FoldConstants& k) {
  return _mm_set_epi64x(k.high, k.low);
}
// The same in each of four lanes.  (Not _mm512_broadcast_i32x4, nor the
// plain extract and zero-extend below: GCC 12's forms of those read an
// "undefined" vector that -Wuninitialized reports.)
__attribute__((target("avx512f"))) inline __m512i Constants512(
    const FoldConstants& k) {
  return _mm512_set_epi64(k.high, k.low, k.high, k.low, k.high, k.low, k.high,
                          k.low);
}
// 16-byte lane `i` of x.
template <int i>
__attribute__((target("avx512f"))) inline __m128i Lane(__m512i x) {
  return _mm512_maskz_extracti32x4_epi32(0xf, x, i);
}

// x moved on by the constants' distance, xor y, in each 128-bit lane.
__attribute__((target("avx512f,vpclmulqdq"))) inline __m512i Fold512(
    __m512i x, __m512i k, __m512i y) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00),
                                   _mm512_clmulepi64_epi128(x, k, 0x11), y,
                                   0x96);
}

// The register after `n` >= kFoldBlock bytes from register `s`.
__attribute__((target("avx512f,vpclmulqdq,sse4.2,pclmul"))) uint32_t RawFold(
    uint32_t s, const char* p, size_t n) {
  static const FoldConstants k256(kFoldBlock), k64(64), k48(48), k32(32),
      k16(16);
  const __m512i by256 = Constants512(k256);
  const __m512i by64 = Constants512(k64);
  // The register enters as the first four bytes xor'd with it.
  __m512i x0 = _mm512_xor_si512(
      _mm512_loadu_si512(p), _mm512_maskz_set1_epi32(1, static_cast<int>(s)));
  __m512i x1 = _mm512_loadu_si512(p + 64);
  __m512i x2 = _mm512_loadu_si512(p + 128);
  __m512i x3 = _mm512_loadu_si512(p + 192);
  p += kFoldBlock;
  n -= kFoldBlock;
  for (; n >= kFoldBlock; p += kFoldBlock, n -= kFoldBlock) {
    x0 = Fold512(x0, by256, _mm512_loadu_si512(p));
    x1 = Fold512(x1, by256, _mm512_loadu_si512(p + 64));
    x2 = Fold512(x2, by256, _mm512_loadu_si512(p + 128));
    x3 = Fold512(x3, by256, _mm512_loadu_si512(p + 192));
  }
  // The four accumulators onto the last, then 64-byte blocks onto it.
  x1 = Fold512(x0, by64, x1);
  x2 = Fold512(x1, by64, x2);
  x3 = Fold512(x2, by64, x3);
  for (; n >= 64; p += 64, n -= 64) {
    x3 = Fold512(x3, by64, _mm512_loadu_si512(p));
  }
  // Its four 16-byte lanes onto the last.
  __m128i a = Lane<3>(x3);
  a = _mm_xor_si128(a, Fold128(Lane<0>(x3), Constants128(k48)));
  a = _mm_xor_si128(a, Fold128(Lane<1>(x3), Constants128(k32)));
  a = _mm_xor_si128(a, Fold128(Lane<2>(x3), Constants128(k16)));
  uint64_t c = _mm_crc32_u64(0, static_cast<uint64_t>(_mm_cvtsi128_si64(a)));
  c = _mm_crc32_u64(c, static_cast<uint64_t>(_mm_extract_epi64(a, 1)));
  return RawOneLane(static_cast<uint32_t>(c), p, n);
}

// From this length on a message is folded on its own rather than
// interleaved with two others on the crc32 instruction: 32 messages of 512
// bytes 11.7 ns each against 13.7, of 1,000 bytes 20 against 28 (crc32c
// bench, AMD EPYC, 2026-11-28); of 256 bytes, 6 ns either way.
constexpr size_t kFoldAlone = 512;

// What Extend uses where folding is available: below kFoldBlock one lane
// (shorter than the three lanes' blocks, 3 x 256 bytes, that is what
// RawThreeLanes would run).
__attribute__((target("sse4.2"))) uint32_t RawFoldOrLanes(uint32_t s,
                                                          const char* p,
                                                          size_t n) {
  return n >= kFoldBlock ? RawFold(s, p, n) : RawOneLane(s, p, n);
}

// Three independent messages at once: while their lengths overlap the three
// chains run in parallel, which is what makes short records cheap to check.
// With kFold, a triple of messages of kFoldAlone bytes or more is folded
// one message at a time instead (one longer than the others still runs
// its rest in three lanes, RawTail).
template <bool kFold>
__attribute__((target("sse4.2"))) void RawMany(const char* const* data,
                                               const size_t* sizes,
                                               uint32_t* out, size_t count) {
  size_t i = 0;
  for (; i + 3 <= count; i += 3) {
    const char *a = data[i], *b = data[i + 1], *c = data[i + 2];
    const size_t common =
        std::min({sizes[i], sizes[i + 1], sizes[i + 2]}) & ~size_t{7};
    if (kFold && common >= kFoldAlone) {
      out[i] = ~RawFold(~0u, a, sizes[i]);
      out[i + 1] = ~RawFold(~0u, b, sizes[i + 1]);
      out[i + 2] = ~RawFold(~0u, c, sizes[i + 2]);
      continue;
    }
    uint64_t ca = ~0u, cb = ~0u, cc = ~0u;
    for (size_t j = 0; j < common; j += 8) {
      ca = _mm_crc32_u64(ca, Load64(a + j));
      cb = _mm_crc32_u64(cb, Load64(b + j));
      cc = _mm_crc32_u64(cc, Load64(c + j));
    }
    out[i] = ~RawTail(static_cast<uint32_t>(ca), a + common, sizes[i] - common);
    out[i + 1] =
        ~RawTail(static_cast<uint32_t>(cb), b + common, sizes[i + 1] - common);
    out[i + 2] =
        ~RawTail(static_cast<uint32_t>(cc), c + common, sizes[i + 2] - common);
  }
  for (; i < count; ++i) {
    out[i] = kFold ? ~RawFoldOrLanes(~0u, data[i], sizes[i])
                   : ~RawTail(~0u, data[i], sizes[i]);
  }
}

bool DetectFold() {
  return __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("pclmul") &&
         __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("vpclmulqdq");
}
#else
uint32_t RawOneLane(uint32_t s, const char* p, size_t n) {
  return RawPortable(s, p, n);
}
uint32_t RawThreeLanes(uint32_t s, const char* p, size_t n) {
  return RawPortable(s, p, n);
}
template <bool kFold>
void RawMany(const char* const* data, const size_t* sizes, uint32_t* out,
             size_t count) {
  for (size_t i = 0; i < count; ++i) {
    out[i] = ~RawPortable(~0u, data[i], sizes[i]);
  }
}
bool DetectHardware() { return false; }
uint32_t RawFoldOrLanes(uint32_t s, const char* p, size_t n) {
  return RawPortable(s, p, n);
}

bool DetectFold() { return false; }
#endif

using RawFn = uint32_t (*)(uint32_t, const char*, size_t);

RawFn Choose() {
  if (DetectFold()) return RawFoldOrLanes;
  return DetectHardware() ? RawThreeLanes : RawPortable;
}

}  // namespace

uint32_t Extend(uint32_t crc, const char* data, size_t n) {
  static const RawFn raw = Choose();
  return ~raw(~crc, data, n);
}

void ValueMany(const char* const* data, const size_t* sizes, uint32_t* out,
               size_t count) {
  if (FoldAvailable()) {
    RawMany<true>(data, sizes, out, count);
  } else if (HardwareAvailable()) {
    RawMany<false>(data, sizes, out, count);
  } else {
    for (size_t i = 0; i < count; ++i)
      out[i] = ExtendPortable(0, data[i], sizes[i]);
  }
}

void ValueManyHardware(const char* const* data, const size_t* sizes,
                       uint32_t* out, size_t count) {
  RawMany<false>(data, sizes, out, count);
}

uint32_t ExtendPortable(uint32_t crc, const char* data, size_t n) {
  return ~RawPortable(~crc, data, n);
}

uint32_t ExtendHardware(uint32_t crc, const char* data, size_t n) {
  return ~RawThreeLanes(~crc, data, n);
}

uint32_t ExtendHardwareOneLane(uint32_t crc, const char* data, size_t n) {
  return ~RawOneLane(~crc, data, n);
}

uint32_t ExtendFold(uint32_t crc, const char* data, size_t n) {
  return ~RawFoldOrLanes(~crc, data, n);
}

bool FoldAvailable() {
  static const bool available = DetectFold();
  return available;
}

bool HardwareAvailable() {
  static const bool available = DetectHardware();
  return available;
}

const char* ImplementationName() {
  if (FoldAvailable()) return "avx512-vpclmulqdq";
  return HardwareAvailable() ? "sse4.2-3way" : "portable-slicing8";
}

}  // namespace recflow::records::crc32c
