// Inputs built to hurt: lengths of 2^63, an 11-byte varint, a packed list
// claiming 10^9 elements in a 100-byte record, zlib / gzip / zstd bombs,
// groups nested past any sane depth, and every truncation of a valid
// Example.  Each must end in a clear error (or, for truncations that happen
// to be valid, in what protobuf itself reads), and the ones that claim
// huge sizes run in a child process whose address space is capped far
// below the claim (testing::CapAddressSpace; not under AddressSanitizer,
// whose shadow memory needs the address space, where they run uncapped).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <zlib.h>
#include <zstd.h>

#include <cstdlib>

#include "records/errors.h"
#include "records/example.pb.h"
#include "records/example_builder.h"
#include "records/example_parser.h"
#include "records/feature_spec.h"
#include "records/tfrecord_reader.h"
#include "records/tfrecord_writer.h"
#include "test_util.h"

namespace recflow::records {
namespace {

using testing::TempDir;

constexpr uint64_t kCap = uint64_t{512} << 20;  // the children's memory

std::string Varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
  return out;
}
std::string Len(uint32_t field, const std::string& body) {
  return Varint(field << 3 | 2) + Varint(body.size()) + body;
}
// An Example whose one feature `key` is `feature` (a serialized Feature).
std::string ExampleWith(const std::string& key, const std::string& feature) {
  return Len(1, Len(1, Len(1, key) + Len(2, feature)));
}

const ExampleParser& Parser() {
  static const ExampleParser parser(FeatureSpec::FromJsonText(R"({
    "features": {"ids": {"kind": "var", "dtype": "int64"},
                 "x": {"kind": "fixed", "dtype": "float32", "shape": [2],
                       "default": 0}}})"));
  return parser;
}

// The error parsing one Example, "" when it parses.
std::string ParseErrorOf(std::string_view example) {
  ParsedBatch out;
  const std::string_view batch[] = {example};
  try {
    Parser().ParseBatch(batch, &out, {.file = "f.tfrecord", .first_record = 7});
  } catch (const ParseError& e) {
    return e.what();
  }
  return "";
}

// Runs `body` in a child capped at kCap bytes of address space; the child
// exits 0 when `body` returns true.
template <typename Fn>
void InCappedChild(Fn body) {
  EXPECT_EXIT(
      {
        testing::CapAddressSpace(kCap);
        std::exit(body() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(HostileInputTest, ALengthOfTwoToTheSixtyThreeInEachCompression) {
  TempDir dir;
  // A header with a valid length CRC claiming 2^63 bytes, then 100 bytes.
  std::string frame = testing::ReferenceFrame(std::string(100, 'x'));
  const uint64_t huge = uint64_t{1} << 63;
  std::memcpy(frame.data(), &huge, 8);
  const uint32_t crc =
      testing::ReferenceMask(testing::ReferenceCrc32c(frame.substr(0, 8)));
  std::memcpy(frame.data() + 8, &crc, 4);
  for (Compression c : {Compression::kNone, Compression::kZlib,
                        Compression::kGzip, Compression::kZstd}) {
    const std::string path =
        dir.File(fmt::format("huge-{}.tfrecord", CompressionName(c)));
    const std::string stream = c == Compression::kNone ? frame : [&] {
      // Compress the raw stream with the codec directly.
      std::string out;
      if (c == Compression::kZstd) {
        out.resize(ZSTD_compressBound(frame.size()));
        out.resize(ZSTD_compress(out.data(), out.size(), frame.data(),
                                 frame.size(), 3));
      } else {
        z_stream z{};
        deflateInit2(&z, 6, Z_DEFLATED,
                     c == Compression::kGzip ? 16 + MAX_WBITS : MAX_WBITS, 8,
                     Z_DEFAULT_STRATEGY);
        out.resize(deflateBound(&z, frame.size()));
        z.next_in = reinterpret_cast<Bytef*>(frame.data());
        z.avail_in = static_cast<uInt>(frame.size());
        z.next_out = reinterpret_cast<Bytef*>(out.data());
        z.avail_out = static_cast<uInt>(out.size());
        deflate(&z, Z_FINISH);
        out.resize(z.total_out);
        deflateEnd(&z);
      }
      return out;
    }();
    testing::WriteFileBytes(path, stream);
    InCappedChild([&] {
      try {
        ReaderOptions o;
        o.compression = c;
        testing::ReadRecords(path, o);
      } catch (const RecordError& e) {
        return e.path() == path && e.offset() == 0 &&
               (e.kind() == DamageKind::kImplausibleLength ||
                e.kind() == DamageKind::kTruncatedData);
      }
      return false;
    });
  }
}

TEST(HostileInputTest, AnElevenByteVarintIsRefused) {
  // 10 continuation bytes then a final one: longer than any 64-bit varint.
  const std::string varint = std::string(10, '\xff') + "\x01";
  const std::string list = Varint(1 << 3 | 0) + varint;  // unpacked int64
  const std::string error = ParseErrorOf(ExampleWith("ids", Len(3, list)));
  EXPECT_NE(error.find("f.tfrecord: record 7"), std::string::npos) << error;
  // And as the length of a field.
  const std::string bad_length = Varint(1 << 3 | 2) + varint;
  EXPECT_NE(ParseErrorOf(bad_length), "");
  tensorflow::Example ex;
  EXPECT_FALSE(ex.ParseFromString(ExampleWith("ids", Len(3, list))));
}

TEST(HostileInputTest, APackedListClaimingABillionValuesInAHundredBytes) {
  // A packed int64 list whose length prefix says 10^9 bytes, with 80 bytes
  // of values behind it.
  std::string packed = Varint(1 << 3 | 2) + Varint(1'000'000'000);
  packed += std::string(80, '\x01');
  const std::string example = ExampleWith("ids", Len(3, packed));
  ASSERT_LT(example.size(), 120u);
  InCappedChild([&] { return !ParseErrorOf(example).empty(); });
  // Also as a float list (whose size is known from the length alone).
  std::string floats = Varint(1 << 3 | 2) + Varint(4'000'000'000);
  floats += std::string(80, '\0');
  InCappedChild(
      [&] { return !ParseErrorOf(ExampleWith("x", Len(2, floats))).empty(); });
}

// 768 MiB of zeros compressed to under a megabyte, behind a frame whose header
// is valid and claims exactly that: the record is real, so reading it needs the
// memory; above max_record_bytes it is refused before any allocation, and under
// a cap it fails with a clear error, never std::bad_alloc.
TEST(HostileInputTest, DecompressionBombs) {
  TempDir dir;
  const uint64_t claimed = uint64_t{768} << 20;
  std::string header(12, '\0');
  std::memcpy(header.data(), &claimed, 8);
  const uint32_t crc =
      testing::ReferenceMask(testing::ReferenceCrc32c(header.substr(0, 8)));
  std::memcpy(header.data() + 8, &crc, 4);
  const std::string zeros(1 << 20, '\0');
  for (Compression c :
       {Compression::kZlib, Compression::kGzip, Compression::kZstd}) {
    const std::string path =
        dir.File(fmt::format("bomb-{}", CompressionName(c)));
    std::string out;
    if (c == Compression::kZstd) {
      ZSTD_CCtx* z = ZSTD_createCCtx();
      std::string buf(ZSTD_CStreamOutSize(), '\0');
      auto feed = [&](std::string_view in, ZSTD_EndDirective end) {
        ZSTD_inBuffer ib{in.data(), in.size(), 0};
        bool done = false;
        while (!done) {
          ZSTD_outBuffer ob{buf.data(), buf.size(), 0};
          const size_t left = ZSTD_compressStream2(z, &ob, &ib, end);
          out.append(buf.data(), ob.pos);
          done = end == ZSTD_e_end ? left == 0 : ib.pos == ib.size;
        }
      };
      feed(header, ZSTD_e_continue);
      for (uint64_t i = 0; i < claimed / zeros.size(); ++i) {
        feed(zeros, ZSTD_e_continue);
      }
      feed("", ZSTD_e_end);
      ZSTD_freeCCtx(z);
    } else {
      z_stream z{};
      deflateInit2(&z, 1, Z_DEFLATED,
                   c == Compression::kGzip ? 16 + MAX_WBITS : MAX_WBITS, 9,
                   Z_DEFAULT_STRATEGY);
      std::string buf(1 << 16, '\0');
      auto feed = [&](std::string_view in, int flush) {
        z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
        z.avail_in = static_cast<uInt>(in.size());
        do {
          z.next_out = reinterpret_cast<Bytef*>(buf.data());
          z.avail_out = static_cast<uInt>(buf.size());
          deflate(&z, flush);
          out.append(buf.data(), buf.size() - z.avail_out);
        } while (z.avail_out == 0);
      };
      feed(header, Z_NO_FLUSH);
      for (uint64_t i = 0; i < claimed / zeros.size(); ++i) {
        feed(zeros, Z_NO_FLUSH);
      }
      feed("", Z_FINISH);
      deflateEnd(&z);
    }
    ASSERT_LT(out.size(), size_t{16} << 20) << CompressionName(c);
    testing::WriteFileBytes(path, out);
    SCOPED_TRACE(CompressionName(c));
    // Above the maximum: refused at the header.
    InCappedChild([&] {
      try {
        ReaderOptions o;
        o.compression = c;
        o.max_record_bytes = 64 << 20;
        testing::ReadRecords(path, o);
      } catch (const RecordError& e) {
        return e.kind() == DamageKind::kImplausibleLength;
      }
      return false;
    });
    // Under the default maximum (2 GiB) with 512 MiB of address space: a clear
    // error naming the file, not an escaping std::bad_alloc.  (Uncapped,
    // the record reads, and its data CRC, computed over the zeros, fails.)
    InCappedChild([&] {
      try {
        ReaderOptions o;
        o.compression = c;
        testing::ReadRecords(path, o);
      } catch (const Error& e) {
        return std::string(e.what()).find(path) != std::string::npos;
      }
      return false;
    });
  }
}

TEST(HostileInputTest, GroupsNestedAMillionDeepAreRefusedWithoutRecursion) {
  // An unknown field 5 of the Example made of nested start-group tags.
  std::string nested;
  for (int i = 0; i < 1'000'000; ++i) nested += Varint(5 << 3 | 3);
  EXPECT_NE(ParseErrorOf(nested), "");
  // Inside a Feature too.
  EXPECT_NE(ParseErrorOf(ExampleWith("ids", nested)), "");
  // Well-formed but deep (below the limit protobuf allows): skipped.
  std::string ok;
  for (int i = 0; i < 50; ++i) ok += Varint(5 << 3 | 3);
  for (int i = 0; i < 50; ++i) ok += Varint(5 << 3 | 4);
  EXPECT_EQ(ParseErrorOf(ok), "");
}

TEST(HostileInputTest, EveryTruncationOfAnExampleIsAnErrorOrWhatProtobufReads) {
  ExampleBuilder b;
  const int64_t ids[] = {1, 300, -5, 1 << 20};
  const float x[] = {0.5f, 2};
  b.AddInt64List("ids", ids).AddFloatList("x", x).AddBytes("other", "abc");
  const std::string full(b.Serialize());
  for (size_t n = 0; n < full.size(); ++n) {
    const std::string cut = full.substr(0, n);
    tensorflow::Example reference;
    const bool protobuf_reads = reference.ParseFromString(cut);
    const std::string error = ParseErrorOf(cut);
    if (!protobuf_reads) {
      EXPECT_NE(error, "") << "length " << n;
    }
  }
}

}  // namespace
}  // namespace recflow::records
