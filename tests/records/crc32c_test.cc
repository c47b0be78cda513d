#include "records/crc32c.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "test_util.h"

namespace recflow::records::crc32c {
namespace {

TEST(Crc32cTest, StandardCheckValue) {
  EXPECT_EQ(Value("123456789"), 0xE3069283u);
}

// RFC 3720 (iSCSI), appendix B.4.
TEST(Crc32cTest, Rfc3720Vectors) {
  EXPECT_EQ(Value(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Value(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(Value(ascending), 0x46DD794Eu);
  EXPECT_EQ(Value(descending), 0x113FDB5Cu);
}

TEST(Crc32cTest, EmptyInputIsZero) { EXPECT_EQ(Value(""), 0u); }

TEST(Crc32cTest, ExtendEqualsValueOfConcatenation) {
  const std::string a = "hello, ", b = "tfrecord world";
  EXPECT_EQ(Extend(Value(a), b.data(), b.size()), Value(a + b));
}

using ExtendFn = uint32_t (*)(uint32_t, const char*, size_t);

// `fn` against the portable loop for every length up to 4 KiB, each at a
// random alignment and from a random register.
void ExpectEveryLengthMatchesPortable(ExtendFn fn, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<char> buffer(4096 + 64);
  for (auto& c : buffer) c = static_cast<char>(rng());
  for (size_t n = 0; n <= 4096; ++n) {
    const size_t align = rng() % 64;
    const char* p = buffer.data() + align;
    const uint32_t crc = static_cast<uint32_t>(rng());
    ASSERT_EQ(fn(crc, p, n), ExtendPortable(crc, p, n))
        << "length " << n << " alignment " << align;
  }
}

TEST(Crc32cTest, HardwareMatchesPortableForEveryLengthAtRandomAlignments) {
  if (!HardwareAvailable()) GTEST_SKIP() << "no SSE4.2 on this CPU";
  ExpectEveryLengthMatchesPortable(ExtendHardware, 42);
  ExpectEveryLengthMatchesPortable(ExtendHardwareOneLane, 43);
}

// Lengths that exercise the three-lane blocks (8 KiB and 256 B lanes) and
// their remainders.
TEST(Crc32cTest, HardwareMatchesPortableOnLargeBuffers) {
  if (!HardwareAvailable()) GTEST_SKIP() << "no SSE4.2 on this CPU";
  std::mt19937_64 rng(7);
  // Room for the longest length at the largest alignment below.
  std::vector<char> buffer((1 << 20) + 8192 + 8);
  for (auto& c : buffer) c = static_cast<char>(rng());
  for (size_t n :
       {size_t{3 * 8192}, size_t{3 * 8192 + 1}, size_t{3 * 256},
        size_t{3 * 256 * 5 + 17}, size_t{1} << 20, (size_t{1} << 20) + 8191}) {
    for (size_t align : {0, 1, 7}) {
      ASSERT_EQ(ExtendHardware(0, buffer.data() + align, n),
                ExtendPortable(0, buffer.data() + align, n))
          << n << " at " << align;
    }
  }
}

// Folding runs from 256 bytes: 256-byte rounds, then 64-byte ones, then
// the tail on the crc32 instruction; every length up to 4 KiB crosses each
// of those boundaries.
TEST(Crc32cTest, FoldMatchesPortableForEveryLengthAtRandomAlignments) {
  if (!FoldAvailable()) {
    GTEST_SKIP() << "no AVX-512 with VPCLMULQDQ on this CPU: "
                 << ImplementationName() << " is used";
  }
  ExpectEveryLengthMatchesPortable(ExtendFold, 11);
}

TEST(Crc32cTest, FoldMatchesPortableOnLargeBuffers) {
  if (!FoldAvailable()) GTEST_SKIP() << "no AVX-512 with VPCLMULQDQ";
  std::mt19937_64 rng(13);
  std::vector<char> buffer((1 << 20) + 8192 + 8);
  for (auto& c : buffer) c = static_cast<char>(rng());
  for (size_t n : {size_t{1} << 20, (size_t{1} << 20) + 8191,
                   size_t{65536 + 255}, size_t{65536 + 64 + 7}}) {
    for (size_t align : {0, 1, 7}) {
      ASSERT_EQ(ExtendFold(~0u, buffer.data() + align, n),
                ExtendPortable(~0u, buffer.data() + align, n))
          << n << " at " << align;
    }
  }
  // Extend goes through the same path in pieces: the register carries on.
  const char* p = buffer.data();
  uint32_t crc = 0;
  for (size_t piece : {300, 5000, 17, 256, 70000}) {
    crc = Extend(crc, p, piece);
    p += piece;
  }
  EXPECT_EQ(crc, ExtendPortable(0, buffer.data(), p - buffer.data()));
}

// Batches as the reader checks them: short and long messages in every mix
// of a triple, and counts that leave one or two over.
TEST(Crc32cTest, ValueManyMatchesValueOneByOne) {
  std::mt19937_64 rng(17);
  std::vector<char> buffer(8192 + 64);
  for (auto& c : buffer) c = static_cast<char>(rng());
  const size_t lengths[] = {0,   7,   100,  255,  256, 511,
                            512, 513, 1000, 3203, 4096};
  for (size_t count : {1, 2, 3, 4, 5, 31, 32, 33}) {
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<const char*> data(count);
      std::vector<size_t> sizes(count);
      for (size_t i = 0; i < count; ++i) {
        sizes[i] = lengths[rng() % std::size(lengths)];
        data[i] = buffer.data() + rng() % 64;
      }
      std::vector<uint32_t> out(count), baseline(count);
      ValueMany(data.data(), sizes.data(), out.data(), count);
      if (HardwareAvailable()) {
        ValueManyHardware(data.data(), sizes.data(), baseline.data(), count);
      }
      for (size_t i = 0; i < count; ++i) {
        const uint32_t expected = ExtendPortable(0, data[i], sizes[i]);
        ASSERT_EQ(out[i], expected) << "message " << i << " of " << count
                                    << ", " << sizes[i] << " bytes";
        if (HardwareAvailable()) {
          ASSERT_EQ(baseline[i], expected);
        }
      }
    }
  }
}

TEST(Crc32cTest, MatchesTheBitwiseDefinition) {
  const auto payloads = testing::RandomPayloads(200, 3000, 99);
  for (const auto& p : payloads) {
    ASSERT_EQ(Value(p), testing::ReferenceCrc32c(p));
  }
}

TEST(Crc32cTest, MaskIsTensorFlows) {
  const uint32_t crc = Value("123456789");
  EXPECT_EQ(Mask(crc), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
  EXPECT_NE(Mask(crc), crc);
  EXPECT_NE(Mask(Mask(crc)), crc);
  EXPECT_EQ(Unmask(Mask(crc)), crc);
  for (uint32_t v : {0u, 1u, 0xffffffffu, 0x80000000u, 0x12345678u}) {
    EXPECT_EQ(Unmask(Mask(v)), v);
  }
}

TEST(Crc32cTest, ImplementationIsReported) {
  EXPECT_STREQ(ImplementationName(), FoldAvailable() ? "avx512-vpclmulqdq"
                                     : HardwareAvailable()
                                         ? "sse4.2-3way"
                                         : "portable-slicing8");
}

}  // namespace
}  // namespace recflow::records::crc32c
