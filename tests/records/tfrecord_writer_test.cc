#include "records/tfrecord_writer.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <zlib.h>
#include <zstd.h>

#include <cstdlib>
#include <filesystem>
#include <tuple>
#include <utility>

#include "records/errors.h"
#include "records/index.h"
#include "records/tfrecord_reader.h"
#include "test_util.h"

namespace recflow::records {
namespace {

using testing::kAllCompressions;
using testing::TempDir;

// Uncompressed output is byte for byte what the format's definition gives.
TEST(TFRecordWriterTest, UncompressedBytesMatchTheDefinition) {
  TempDir dir;
  const auto payloads = testing::RandomPayloads(300, 2000, 1);
  testing::WriteRecords(dir.File("a.tfrecord"), payloads);
  std::string expected;
  for (const auto& p : payloads) expected += testing::ReferenceFrame(p);
  EXPECT_EQ(testing::ReadFileBytes(dir.File("a.tfrecord")), expected);
}

TEST(TFRecordWriterTest, RoundTripsEveryCompression) {
  TempDir dir;
  auto payloads = testing::RandomPayloads(2000, 5000, 2);
  payloads.insert(payloads.begin() + 10, std::string());  // zero-length
  payloads.push_back(std::string());
  for (Compression c : kAllCompressions) {
    const std::string path =
        dir.File("rt.tfrecord" + std::string(CompressionSuffix(c)));
    testing::WriteRecords(path, payloads, {.compression = c});
    TFRecordReader reader(path);
    EXPECT_EQ(reader.compression(), c);
    EXPECT_EQ(testing::ReadRecords(path), payloads) << CompressionName(c);
  }
}

TEST(TFRecordWriterTest, CompressedStreamsDecodeToTheUncompressedStream) {
  TempDir dir;
  const auto payloads = testing::RandomPayloads(500, 3000, 3);
  testing::WriteRecords(dir.File("plain"), payloads);
  const std::string plain = testing::ReadFileBytes(dir.File("plain"));
  // gzip via zlib's own gz reader, independent of ours.
  testing::WriteRecords(dir.File("g.gz"), payloads,
                        {.compression = Compression::kGzip});
  gzFile gz = gzopen(dir.File("g.gz").c_str(), "rb");
  ASSERT_NE(gz, nullptr);
  std::string decoded(plain.size() + 10, '\0');
  const int n =
      gzread(gz, decoded.data(), static_cast<unsigned>(decoded.size()));
  gzclose(gz);
  decoded.resize(n < 0 ? 0 : static_cast<size_t>(n));
  EXPECT_EQ(decoded, plain);
  // zlib via uncompress().
  testing::WriteRecords(dir.File("z.zz"), payloads,
                        {.compression = Compression::kZlib});
  const std::string zz = testing::ReadFileBytes(dir.File("z.zz"));
  uLongf size = plain.size();
  std::string out(plain.size(), '\0');
  ASSERT_EQ(uncompress(reinterpret_cast<Bytef*>(out.data()), &size,
                       reinterpret_cast<const Bytef*>(zz.data()), zz.size()),
            Z_OK);
  EXPECT_EQ(out, plain);
}

// The ZSTD files recflow writes decompress with the standard zstd command.
TEST(TFRecordWriterTest, ZstdFileDecompressesWithTheZstdCommand) {
  if (std::system("zstd --version > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "the zstd command is not installed (apt-get install zstd)";
  }
  TempDir dir;
  const auto payloads = testing::RandomPayloads(3000, 2000, 4);
  testing::WriteRecords(dir.File("plain"), payloads);
  testing::WriteRecords(
      dir.File("z.zst"), payloads,
      {.compression = Compression::kZstd, .zstd_frame_bytes = 64 << 10});
  const std::string cmd =
      "zstd -q -d -c " + dir.File("z.zst") + " > " + dir.File("decoded");
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  EXPECT_EQ(testing::ReadFileBytes(dir.File("decoded")),
            testing::ReadFileBytes(dir.File("plain")));
}

TEST(TFRecordWriterTest, LargeRecordRoundTripsInEveryCompression) {
  TempDir dir;
  std::string big(64 << 20, '\0');
  for (size_t i = 0; i < big.size(); i += 4096)
    big[i] = static_cast<char>(i >> 12);
  const std::vector<std::string> payloads = {"before", big, "after"};
  for (Compression c : kAllCompressions) {
    const std::string path =
        dir.File("big.tfrecord" + std::string(CompressionSuffix(c)));
    testing::WriteRecords(
        path, payloads,
        {.compression = c, .level = c == Compression::kNone ? 0 : 1});
    const auto back = testing::ReadRecords(path);
    ASSERT_EQ(back.size(), 3u) << CompressionName(c);
    EXPECT_EQ(back[0], "before");
    EXPECT_TRUE(back[1] == big) << CompressionName(c);
    EXPECT_EQ(back[2], "after");
    std::filesystem::remove(path);
  }
}

TEST(TFRecordWriterTest, DestroyedWithoutCloseLeavesNothing) {
  TempDir dir;
  for (Compression c : kAllCompressions) {
    TFRecordWriter writer(dir.File("x"), {.compression = c});
    writer.Write("a record");
    writer.Flush();
  }
  EXPECT_TRUE(dir.List().empty());
}

// A file written over another drops the other's index (FILE.idx), which
// no longer describes it; a writer that is destroyed unclosed replaces
// nothing and leaves the index where it was.
TEST(TFRecordWriterTest, ReplacingAFileRemovesItsOldIndex) {
  TempDir dir;
  const std::string path = dir.File("f.tfrecord");
  const std::string idx = IndexPathFor(path);
  testing::WriteRecords(path, {"one", "two", "three"});
  WriteIndex(idx, BuildIndex(path));
  {
    TFRecordWriter unclosed(path);
    unclosed.Write("lost");
  }
  EXPECT_EQ(ReadIndex(idx).entries.size(), 3u);
  TFRecordWriter writer(path);
  writer.Write("only");
  writer.Close();
  EXPECT_FALSE(std::filesystem::exists(idx));
  EXPECT_EQ(testing::ReadRecords(path), std::vector<std::string>{"only"});
  // Non-atomic writers replace the file when opened, so the same holds.
  WriteIndex(idx, BuildIndex(path));
  TFRecordWriter direct(path, {.atomic = false});
  direct.Write("a");
  direct.Write("b");
  direct.Close();
  EXPECT_FALSE(std::filesystem::exists(idx));
}

TEST(TFRecordWriterTest, FlushMakesRecordsReadableBeforeClose) {
  TempDir dir;
  for (Compression c : {Compression::kNone, Compression::kZstd}) {
    TFRecordWriter writer(dir.File("f"), {.compression = c, .atomic = false});
    writer.Write("one");
    writer.Write("two");
    writer.Flush();
    EXPECT_EQ(testing::ReadRecords(dir.File("f")),
              (std::vector<std::string>{"one", "two"}));
    writer.Close();
  }
}

TEST(TFRecordWriterTest, ZstdFramesHoldWholeRecords) {
  TempDir dir;
  const auto payloads = testing::RandomPayloads(5000, 1000, 5);
  TFRecordWriter writer(dir.File("f.zst"), {.compression = Compression::kZstd,
                                            .zstd_frame_bytes = 100 << 10,
                                            .build_index = true});
  for (const auto& p : payloads) writer.Write(p);
  writer.Close();
  const Index& index = writer.index();
  ASSERT_EQ(index.entries.size(), payloads.size());
  uint64_t frames = 0, last_frame = UINT64_MAX;
  for (size_t i = 0; i < payloads.size(); ++i) {
    const IndexEntry& e = index.entries[i];
    EXPECT_EQ(e.size, payloads[i].size() + 16);
    if (e.frame_offset != last_frame) {
      ++frames;
      last_frame = e.frame_offset;
      EXPECT_EQ(e.offset, 0u) << "a frame starts with a record";
    }
  }
  // ~2.5 MB of records in ~100 KiB frames.
  EXPECT_GT(frames, 20u);
}

// Frames compressed on worker threads: the same bytes and the same index
// as one thread, with flushes and a frame per few records.
TEST(TFRecordWriterTest, ParallelZstdWritesTheSameBytesAndIndex) {
  TempDir dir;
  const auto payloads = testing::RandomPayloads(3000, 2000, 7);
  std::vector<std::string> files;
  std::vector<Index> indexes;
  for (int threads : {1, 2, 5}) {
    const std::string path = dir.File(fmt::format("t{}.zst", threads));
    TFRecordWriter writer(path, {.compression = Compression::kZstd,
                                 .atomic = false,
                                 .zstd_frame_bytes = 20 << 10,
                                 .build_index = true,
                                 .compression_threads = threads});
    for (size_t i = 0; i < payloads.size(); ++i) {
      writer.Write(payloads[i]);
      if (i == 1234) {
        writer.Flush();  // every record so far is in the file
        EXPECT_EQ(testing::ReadRecords(path).size(), i + 1) << threads;
      }
    }
    writer.Close();
    files.push_back(testing::ReadFileBytes(path));
    indexes.push_back(writer.index());
    EXPECT_EQ(testing::ReadRecords(path), payloads) << threads;
  }
  for (size_t t = 1; t < files.size(); ++t) {
    EXPECT_TRUE(files[t] == files[0]) << t;
    ASSERT_EQ(indexes[t].entries.size(), payloads.size());
    for (size_t i = 0; i < payloads.size(); ++i) {
      const IndexEntry &a = indexes[0].entries[i], &b = indexes[t].entries[i];
      ASSERT_EQ(std::tie(a.offset, a.size, a.frame_offset, a.frame_bytes),
                std::tie(b.offset, b.size, b.frame_offset, b.frame_bytes))
          << "record " << i;
    }
  }
}

// Levels: higher is smaller on compressible data; out of range is an
// error that names the level, before anything is written.
TEST(TFRecordWriterTest, CompressionLevels) {
  TempDir dir;
  std::vector<std::string> payloads;
  for (int i = 0; i < 2000; ++i) {
    payloads.push_back(
        fmt::format("record {} of a fairly repetitive text, "
                    "{} {} {}",
                    i, i % 7, i * 31 % 1000, "abcabcabc"));
  }
  for (Compression c : {Compression::kGzip, Compression::kZstd}) {
    const int high = c == Compression::kZstd ? 19 : 9;
    testing::WriteRecords(dir.File("low"), payloads,
                          {.compression = c, .level = 1});
    testing::WriteRecords(dir.File("high"), payloads,
                          {.compression = c, .level = high});
    EXPECT_LT(std::filesystem::file_size(dir.File("high")),
              std::filesystem::file_size(dir.File("low")))
        << CompressionName(c);
    EXPECT_EQ(testing::ReadRecords(dir.File("high")), payloads);
  }
  // A level the codec lacks (or any for an uncompressed file, where it
  // was ignored) is refused before a file is made.
  const auto refusal = [&](Compression c, int level) {
    try {
      TFRecordWriter writer(dir.File("bad"),
                            {.compression = c, .level = level});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string bad = dir.File("bad") + ": compression level ";
  EXPECT_EQ(refusal(Compression::kGzip, 10),
            bad + "10: gzip takes 1 to 9 (0: its default, 6)");
  EXPECT_EQ(refusal(Compression::kZlib, -1),
            bad + "-1: zlib takes 1 to 9 (0: its default, 6)");
  EXPECT_EQ(refusal(Compression::kZstd, 23),
            bad + fmt::format("23: zstd takes {} to 22 (0: its default, 3)",
                              ZSTD_minCLevel()));
  EXPECT_EQ(refusal(Compression::kNone, 5),
            bad +
                "5: an uncompressed file has no level (zlib, gzip and zstd "
                "do)");
  EXPECT_EQ(refusal(Compression::kZstd, -5), "");  // zstd's fast levels
  std::filesystem::remove(dir.File("bad"));
  EXPECT_THROW(TFRecordWriter(dir.File("bad"),
                              {.compression = Compression::kZlib, .level = 99}),
               Error);
  EXPECT_FALSE(std::filesystem::exists(dir.File("bad")));
}

TEST(TFRecordWriterTest, IndexIsRefusedForZlibAndGzip) {
  TempDir dir;
  EXPECT_THROW(
      TFRecordWriter(dir.File("f.gz"),
                     {.compression = Compression::kGzip, .build_index = true}),
      Error);
  EXPECT_TRUE(dir.List().empty());
}

TEST(TFRecordWriterTest, WriteAfterCloseIsAnError) {
  TempDir dir;
  TFRecordWriter writer(dir.File("f"));
  writer.Close();
  EXPECT_THROW(writer.Write("late"), Error);
}

}  // namespace
}  // namespace recflow::records
