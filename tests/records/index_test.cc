#include "records/index.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <zstd.h>

#include <filesystem>

#include "records/errors.h"
#include "records/tfrecord_writer.h"
#include "test_util.h"

namespace recflow::records {
namespace {

using testing::TempDir;

// DALI's tfrecord2idx: walk the file, one "offset size" line per record.
std::string DaliStyleIndex(const std::string& bytes) {
  std::string out;
  size_t at = 0;
  while (at < bytes.size()) {
    uint64_t len = 0;
    for (int i = 7; i >= 0; --i) {
      len = (len << 8) | static_cast<unsigned char>(bytes[at + i]);
    }
    out += std::to_string(at) + " " + std::to_string(len + 16) + "\n";
    at += len + 16;
  }
  return out;
}

TEST(IndexTest, UncompressedIndexIsDalisFormat) {
  TempDir dir;
  const auto payloads = testing::RandomPayloads(500, 1000, 21);
  testing::WriteRecords(dir.File("f.tfrecord"), payloads);
  const Index index = BuildIndex(dir.File("f.tfrecord"));
  EXPECT_EQ(index.compression, Compression::kNone);
  WriteIndex(dir.File("f.tfrecord.idx"), index);
  EXPECT_EQ(testing::ReadFileBytes(dir.File("f.tfrecord.idx")),
            DaliStyleIndex(testing::ReadFileBytes(dir.File("f.tfrecord"))));
}

TEST(IndexTest, WriterIndexEqualsBuiltIndex) {
  TempDir dir;
  const auto payloads = testing::RandomPayloads(3000, 1500, 22);
  for (Compression c : {Compression::kNone, Compression::kZstd}) {
    const std::string path = dir.File(c == Compression::kNone ? "f" : "f.zst");
    TFRecordWriter writer(
        path,
        {.compression = c, .zstd_frame_bytes = 64 << 10, .build_index = true});
    for (const auto& p : payloads) writer.Write(p);
    writer.Close();
    const Index built = BuildIndex(path);
    EXPECT_EQ(built.compression, c);
    EXPECT_EQ(built.entries, writer.index().entries) << CompressionName(c);
  }
}

TEST(IndexTest, RandomAccessReturnsEveryRecord) {
  TempDir dir;
  const auto payloads = testing::RandomPayloads(2000, 3000, 23);
  for (Compression c : {Compression::kNone, Compression::kZstd}) {
    const std::string path = dir.File(c == Compression::kNone ? "f" : "f.zst");
    testing::WriteRecords(path, payloads,
                          {.compression = c, .zstd_frame_bytes = 32 << 10});
    WriteIndex(IndexPathFor(path), BuildIndex(path));
    IndexedReader reader(path, ReadIndex(IndexPathFor(path)));
    ASSERT_EQ(reader.size(), payloads.size());
    // Backwards, so that each zstd frame is decoded anew.
    for (size_t i = payloads.size(); i-- > 0;) {
      ASSERT_EQ(reader.Read(i), payloads[i]) << CompressionName(c) << " " << i;
    }
    EXPECT_THROW(reader.Read(payloads.size()), std::out_of_range);
  }
}

TEST(IndexTest, ZstdIndexHasItsHeaderAndFourColumns) {
  TempDir dir;
  testing::WriteRecords(dir.File("f.zst"), {"a", "bb"},
                        {.compression = Compression::kZstd});
  WriteIndex(dir.File("f.idx"), BuildIndex(dir.File("f.zst")));
  const std::string text = testing::ReadFileBytes(dir.File("f.idx"));
  const std::string size =
      std::to_string(std::filesystem::file_size(dir.File("f.zst")));
  EXPECT_EQ(text, "#recflow-zstd-index v1\n0 " + size + " 0 17\n0 " + size +
                      " 17 18\n");
}

// A foreign zstd file (one frame of the whole stream) can be indexed: every
// record lies within that frame.
TEST(IndexTest, ForeignSingleFrameZstdCanBeIndexed) {
  TempDir dir;
  const auto payloads = testing::RandomPayloads(100, 200, 24);
  testing::WriteRecords(dir.File("plain"), payloads);
  const std::string plain = testing::ReadFileBytes(dir.File("plain"));
  std::string z(ZSTD_compressBound(plain.size()), '\0');
  z.resize(ZSTD_compress(z.data(), z.size(), plain.data(), plain.size(), 3));
  testing::WriteFileBytes(dir.File("f.zst"), z);
  const Index index = BuildIndex(dir.File("f.zst"));
  IndexedReader reader(dir.File("f.zst"), index);
  for (size_t i = 0; i < payloads.size(); ++i) {
    ASSERT_EQ(reader.Read(i), payloads[i]);
  }
}

TEST(IndexTest, ZstdRecordSpanningFramesIsRefused) {
  TempDir dir;
  testing::WriteRecords(dir.File("plain"), {"0123456789", "abcdefghij"});
  const std::string plain = testing::ReadFileBytes(dir.File("plain"));
  std::string file;
  for (const std::string& part : {plain.substr(0, 20), plain.substr(20)}) {
    std::string z(ZSTD_compressBound(part.size()), '\0');
    z.resize(ZSTD_compress(z.data(), z.size(), part.data(), part.size(), 3));
    file += z;
  }
  testing::WriteFileBytes(dir.File("f.zst"), file);
  try {
    BuildIndex(dir.File("f.zst"));
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("spans zstd frames"),
              std::string::npos)
        << e.what();
  }
}

TEST(IndexTest, GzipCannotBeIndexed) {
  TempDir dir;
  testing::WriteRecords(dir.File("f.gz"), {"a"},
                        {.compression = Compression::kGzip});
  EXPECT_THROW(BuildIndex(dir.File("f.gz")), Error);
}

TEST(IndexTest, ReadIndexRejectsMalformedIndexesNamingTheLine) {
  TempDir dir;
  const std::string idx = dir.File("f.idx");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"0 20\nfoo bar\n", ":2: expected 'offset size'"},
      {"0 20\n20 5\n", ":2: record size 5 is below"},
      {"0 20\n10 20\n", ":2: record at 10 overlaps"},
      {"0 20\n20 20 7\n", ":2: expected 'offset size'"},
      {"0 20\n-5 20\n", ":2: expected"},
      {"0 20\n20 30\n", ":2: record [20, 50) lies past the end"},
  };
  for (const auto& [text, expected] : cases) {
    testing::WriteFileBytes(idx, text);
    try {
      ReadIndex(idx, 40);
      FAIL() << "accepted: " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(idx + expected), std::string::npos)
          << e.what();
    }
  }
  testing::WriteFileBytes(idx, "0 20\r\n20 20\n\n");
  EXPECT_EQ(ReadIndex(idx, 40).entries.size(), 2u);
}

// An index read without the file's size (ReadIndex(path) alone) may point
// anywhere; the reader must refuse before allocating what the index claims
// (fuzz/regressions/index_reader/: a 5.6 GB frame once reached resize()).
TEST(IndexTest, LyingZstdIndexIsRefusedBeforeAllocating) {
  TempDir dir;
  testing::WriteRecords(dir.File("f.zst"), {"aaaa", "bbbb"},
                        {.compression = Compression::kZstd});
  const Index good = BuildIndex(dir.File("f.zst"));
  const uint64_t file_size = std::filesystem::file_size(dir.File("f.zst"));
  const auto expect_refused = [&](Index index, const std::string& expected) {
    IndexedReader reader(dir.File("f.zst"), std::move(index));
    try {
      reader.Read(0);
      FAIL() << "accepted; expected: " << expected;
    } catch (const RecordError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos)
          << e.what();
      EXPECT_EQ(e.record_index(), 0u);
    }
  };
  Index frame_too_long = good;
  frame_too_long.entries[0].frame_bytes = 5594994547;
  expect_refused(frame_too_long, "past the end of the " +
                                     std::to_string(file_size) + "-byte file");
  Index frame_past_end = good;
  frame_past_end.entries[0].frame_offset = UINT64_MAX - 2;
  expect_refused(frame_past_end, "past the end");
  // offset + size wraps to 0 past 64 bits: must not pass the bounds check.
  Index wrapping = good;
  wrapping.entries[0].offset = UINT64_MAX - 15;
  wrapping.entries[0].size = 16;
  expect_refused(wrapping, "a frame that decodes to");
  // A record claimed far larger than the frame decodes to.
  Index too_big = good;
  too_big.entries[0].size = uint64_t{1} << 40;
  expect_refused(too_big, "a frame that decodes to");
  // The honest index still reads, in any order (frames cached partially).
  IndexedReader reader(dir.File("f.zst"), good);
  EXPECT_EQ(reader.Read(1), "bbbb");
  EXPECT_EQ(reader.Read(0), "aaaa");
  EXPECT_EQ(reader.Read(1), "bbbb");

  testing::WriteFileBytes(dir.File("f.idx"),
                          "#recflow-zstd-index v1\n0 10 "
                          "18446744073709551600 17\n");
  try {
    ReadIndex(dir.File("f.idx"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(":2: offset plus size overflows"),
              std::string::npos)
        << e.what();
  }
}

TEST(IndexTest, StaleIndexIsDetectedOnRead) {
  TempDir dir;
  testing::WriteRecords(dir.File("f"), {"aaaa", "bbbb", "cccc"});
  Index index = BuildIndex(dir.File("f"));
  index.entries[1].offset += 1;  // points into the middle of a record
  IndexedReader reader(dir.File("f"), index);
  EXPECT_EQ(reader.Read(0), "aaaa");
  try {
    reader.Read(1);
    FAIL();
  } catch (const RecordError& e) {
    EXPECT_EQ(e.record_index(), 1u);
    EXPECT_EQ(e.offset(), 21u);
  }
}

// Every way an index can disagree with its file is found when the record
// is read, and said: the record, its offset and what the index claimed.
TEST(IndexTest, EveryWayAnIndexCanLieIsNamedOnRead) {
  TempDir dir;
  const auto error = [](IndexedReader& reader, uint64_t i) {
    try {
      reader.Read(i);
    } catch (const RecordError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const auto has = [](const std::string& what, const std::string& part) {
    return what.find(part) != std::string::npos;
  };
  const std::string f = dir.File("f");
  testing::WriteRecords(f, {"aaaa", "bbbb", "cccc"});  // 20 bytes each
  const Index built = BuildIndex(f);
  {
    Index index = built;
    index.entries[1].size = 24;
    IndexedReader reader(f, index);
    EXPECT_TRUE(has(error(reader, 1),
                    "the index gives 24 bytes but the record header says 4 "
                    "+ 16 (is the index stale?)"))
        << error(reader, 1);
    index.entries[2].offset = 50;
    IndexedReader past(f, index);
    EXPECT_TRUE(has(error(past, 2),
                    "the index gives 20 bytes at byte 50, past the end of "
                    "the 60-byte file"))
        << error(past, 2);
  }
  {
    IndexedReader reader(f, built);
    std::filesystem::resize_file(f, 50);  // after it was opened
    EXPECT_TRUE(
        has(error(reader, 2), "the file is shorter than when it was opened"))
        << error(reader, 2);
    EXPECT_EQ(reader.Read(1), "bbbb");
  }

  const std::string z = dir.File("z.zst");
  testing::WriteRecords(z, {"a", "bb"}, {.compression = Compression::kZstd});
  const Index zbuilt = BuildIndex(z);
  const uint64_t zsize = std::filesystem::file_size(z);
  ASSERT_EQ(zbuilt.entries[0].frame_bytes, zsize);  // one frame
  const auto zerror = [&](auto change, uint64_t i) {
    Index index = zbuilt;
    for (IndexEntry& e : index.entries) change(e);
    IndexedReader reader(z, index);
    return error(reader, i);
  };
  std::string what = zerror(
      [&](IndexEntry& e) {
        e.frame_offset = 1;
        e.frame_bytes = zsize - 1;
      },
      0);
  EXPECT_TRUE(has(what,
                  "the index points at bytes that are not a zstd frame (is "
                  "the index stale?)"))
      << what;
  what = zerror([&](IndexEntry& e) { e.frame_bytes = zsize + 10; }, 0);
  EXPECT_TRUE(has(what, fmt::format("the index gives a zstd frame of {} bytes "
                                    "at byte 0, past the end of the {}-byte "
                                    "file",
                                    zsize + 10, zsize)))
      << what;
  what = zerror([&](IndexEntry& e) { e.frame_bytes = zsize - 6; }, 1);
  EXPECT_TRUE(has(what, fmt::format("the zstd frame at file byte 0 does not "
                                    "end within the {} bytes the index gives",
                                    zsize - 6)))
      << what;
  what = zerror(
      [&](IndexEntry& e) {
        if (e.offset == 17) e.offset = 100;
      },
      1);
  EXPECT_TRUE(has(what,
                  "the index puts the record at [100, 118) of a frame that "
                  "decodes to 35 bytes"))
      << what;
}

}  // namespace
}  // namespace recflow::records
