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

#include <algorithm>
#include <cstdlib>
#include <functional>

#include "records/errors.h"
#include "records/example.pb.h"
#include "records/example_builder.h"
#include "records/example_parser.h"
#include "records/feature_spec.h"
#include "records/tfrecord_format.h"
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

// A 12-byte record header with a valid length CRC claiming `length`.
std::string HeaderClaiming(uint64_t length) {
  char header[kHeaderBytes];
  EncodeHeader(header, length);
  return std::string(header, kHeaderBytes);
}

// `head` then `zeros` zero bytes as a whole stream in compression `c`,
// compressed a megabyte at a time (never holding the zeros).
std::string CompressedStream(Compression c, std::string_view head,
                             uint64_t zeros) {
  std::string out;
  // Compresses `in`; `last` ends the stream.
  std::function<void(std::string_view, bool)> feed;
  ZSTD_CCtx* zstd = nullptr;
  z_stream z{};
  std::string buf(1 << 16, '\0');
  if (c == Compression::kNone) {
    feed = [&](std::string_view in, bool) { out.append(in); };
  } else if (c == Compression::kZstd) {
    zstd = ZSTD_createCCtx();
    feed = [&](std::string_view in, bool last) {
      ZSTD_inBuffer ib{in.data(), in.size(), 0};
      const ZSTD_EndDirective end = last ? ZSTD_e_end : ZSTD_e_continue;
      bool done = false;
      while (!done) {
        ZSTD_outBuffer ob{buf.data(), buf.size(), 0};
        const size_t left = ZSTD_compressStream2(zstd, &ob, &ib, end);
        out.append(buf.data(), ob.pos);
        done = last ? left == 0 : ib.pos == ib.size;
      }
    };
  } else {
    deflateInit2(&z, 1, Z_DEFLATED,
                 c == Compression::kGzip ? 16 + MAX_WBITS : MAX_WBITS, 9,
                 Z_DEFAULT_STRATEGY);
    feed = [&](std::string_view in, bool last) {
      z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
      z.avail_in = static_cast<uInt>(in.size());
      do {
        z.next_out = reinterpret_cast<Bytef*>(buf.data());
        z.avail_out = static_cast<uInt>(buf.size());
        deflate(&z, last ? Z_FINISH : Z_NO_FLUSH);
        out.append(buf.data(), buf.size() - z.avail_out);
      } while (z.avail_out == 0);
    };
  }
  const std::string block(1 << 20, '\0');
  feed(head, false);
  for (uint64_t left = zeros; left > 0;) {
    const size_t n =
        static_cast<size_t>(std::min<uint64_t>(left, block.size()));
    feed(std::string_view(block).substr(0, n), false);
    left -= n;
  }
  feed("", true);
  if (zstd != nullptr) ZSTD_freeCCtx(zstd);
  if (c == Compression::kZlib || c == Compression::kGzip) deflateEnd(&z);
  return out;
}

TEST(HostileInputTest, ALengthOfTwoToTheSixtyThreeInEachCompression) {
  TempDir dir;
  for (Compression c : {Compression::kNone, Compression::kZlib,
                        Compression::kGzip, Compression::kZstd}) {
    const std::string path =
        dir.File(fmt::format("huge-{}.tfrecord", CompressionName(c)));
    // A header with a valid length CRC claiming 2^63 bytes, then 100 bytes.
    const std::string stream = CompressedStream(
        c, HeaderClaiming(uint64_t{1} << 63) + std::string(100, 'x'), 0);
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
  for (Compression c :
       {Compression::kZlib, Compression::kGzip, Compression::kZstd}) {
    const std::string path =
        dir.File(fmt::format("bomb-{}", CompressionName(c)));
    const std::string out =
        CompressedStream(c, HeaderClaiming(claimed), claimed);
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
