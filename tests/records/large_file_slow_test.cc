// Files over 4 GiB: offsets, indexes and stream positions are 64-bit all the
// way.  Labelled `slow` (ctest -L slow): it writes and reads ~9 GiB.
#include <gtest/gtest.h>

#include <cstring>

#include "records/index.h"
#include "records/parallel_scan.h"
#include "records/tfrecord_reader.h"
#include "records/tfrecord_writer.h"
#include "test_util.h"

namespace recflow::records {
namespace {

constexpr uint64_t kRecordBytes = uint64_t{1} << 20;
constexpr uint64_t kRecords = 4352;  // 4.25 GiB of payload

std::string Record(uint64_t i) {
  std::string r(kRecordBytes, '\0');
  std::memcpy(r.data(), &i, sizeof i);
  std::memcpy(r.data() + r.size() - sizeof i, &i, sizeof i);
  return r;
}

void CheckFile(const std::string& path, Compression c) {
  {
    TFRecordWriter writer(path, {.compression = c, .build_index = true});
    for (uint64_t i = 0; i < kRecords; ++i) writer.Write(Record(i));
    writer.Close();
    WriteIndex(IndexPathFor(path), writer.index());
  }
  TFRecordReader reader(path);
  std::string_view r;
  uint64_t n = 0;
  while (reader.ReadRecord(&r)) {
    uint64_t head, tail;
    std::memcpy(&head, r.data(), 8);
    std::memcpy(&tail, r.data() + r.size() - 8, 8);
    ASSERT_EQ(head, n);
    ASSERT_EQ(tail, n);
    ASSERT_EQ(reader.last_offset(), n * (kRecordBytes + 16));
    ++n;
  }
  EXPECT_EQ(n, kRecords);
  EXPECT_GT(reader.stats().stream_bytes, uint64_t{4} << 30);

  IndexedReader indexed(path, ReadIndex(IndexPathFor(path)));
  ASSERT_EQ(indexed.size(), kRecords);
  for (uint64_t i : {kRecords - 1, uint64_t{4097}, uint64_t{0}}) {
    EXPECT_TRUE(indexed.Read(i) == Record(i)) << i;
  }
  EXPECT_EQ(ScanFile(path, {}).records, kRecords);
}

TEST(LargeFileSlowTest, UncompressedOver4GiB) {
  testing::TempDir dir;
  CheckFile(dir.File("big.tfrecord"), Compression::kNone);
}

TEST(LargeFileSlowTest, ZstdStreamOver4GiB) {
  testing::TempDir dir;
  CheckFile(dir.File("big.tfrecord.zst"), Compression::kZstd);
}

}  // namespace
}  // namespace recflow::records
