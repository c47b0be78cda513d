#include "records/compression.h"

#include <gtest/gtest.h>

#include "records/tfrecord_format.h"

namespace recflow::records {
namespace {

using namespace std::literals;

TEST(CompressionTest, DetectsMagicBytes) {
  EXPECT_EQ(DetectCompression("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03"
                              "ab"sv,
                              "x.tfrecord"),
            Compression::kGzip);
  EXPECT_EQ(DetectCompression(
                "\x28\xb5\x2f\xfd\x24\x00\x00\x00\x00\x00\x00\x00"sv, "x"),
            Compression::kZstd);
}

TEST(CompressionTest, ZlibOnlyBySuffix) {
  EXPECT_EQ(
      DetectCompression("\x78\x9c\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a",
                        "data.tfrecord.zz"),
      Compression::kZlib);
  EXPECT_EQ(DetectCompression("\x78\x9c\x01\x02", "data.zlib"),
            Compression::kZlib);
  EXPECT_EQ(DetectCompression("\x78\x9c\x01\x02", "data.tfrecord"),
            Compression::kNone);
}

// A first record of 35615 (0x8b1f) bytes starts with the gzip magic; its
// valid header says it is an uncompressed stream.
TEST(CompressionTest, ValidRecordHeaderWinsOverMagic) {
  char header[kHeaderBytes];
  EncodeHeader(header, 0x8b1f);
  ASSERT_EQ(static_cast<unsigned char>(header[0]), 0x1f);
  ASSERT_EQ(static_cast<unsigned char>(header[1]), 0x8b);
  EXPECT_EQ(DetectCompression(std::string_view(header, 12), "a.gz"),
            Compression::kNone);
  header[9] ^= 1;  // now not a valid header: the magic decides
  EXPECT_EQ(DetectCompression(std::string_view(header, 12), "a"),
            Compression::kGzip);
}

TEST(CompressionTest, NamesAndSuffixesRoundTrip) {
  for (Compression c : {Compression::kNone, Compression::kZlib,
                        Compression::kGzip, Compression::kZstd}) {
    EXPECT_EQ(ParseCompression(CompressionName(c)), c);
    EXPECT_EQ(CompressionFromSuffix(std::string("f.tfrecord") +
                                    std::string(CompressionSuffix(c))),
              c);
  }
  EXPECT_EQ(ParseCompression("GZIP"), Compression::kGzip);
  EXPECT_EQ(ParseCompression(""), Compression::kNone);
  EXPECT_EQ(ParseCompression("lz4"), std::nullopt);
}

}  // namespace
}  // namespace recflow::records
