#include "records/tfrecord_reader.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <zlib.h>
#include <zstd.h>

#include <cstdlib>
#include <set>

#include "records/tfrecord_format.h"
#include "records/tfrecord_writer.h"
#include "test_util.h"

namespace recflow::records {
namespace {

using testing::kAllCompressions;
using testing::TempDir;

std::string PathFor(const TempDir& dir, const std::string& stem,
                    Compression c) {
  return dir.File(stem + ".tfrecord" + std::string(CompressionSuffix(c)));
}

// Reads until the end or an error; returns the error's kind, or nullopt.
std::optional<DamageKind> ReadExpectingDamage(const std::string& path,
                                              size_t* records = nullptr) {
  TFRecordReader reader(path);
  std::string_view r;
  size_t n = 0;
  try {
    while (reader.ReadRecord(&r)) ++n;
  } catch (const RecordError& e) {
    if (records) *records = n;
    return e.kind();
  }
  if (records) *records = n;
  return std::nullopt;
}

class Collecting final : public Reporter {
 public:
  void Skipped(const RecordError& e, uint64_t bytes) override {
    ranges.emplace_back(e.offset(), bytes);
    kinds.push_back(e.kind());
  }
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  std::vector<DamageKind> kinds;
};

// Records that straddle the read buffer's end, and records larger than it.
TEST(TFRecordReaderTest, SmallBuffersGiveTheSameRecords) {
  TempDir dir;
  const auto payloads = testing::RandomPayloads(3000, 700, 11);
  for (Compression c : kAllCompressions) {
    const std::string path = PathFor(dir, "s", c);
    testing::WriteRecords(path, payloads, c);
    for (size_t buffer : {64, 100, 1000, 4096}) {
      EXPECT_EQ(testing::ReadRecords(path, {.buffer_bytes = buffer}), payloads)
          << CompressionName(c) << " buffer " << buffer;
    }
  }
}

TEST(TFRecordReaderTest, ReportsOffsetsAndIndexes) {
  TempDir dir;
  testing::WriteRecords(dir.File("f"), {"a", "", "ccc"});
  TFRecordReader reader(dir.File("f"));
  std::string_view r;
  std::vector<std::pair<uint64_t, uint64_t>> seen;
  while (reader.ReadRecord(&r)) {
    seen.emplace_back(reader.last_offset(), reader.last_index());
  }
  EXPECT_EQ(seen, (std::vector<std::pair<uint64_t, uint64_t>>{
                      {0, 0}, {17, 1}, {33, 2}}));
  EXPECT_EQ(reader.stats().records, 3u);
  EXPECT_EQ(reader.stats().payload_bytes, 4u);
  EXPECT_EQ(reader.stats().stream_bytes, 52u);
}

TEST(TFRecordReaderTest, EmptyFileHasNoRecords) {
  TempDir dir;
  testing::WriteFileBytes(dir.File("empty.tfrecord"), "");
  EXPECT_TRUE(testing::ReadRecords(dir.File("empty.tfrecord")).empty());
}

TEST(TFRecordReaderTest, CompressionCanBeForced) {
  TempDir dir;
  // A zlib stream without the suffix is not detected, but can be named.
  testing::WriteRecords(dir.File("z.zz"), {"x", "y"}, Compression::kZlib);
  std::filesystem::rename(dir.File("z.zz"), dir.File("z.data"));
  EXPECT_THROW(testing::ReadRecords(dir.File("z.data")), RecordError);
  EXPECT_EQ(testing::ReadRecords(dir.File("z.data"),
                                 {.compression = Compression::kZlib}),
            (std::vector<std::string>{"x", "y"}));
}

// `cat a.gz b.gz > c.gz` is one gzip file of two members; TensorFlow reads
// both, and so do we.
TEST(TFRecordReaderTest, ConcatenatedGzipMembersReadAsOneStream) {
  TempDir dir;
  testing::WriteRecords(dir.File("a.gz"), {"one", "two"}, Compression::kGzip);
  testing::WriteRecords(dir.File("b.gz"), {"three"}, Compression::kGzip);
  testing::WriteFileBytes(dir.File("c.gz"),
                          testing::ReadFileBytes(dir.File("a.gz")) +
                              testing::ReadFileBytes(dir.File("b.gz")));
  EXPECT_EQ(testing::ReadRecords(dir.File("c.gz")),
            (std::vector<std::string>{"one", "two", "three"}));
}

TEST(TFRecordReaderTest, TrailingBytesAfterZlibStreamAreReported) {
  TempDir dir;
  testing::WriteRecords(dir.File("a.zz"), {"one"}, Compression::kZlib);
  testing::WriteFileBytes(dir.File("b.zz"),
                          testing::ReadFileBytes(dir.File("a.zz")) + "junk");
  EXPECT_EQ(ReadExpectingDamage(dir.File("b.zz")),
            DamageKind::kDecompressionError);
}

// Files compressed by other tools: gzip via zlib's gz writer, and zstd as
// one big frame via ZSTD_compress.
TEST(TFRecordReaderTest, ReadsStreamsCompressedByOtherTools) {
  TempDir dir;
  const auto payloads = testing::RandomPayloads(400, 2000, 12);
  testing::WriteRecords(dir.File("plain"), payloads);
  const std::string plain = testing::ReadFileBytes(dir.File("plain"));
  gzFile gz = gzopen(dir.File("other.gz").c_str(), "wb9");
  gzwrite(gz, plain.data(), static_cast<unsigned>(plain.size()));
  gzclose(gz);
  EXPECT_EQ(testing::ReadRecords(dir.File("other.gz")), payloads);

  std::string z(ZSTD_compressBound(plain.size()), '\0');
  z.resize(ZSTD_compress(z.data(), z.size(), plain.data(), plain.size(), 19));
  testing::WriteFileBytes(dir.File("other.zst"), z);
  EXPECT_EQ(testing::ReadRecords(dir.File("other.zst")), payloads);
}

// Every change of one byte is detected: by the record CRCs, or by the
// codec (gzip's CRC-32, zlib's Adler-32, zstd's frame checksum) — or, in a
// compressed stream, it changes no record at all.
TEST(TFRecordReaderTest, EverySingleByteChangeIsDetected) {
  TempDir dir;
  const std::vector<std::string> payloads = {"alpha", "", "a longer record",
                                             std::string(300, 'z')};
  for (Compression c : kAllCompressions) {
    const std::string path = PathFor(dir, "flip", c);
    testing::WriteRecords(path, payloads, c);
    const std::string good = testing::ReadFileBytes(path);
    const std::string bad_path = dir.File("bad");
    for (size_t i = 0; i < good.size(); ++i) {
      for (unsigned char mask : {0x01, 0x80, 0xff}) {
        std::string bad = good;
        bad[i] = static_cast<char>(bad[i] ^ mask);
        testing::WriteFileBytes(bad_path, bad);
        std::vector<std::string> got;
        bool detected = false;
        try {
          got = testing::ReadRecords(bad_path, {.compression = c});
        } catch (const RecordError&) {
          detected = true;
        }
        // Uncompressed, the record CRCs must catch every change.  In a
        // compressed stream a few bits carry no data (gzip's MTIME, XFL and
        // OS fields, padding bits after deflate's last block, some zstd
        // header bits); changing them must leave the records as they were.
        if (c == Compression::kNone) {
          ASSERT_TRUE(detected) << "byte " << i << " mask " << int(mask);
        } else if (!detected) {
          ASSERT_EQ(got, payloads)
              << CompressionName(c) << " byte " << i << " mask " << int(mask);
        }
      }
    }
  }
}

// A file cut anywhere but at a record boundary is reported as truncated:
// inside the 12-byte header as kTruncatedHeader, after it as
// kTruncatedData.  Cut at a boundary it is a valid, shorter file.
TEST(TFRecordReaderTest, TruncationAtEveryLengthIsReportedAsTruncation) {
  TempDir dir;
  const std::vector<std::string> payloads = {"first", "", "third record",
                                             std::string(100, 'q')};
  testing::WriteRecords(dir.File("full"), payloads);
  const std::string full = testing::ReadFileBytes(dir.File("full"));
  std::vector<size_t> starts;
  size_t at = 0;
  for (const auto& p : payloads) {
    starts.push_back(at);
    at += p.size() + 16;
  }
  for (size_t len = 0; len < full.size(); ++len) {
    testing::WriteFileBytes(dir.File("cut"), full.substr(0, len));
    size_t records = 0;
    const auto kind = ReadExpectingDamage(dir.File("cut"), &records);
    size_t boundary_index = 0;
    while (boundary_index < starts.size() && starts[boundary_index] < len) {
      ++boundary_index;
    }
    const bool at_boundary =
        boundary_index < starts.size() && starts[boundary_index] == len;
    if (at_boundary || len == 0) {
      EXPECT_EQ(kind, std::nullopt) << "cut at " << len;
      EXPECT_EQ(records, boundary_index);
      continue;
    }
    const size_t record_start = starts[boundary_index - 1];
    ASSERT_TRUE(kind.has_value()) << "cut at " << len;
    EXPECT_EQ(*kind, len - record_start < kHeaderBytes
                         ? DamageKind::kTruncatedHeader
                         : DamageKind::kTruncatedData)
        << "cut at " << len;
    EXPECT_EQ(records, boundary_index - 1);
  }
}

TEST(TFRecordReaderTest, TruncatedCompressedStreamsAreReported) {
  TempDir dir;
  const auto payloads = testing::RandomPayloads(50, 200, 13);
  for (Compression c :
       {Compression::kZlib, Compression::kGzip, Compression::kZstd}) {
    const std::string path = PathFor(dir, "t", c);
    testing::WriteRecords(path, payloads,
                          c);  // one zstd frame: no inner boundary
    const std::string full = testing::ReadFileBytes(path);
    for (size_t len = 1; len < full.size(); len += 7) {
      testing::WriteFileBytes(dir.File("cut"), full.substr(0, len));
      std::optional<DamageKind> kind;
      try {
        testing::ReadRecords(dir.File("cut"), {.compression = c});
      } catch (const RecordError& e) {
        kind = e.kind();
      }
      ASSERT_TRUE(kind.has_value()) << CompressionName(c) << " cut at " << len;
    }
  }
}

TEST(TFRecordReaderTest, ErrorsNameFileOffsetIndexAndKind) {
  TempDir dir;
  testing::WriteRecords(dir.File("f.tfrecord"), {"aaaa", "bbbb", "cccc"});
  std::string bytes = testing::ReadFileBytes(dir.File("f.tfrecord"));
  bytes[20 + 12] ^= 1;  // a payload byte of record 1 (at offset 20)
  testing::WriteFileBytes(dir.File("f.tfrecord"), bytes);
  try {
    testing::ReadRecords(dir.File("f.tfrecord"));
    FAIL() << "expected a RecordError";
  } catch (const RecordError& e) {
    EXPECT_EQ(e.kind(), DamageKind::kDataCrcMismatch);
    EXPECT_EQ(e.offset(), 20u);
    EXPECT_EQ(e.record_index(), 1u);
    EXPECT_EQ(e.path(), dir.File("f.tfrecord"));
    const std::string what = e.what();
    EXPECT_NE(what.find(dir.File("f.tfrecord")), std::string::npos);
    EXPECT_NE(what.find("record 1 at byte offset 20: data CRC mismatch"),
              std::string::npos)
        << what;
  }
}

TEST(TFRecordReaderTest, VerificationCanBeTurnedOff) {
  TempDir dir;
  testing::WriteRecords(dir.File("f"), {"aaaa", "bbbb"});
  std::string bytes = testing::ReadFileBytes(dir.File("f"));
  bytes[12] = 'X';  // payload of record 0
  bytes[8] ^= 1;    // its length CRC
  testing::WriteFileBytes(dir.File("f"), bytes);
  EXPECT_THROW(testing::ReadRecords(dir.File("f")), RecordError);
  EXPECT_EQ(testing::ReadRecords(dir.File("f"), {.verify_checksums = false}),
            (std::vector<std::string>{"Xaaa", "bbbb"}));
}

std::string HeaderOnly(uint64_t length) {
  char header[kHeaderBytes];
  EncodeHeader(header, length);
  return std::string(header, kHeaderBytes);
}

TEST(TFRecordReaderTest, ImplausibleLengthsAreDamageNotAllocations) {
  TempDir dir;
  // A valid header for 2^63 bytes in a 112-byte file.
  testing::WriteFileBytes(
      dir.File("huge"), HeaderOnly(uint64_t{1} << 63) + std::string(100, 'x'));
  EXPECT_EQ(ReadExpectingDamage(dir.File("huge")),
            DamageKind::kImplausibleLength);
  // Above a configured maximum.
  testing::WriteRecords(dir.File("f"), {std::string(1000, 'a')});
  try {
    testing::ReadRecords(dir.File("f"), {.max_record_bytes = 999});
    FAIL();
  } catch (const RecordError& e) {
    EXPECT_EQ(e.kind(), DamageKind::kImplausibleLength);
  }
  // Under the maximum but past the end of the file, unverified.
  testing::WriteFileBytes(dir.File("past"),
                          HeaderOnly(5000) + std::string(100, 'x'));
  try {
    testing::ReadRecords(dir.File("past"), {.verify_checksums = false});
    FAIL();
  } catch (const RecordError& e) {
    EXPECT_EQ(e.kind(), DamageKind::kImplausibleLength);
  }
}

// Inside a compressed stream the reader cannot know the length is a lie
// until the data runs out; it must not allocate the claimed size first.
// Run in a child whose address space is capped at 1 GiB while the claimed
// record is 1.5 GiB.
TEST(TFRecordReaderDeathTest, HostileLengthInGzipDoesNotAllocateIt) {
  if (!testing::AddressSpaceCanBeCapped()) {
    GTEST_SKIP() << "a sanitizer reserves terabytes of address space, so a "
                    "cap on it cannot be tested in this build";
  }
  TempDir dir;
  const std::string stream =
      HeaderOnly(uint64_t{3} << 29) + std::string(5000, 'x');
  gzFile gz = gzopen(dir.File("bomb.gz").c_str(), "wb");
  gzwrite(gz, stream.data(), static_cast<unsigned>(stream.size()));
  gzclose(gz);
  const std::string path = dir.File("bomb.gz");
  auto child = [&] {
    testing::CapAddressSpace(uint64_t{1} << 30);
    try {
      testing::ReadRecords(path);
    } catch (const RecordError& e) {
      std::exit(e.kind() == DamageKind::kTruncatedData ? 0 : 3);
    }
    std::exit(4);
  };
  EXPECT_EXIT(child(), ::testing::ExitedWithCode(0), "");
}

// Salvage loses exactly the damaged records: a data CRC mismatch skips the
// record; a damaged length resynchronises at the next valid header.
TEST(TFRecordReaderTest, SalvageLosesExactlyTheDamagedRecords) {
  TempDir dir;
  const auto payloads = testing::RandomPayloads(200, 500, 14);
  testing::WriteRecords(dir.File("f"), payloads);
  std::string bytes = testing::ReadFileBytes(dir.File("f"));
  std::vector<size_t> starts;
  size_t at = 0;
  for (const auto& p : payloads) {
    starts.push_back(at);
    at += p.size() + 16;
  }
  struct Hit {
    size_t record;
    size_t byte_in_frame;
  };
  // Length bytes, length CRC bytes, payload bytes and data CRC bytes.
  const std::vector<Hit> hits = {{3, 0},   {10, 9},  {11, 14}, {50, 2},
                                 {120, 5}, {121, 0}, {199, 3}};
  std::set<size_t> damaged;
  for (const Hit& h : hits) {
    const size_t frame = payloads[h.record].size() + 16;
    const size_t byte = std::min(h.byte_in_frame, frame - 1);
    bytes[starts[h.record] + byte] ^= 0x5a;
    damaged.insert(h.record);
  }
  testing::WriteFileBytes(dir.File("f"), bytes);
  Collecting reporter;
  const auto got = testing::ReadRecords(
      dir.File("f"), {.salvage = true, .reporter = &reporter});
  std::vector<std::string> expected;
  for (size_t i = 0; i < payloads.size(); ++i) {
    if (!damaged.count(i)) expected.push_back(payloads[i]);
  }
  EXPECT_EQ(got, expected);
  // A bad data CRC skips exactly that record's frame.  A bad header skips
  // from that record to the next intact header, so it swallows following
  // records only when their headers are damaged too (records 120 and 121).
  std::vector<std::pair<uint64_t, uint64_t>> expected_ranges;
  for (size_t k = 0; k < hits.size(); ++k) {
    const size_t r = hits[k].record;
    if (!expected_ranges.empty() && k > 0 && hits[k - 1].record + 1 == r &&
        hits[k - 1].byte_in_frame < 12 && hits[k].byte_in_frame < 12) {
      expected_ranges.back().second += payloads[r].size() + 16;
      continue;
    }
    expected_ranges.emplace_back(starts[r], payloads[r].size() + 16);
  }
  EXPECT_EQ(reporter.ranges, expected_ranges);
  EXPECT_EQ(expected_ranges.size(), hits.size() - 1);
}

TEST(TFRecordReaderTest, SalvageReportsATruncatedTail) {
  TempDir dir;
  testing::WriteRecords(dir.File("f"), {"one", "two", "three"});
  const std::string full = testing::ReadFileBytes(dir.File("f"));
  testing::WriteFileBytes(dir.File("cut"), full.substr(0, full.size() - 3));
  Collecting reporter;
  TFRecordReader reader(dir.File("cut"),
                        {.salvage = true, .reporter = &reporter});
  std::string_view r;
  int n = 0;
  while (reader.ReadRecord(&r)) ++n;
  EXPECT_EQ(n, 2);
  ASSERT_EQ(reporter.kinds.size(), 1u);
  EXPECT_EQ(reporter.kinds[0], DamageKind::kTruncatedData);
  EXPECT_EQ(reporter.ranges[0], std::make_pair(uint64_t{38}, uint64_t{21 - 3}));
  EXPECT_EQ(reader.stats().skipped_bytes, 18u);
}

TEST(TFRecordReaderTest, SalvageAfterGarbageInTheMiddle) {
  TempDir dir;
  testing::WriteRecords(dir.File("a"), {"first", "second"});
  testing::WriteRecords(dir.File("b"), {"third", "fourth"});
  const std::string garbage(1000, '\x42');
  testing::WriteFileBytes(dir.File("f"),
                          testing::ReadFileBytes(dir.File("a")) + garbage +
                              testing::ReadFileBytes(dir.File("b")));
  Collecting reporter;
  EXPECT_EQ(testing::ReadRecords(dir.File("f"),
                                 {.salvage = true, .reporter = &reporter}),
            (std::vector<std::string>{"first", "second", "third", "fourth"}));
  ASSERT_EQ(reporter.ranges.size(), 1u);
  EXPECT_EQ(reporter.ranges[0], std::make_pair(uint64_t{43}, uint64_t{1000}));
  EXPECT_EQ(reporter.kinds[0], DamageKind::kLengthCrcMismatch);
}

TEST(TFRecordReaderTest, SalvageOfACorruptCompressedStreamKeepsWhatDecoded) {
  TempDir dir;
  const auto payloads = testing::RandomPayloads(2000, 300, 15);
  testing::WriteRecords(dir.File("f.gz"), payloads, Compression::kGzip);
  std::string bytes = testing::ReadFileBytes(dir.File("f.gz"));
  bytes[bytes.size() / 2] ^= 0xff;
  testing::WriteFileBytes(dir.File("f.gz"), bytes);
  Collecting reporter;
  const auto got = testing::ReadRecords(
      dir.File("f.gz"), {.salvage = true, .reporter = &reporter});
  ASSERT_FALSE(reporter.kinds.empty());
  EXPECT_LT(got.size(), payloads.size());
  // What came back is what was written, in order, every record intact: a
  // record decoded from damaged deflate data fails its CRC and is skipped,
  // and the records decoded before the stream's error all come back (a
  // flipped literal damages one record; zlib finds it only at the gzip
  // trailer's CRC, after the rest of the member).
  size_t j = 0;
  for (const std::string& r : got) {
    while (j < payloads.size() && payloads[j] != r) ++j;
    ASSERT_LT(j, payloads.size()) << "a record that was not written";
    ++j;
  }
  EXPECT_GT(got.size(), payloads.size() / 2);  // the first half at least
}

// Damage in a compressed stream after some records: every record decoded
// before it is read first, and the error names the record and offset where
// the intact data ends (TensorFlow's readers give those records too).
// Before, the bytes decoded in the read that met the error were dropped:
// garbage after a gzip member lost all 50 records.
TEST(TFRecordReaderTest, EveryRecordDecodedBeforeAStreamErrorIsReadFirst) {
  TempDir dir;
  std::vector<std::string> payloads;
  for (int i = 0; i < 50; ++i)
    payloads.push_back(std::string(20, 'a' + i % 26));
  for (const Compression c :
       {Compression::kGzip, Compression::kZlib, Compression::kZstd}) {
    const std::string f = dir.File("f");
    testing::WriteRecords(f, payloads, c);
    testing::WriteFileBytes(f, testing::ReadFileBytes(f) + "garbage!");
    TFRecordReader reader(f, {.compression = c});
    std::string_view r;
    size_t n = 0;
    try {
      while (reader.ReadRecord(&r)) {
        ASSERT_EQ(r, payloads[n]);
        ++n;
      }
      ADD_FAILURE() << CompressionName(c) << ": no error";
    } catch (const RecordError& e) {
      EXPECT_EQ(n, 50u) << CompressionName(c) << ": " << e.what();
      EXPECT_EQ(e.record_index(), 50u) << e.what();
      EXPECT_EQ(e.offset(), 50u * (20 + 16)) << e.what();
      EXPECT_EQ(e.kind(), DamageKind::kDecompressionError) << e.what();
    }
  }
}

TEST(TFRecordReaderTest, FinishedAfterAnError) {
  TempDir dir;
  testing::WriteFileBytes(dir.File("f"), "short");
  TFRecordReader reader(dir.File("f"));
  std::string_view r;
  EXPECT_THROW(reader.ReadRecord(&r), RecordError);
  EXPECT_FALSE(reader.ReadRecord(&r));
}

TEST(TFRecordReaderTest, MissingFileIsAnIoError) {
  EXPECT_THROW(TFRecordReader("/nonexistent/recflow/file.tfrecord"), IoError);
}

}  // namespace
}  // namespace recflow::records
