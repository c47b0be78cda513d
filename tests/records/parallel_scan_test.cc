#include "records/parallel_scan.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "records/tfrecord_writer.h"
#include "test_util.h"

namespace recflow::records {
namespace {

using testing::TempDir;

ScanResult Sequential(const std::string& path) {
  return ScanFile(path, {}, /*threads=*/1);
}

// min_segment_bytes = 1 forces segments even on small files.
ScanResult Parallel(const std::string& path, int threads) {
  return ScanFile(path, {}, threads, /*min_segment_bytes=*/1);
}

TEST(ParallelScanTest, CountsExactlyWhatASequentialReadCounts) {
  TempDir dir;
  const auto payloads = testing::RandomPayloads(5000, 3000, 31);
  testing::WriteRecords(dir.File("f"), payloads);
  uint64_t payload_bytes = 0;
  for (const auto& p : payloads) payload_bytes += p.size();
  for (int threads : {1, 2, 3, 7, 16}) {
    const ScanResult r = Parallel(dir.File("f"), threads);
    EXPECT_EQ(r.records, payloads.size()) << threads;
    EXPECT_EQ(r.payload_bytes, payload_bytes) << threads;
    EXPECT_EQ(r.stream_bytes, std::filesystem::file_size(dir.File("f")));
    EXPECT_EQ(r.threads, threads) << "every segment found a record start";
  }
}

// Payloads that hold complete, valid TFRecord frames of their own: a
// segment can synchronise on one of them.  The chain from byte 0 must skip
// over such a segment and still count exactly.
TEST(ParallelScanTest, FalseSynchronisationInsidePayloadsIsDiscarded) {
  TempDir dir;
  std::vector<std::string> payloads;
  for (int i = 0; i < 400; ++i) {
    std::string inner;
    for (int k = 0; k < 20; ++k) {
      inner += testing::ReferenceFrame("fake-" + std::to_string(k));
    }
    payloads.push_back(inner);
  }
  testing::WriteRecords(dir.File("f"), payloads);
  for (int threads : {2, 5, 13}) {
    const ScanResult r = Parallel(dir.File("f"), threads);
    EXPECT_EQ(r.records, payloads.size()) << threads;
  }
}

// The error is the one a sequential reader throws first: same kind,
// offset and index, wherever the damage lies.
TEST(ParallelScanTest, ReportsTheFirstDamageWithItsGlobalIndex) {
  TempDir dir;
  const auto payloads = testing::RandomPayloads(3000, 500, 32);
  testing::WriteRecords(dir.File("good"), payloads);
  const std::string good = testing::ReadFileBytes(dir.File("good"));
  std::vector<size_t> starts;
  size_t at = 0;
  for (const auto& p : payloads) {
    starts.push_back(at);
    at += p.size() + 16;
  }
  for (size_t record : {size_t{0}, size_t{1234}, size_t{2999}}) {
    for (size_t byte : {size_t{2}, size_t{13}}) {
      std::string bad = good;
      bad[starts[record] + std::min(byte, payloads[record].size() + 15)] ^= 4;
      bad[starts[std::min(record + 500, size_t{2999})] + 1] ^= 4;  // later
      testing::WriteFileBytes(dir.File("bad"), bad);
      std::optional<RecordError> expected, got;
      try {
        Sequential(dir.File("bad"));
      } catch (const RecordError& e) {
        expected = e;
      }
      try {
        Parallel(dir.File("bad"), 4);
      } catch (const RecordError& e) {
        got = e;
      }
      ASSERT_TRUE(expected && got) << record;
      EXPECT_EQ(got->offset(), expected->offset());
      EXPECT_EQ(got->record_index(), expected->record_index());
      EXPECT_EQ(got->record_index(), record);
      EXPECT_EQ(got->kind(), expected->kind());
      EXPECT_STREQ(got->what(), expected->what());
    }
  }
}

TEST(ParallelScanTest, TruncatedTailIsReportedAsSequentially) {
  TempDir dir;
  const auto payloads = testing::RandomPayloads(2000, 400, 33);
  testing::WriteRecords(dir.File("f"), payloads);
  const std::string full = testing::ReadFileBytes(dir.File("f"));
  testing::WriteFileBytes(dir.File("cut"), full.substr(0, full.size() - 5));
  try {
    Parallel(dir.File("cut"), 3);
    FAIL();
  } catch (const RecordError& e) {
    EXPECT_EQ(e.kind(), DamageKind::kTruncatedData);
    EXPECT_EQ(e.record_index(), payloads.size() - 1);
  }
}

TEST(ParallelScanTest, CompressedFilesAreScannedSequentially) {
  TempDir dir;
  TFRecordWriter writer(dir.File("f.gz"), {.compression = Compression::kGzip});
  for (int i = 0; i < 100; ++i) writer.Write("record");
  writer.Close();
  const ScanResult r = Parallel(dir.File("f.gz"), 4);
  EXPECT_EQ(r.records, 100u);
  EXPECT_EQ(r.threads, 1);
  EXPECT_EQ(r.compression, Compression::kGzip);
}

// Bytes read from a pipe, which has no size: `recflow count` reports
// them as the file's bytes.
ScanResult ScanThroughAPipe(const std::string& bytes,
                            const ReaderOptions& options) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  std::thread writer([&] {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n =
          ::write(fds[1], bytes.data() + done, bytes.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    ::close(fds[1]);
  });
  ScanResult r;
  try {
    r = ScanFile("/dev/fd/" + std::to_string(fds[0]), options, 4, 1);
  } catch (...) {
    ::close(fds[0]);
    writer.join();
    throw;
  }
  ::close(fds[0]);
  writer.join();
  return r;
}

TEST(ParallelScanTest, APipeIsReadOnceAndItsBytesCounted) {
  TempDir dir;
  const auto payloads = testing::RandomPayloads(3000, 500, 7);
  testing::WriteRecords(dir.File("f"), payloads);
  const std::string plain = testing::ReadFileBytes(dir.File("f"));
  ScanResult r = ScanThroughAPipe(plain, {});
  EXPECT_EQ(r.records, payloads.size());
  EXPECT_EQ(r.threads, 1);
  EXPECT_EQ(r.file_bytes, plain.size());
  EXPECT_EQ(r.stream_bytes, plain.size());
  // Compressed: the compressed bytes (a pipe's codec is named, not
  // detected: its first bytes cannot be read twice).
  TFRecordWriter writer(dir.File("f.zst"), {.compression = Compression::kZstd});
  for (const auto& p : payloads) writer.Write(p);
  writer.Close();
  const std::string zstd = testing::ReadFileBytes(dir.File("f.zst"));
  r = ScanThroughAPipe(zstd, {.compression = Compression::kZstd});
  EXPECT_EQ(r.records, payloads.size());
  EXPECT_EQ(r.file_bytes, zstd.size());
  EXPECT_EQ(r.stream_bytes, plain.size());
  // A regular file read on several threads reports its size too.
  EXPECT_EQ(Parallel(dir.File("f"), 4).file_bytes, plain.size());
}

}  // namespace
}  // namespace recflow::records
