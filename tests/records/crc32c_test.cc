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

TEST(Crc32cTest, HardwareMatchesPortableForEveryLengthAtRandomAlignments) {
  if (!HardwareAvailable()) GTEST_SKIP() << "no SSE4.2 on this CPU";
  std::mt19937_64 rng(42);
  std::vector<char> buffer(4096 + 64);
  for (auto& c : buffer) c = static_cast<char>(rng());
  for (size_t n = 0; n <= 4096; ++n) {
    const size_t align = rng() % 64;
    const char* p = buffer.data() + align;
    const uint32_t seed = static_cast<uint32_t>(rng());
    ASSERT_EQ(ExtendHardware(seed, p, n), ExtendPortable(seed, p, n))
        << "length " << n << " alignment " << align;
    ASSERT_EQ(ExtendHardwareOneLane(seed, p, n), ExtendPortable(seed, p, n))
        << "length " << n << " alignment " << align;
  }
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
  EXPECT_STREQ(ImplementationName(),
               HardwareAvailable() ? "sse4.2-3way" : "portable-slicing8");
}

}  // namespace
}  // namespace recflow::records::crc32c
