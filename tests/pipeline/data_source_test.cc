// TFRecordDataSource: records by number through the files' indexes, read
// and parsed as the streaming pipeline reads and parses them.
#include "pipeline/data_source.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <stdexcept>
#include <thread>

#include "pipeline/dataset.h"
#include "pipeline/error.h"
#include "pipeline/io.h"
#include "pipeline_test_util.h"
#include "records/errors.h"
#include "records/example_builder.h"
#include "records/index.h"
#include "records/tfrecord_format.h"
#include "test_util.h"

namespace recflow::pipeline {
namespace {

using testing::Collect;

std::string MakeExample(int f, int i) { return testing::MixedExample(f, i); }

records::FeatureSpec Spec() { return testing::MixedSpec(); }

// Four files: indexed on disk (uncompressed), indexed in memory, empty,
// and ZSTD in small frames with its index; `all` is their records in
// order.
class DataSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const int sizes[] = {37, 21, 0, 45};
    for (int f = 0; f < 4; ++f) {
      std::vector<std::string> recs;
      for (int i = 0; i < sizes[f]; ++i) recs.push_back(MakeExample(f, i));
      records::WriterOptions o;
      if (f == 3) {
        o.compression = records::Compression::kZstd;
        o.zstd_frame_bytes = 4096;
        o.build_index = true;
      }
      files_.push_back(dir_.File(fmt::format("f{}.tfrecord", f)));
      testing::WriteRecords(files_.back(), recs, o);
      if (f == 0) {
        records::WriteIndex(records::IndexPathFor(files_.back()),
                            records::BuildIndex(files_.back()));
      }
      all_.insert(all_.end(), recs.begin(), recs.end());
    }
  }

  static std::vector<std::string> RecordsOf(const Element& e) {
    std::vector<std::string> out;
    const Tensor& t = e["record"];
    for (int64_t k = 0; k < t.num_elements(); ++k) {
      out.emplace_back(t.bytes(k));
    }
    return out;
  }

  testing::TempDir dir_;
  std::vector<std::string> files_;
  std::vector<std::string> all_;
};

TEST_F(DataSourceTest, EveryRecordByItsNumberAcrossFilesAndCodecs) {
  TFRecordDataSource source(files_);
  ASSERT_EQ(source.size(), all_.size());
  ASSERT_EQ(source.size(), 103u);
  for (uint64_t i = 0; i < source.size(); ++i) {
    const Element e = source.Get(std::span<const uint64_t>(&i, 1), false);
    ASSERT_EQ(e["record"].shape().rank(), 0);
    ASSERT_EQ(RecordsOf(e), std::vector<std::string>{all_[i]}) << i;
    ASSERT_TRUE(e.origin.file != nullptr);
  }
  // Where record i is: file 1's first follows file 0's 37; the empty file
  // is passed over.
  EXPECT_EQ(source.Locate(37).file, 1u);
  EXPECT_EQ(source.Locate(37).record, 0u);
  EXPECT_EQ(source.Locate(37).offset, 0u);
  EXPECT_EQ(source.Locate(58).file, 3u);
  EXPECT_EQ(source.Locate(58).record, 0u);
  EXPECT_EQ(source.Locate(102).record, 44u);
  const Element one = source.Get(std::vector<uint64_t>{40}, false);
  EXPECT_EQ(*one.origin.file, files_[1]);
  EXPECT_EQ(one.origin.record, 3u);
  EXPECT_EQ(one.origin.offset, source.Locate(40).offset);
}

// A batch in any order, repeats included, mixing the codecs, is the
// records asked for; its origins name each one's file and number.
TEST_F(DataSourceTest, BatchIsTheRecordsInTheOrderAsked) {
  TFRecordDataSource source(files_);
  const std::vector<uint64_t> rows = {102, 0, 58, 36, 37, 0, 99, 57, 58};
  const Element e = source.Get(rows, true);
  std::vector<std::string> want;
  for (uint64_t r : rows) want.push_back(all_[r]);
  EXPECT_EQ(RecordsOf(e), want);
  ASSERT_TRUE(e.batch_origins != nullptr);
  ASSERT_EQ(e.batch_origins->size(), rows.size());
  for (size_t k = 0; k < rows.size(); ++k) {
    const Origin o = (*e.batch_origins)[k];
    const TFRecordDataSource::Location at = source.Locate(rows[k]);
    EXPECT_EQ(*o.file, files_[at.file]);
    EXPECT_EQ(o.record, at.record);
    EXPECT_EQ(o.offset, at.offset);
  }
  const Element none = source.Get(std::span<const uint64_t>(), true);
  EXPECT_EQ(none["record"].shape(), Shape{0});
}

// With a spec, a batch is what Batch then Parse of the same records gives
// (ragged VarLen included), and one record what Parse of it alone gives.
TEST_F(DataSourceTest, ParsedAsBatchThenParseParsesThem) {
  TFRecordDataSource source(files_, Spec());
  const std::vector<Element> whole =
      Collect(Dataset::FromTFRecords(files_).Batch(200).Parse(Spec()));
  ASSERT_EQ(whole.size(), 1u);
  const std::vector<uint64_t> rows = {5, 101, 60, 5, 40};
  const Element batch = source.Get(rows, true);
  std::vector<Element> picked;
  for (uint64_t r : rows) {
    picked.push_back(Collect(
        Dataset::FromTFRecords(files_).Skip(r).Take(1).Parse(Spec()))[0]);
  }
  const auto labels = batch["label"].values<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(labels.begin(), labels.end()),
            (std::vector<int64_t>{5, 3043, 3002, 5, 1003}));
  const auto lengths = batch["tokens"].row_lengths().values<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(lengths.begin(), lengths.end()),
            (std::vector<int64_t>{1, 3, 2, 1, 3}));
  for (size_t k = 0; k < rows.size(); ++k) {
    const Element one =
        source.Get(std::span<const uint64_t>(&rows[k], 1), false);
    EXPECT_EQ(one, picked[k]) << k;
    EXPECT_EQ(batch["blob"].bytes(static_cast<int64_t>(k)),
              whole[0]["blob"].bytes(static_cast<int64_t>(rows[k])));
  }
}

// Neighbours in a file are read with one read (runs, repeats and small
// gaps); each record is still checked on its own: a file cut short after
// it was opened fails at the first record it no longer holds whole.
TEST_F(DataSourceTest, NeighboursAreReadTogetherAndCheckedOneByOne) {
  TFRecordDataSource source(files_);
  std::vector<uint64_t> rows;
  for (uint64_t i = 0; i < 37; ++i) rows.push_back(36 - i);  // backwards
  for (uint64_t i = 0; i < 37; i += 2) rows.push_back(i);    // gaps
  rows.insert(rows.end(), {5, 5, 6, 5});                     // repeats
  std::vector<std::string> want;
  for (uint64_t r : rows) want.push_back(all_[r]);
  EXPECT_EQ(RecordsOf(source.Get(rows, true)), want);

  const TFRecordDataSource::Location cut = source.Locate(20);
  std::filesystem::resize_file(files_[0], cut.offset + 20);
  std::vector<uint64_t> across;
  for (uint64_t i = 15; i < 26; ++i) across.push_back(i);
  try {
    source.Get(across, true);
    FAIL() << "a record past the file's new end was read";
  } catch (const records::RecordError& e) {
    EXPECT_EQ(e.record_index(), 20u) << e.what();
    EXPECT_EQ(e.offset(), cut.offset);
  }
  std::vector<uint64_t> before;
  for (uint64_t i = 0; i < 20; ++i) before.push_back(i);
  EXPECT_EQ(RecordsOf(source.Get(before, true)),
            std::vector<std::string>(all_.begin(), all_.begin() + 20));
}

TEST_F(DataSourceTest, RefusesNumbersPastTheEndAndBadCalls) {
  TFRecordDataSource source(files_);
  const std::vector<uint64_t> past = {3, 103};
  EXPECT_THROW(source.Get(past, true), std::out_of_range);
  EXPECT_THROW(source.Locate(103), std::out_of_range);
  EXPECT_THROW(source.Get(std::vector<uint64_t>{1, 2}, false), Error);
  EXPECT_THROW(TFRecordDataSource({}), Error);
}

// ZLIB and GZIP streams have no index: refused by name when made.
TEST_F(DataSourceTest, RefusesStreamsThatCannotBeEnteredMidway) {
  const std::string gz = dir_.File("g.tfrecord.gz");
  testing::WriteRecords(gz, {"a", "b"}, records::Compression::kGzip);
  try {
    TFRecordDataSource source({files_[0], gz});
    FAIL() << "a gzip file was accepted";
  } catch (const records::Error& e) {
    EXPECT_NE(std::string(e.what()).find(gz), std::string::npos) << e.what();
  }
}

// A record damaged after indexing is a RecordError naming its file and
// number when it is read, and the records around it still read.
TEST_F(DataSourceTest, DamagedRecordIsAnErrorNamingIt) {
  TFRecordDataSource source(files_);
  const TFRecordDataSource::Location at = source.Locate(10);
  std::string bytes = testing::ReadFileBytes(files_[0]);
  bytes[at.offset + records::kHeaderBytes + 5] ^= 0x40;
  testing::WriteFileBytes(files_[0], bytes);
  try {
    source.Get(std::vector<uint64_t>{9, 10, 11}, true);
    FAIL() << "damage not found";
  } catch (const records::RecordError& e) {
    EXPECT_EQ(e.path(), files_[0]);
    EXPECT_EQ(e.record_index(), 10u);
    EXPECT_EQ(e.offset(), at.offset);
  }
  EXPECT_EQ(RecordsOf(source.Get(std::vector<uint64_t>{9, 11}, true)),
            (std::vector<std::string>{all_[9], all_[11]}));
}

// An index that no longer reaches the end of its file (records appended
// since) is refused when the source is made, naming both files: reading
// through it would leave the new records out.
TEST_F(DataSourceTest, StaleIndexIsRefused) {
  std::string bytes = testing::ReadFileBytes(files_[0]);
  bytes += testing::ReferenceFrame(MakeExample(0, 99));
  testing::WriteFileBytes(files_[0], bytes);
  try {
    TFRecordDataSource source(files_);
    FAIL() << "a stale index was used";
  } catch (const records::Error& e) {
    EXPECT_NE(std::string(e.what()).find(records::IndexPathFor(files_[0])),
              std::string::npos)
        << e.what();
  }
}

// Gets from several threads at once, over every codec, read what one
// thread reads.
TEST_F(DataSourceTest, ThreadsReadAtOnce) {
  TFRecordDataSource source(files_);
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        std::vector<uint64_t> rows;
        for (int k = 0; k < 16; ++k) {
          rows.push_back(
              static_cast<uint64_t>((t * 31 + round * 7 + k * 13) % 103));
        }
        const std::vector<std::string> got = RecordsOf(source.Get(rows, true));
        for (size_t k = 0; k < rows.size(); ++k) {
          if (got[k] != all_[rows[k]]) ++wrong;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

// A process forked after its thread read through the source (a PyTorch
// DataLoader's workers) reads through a ring of its own: the parent's
// ring is memory both map, and its reads land in the parent's memory.
TEST_F(DataSourceTest, ForkedChildReadsWithARingOfItsOwn) {
  TFRecordDataSource source(files_);
  const std::vector<uint64_t> rows = {1, 20, 36, 40};
  ASSERT_EQ(RecordsOf(source.Get(rows, true))[1], all_[20]);
  const uint64_t rings = IoUringRingsSetUp();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int bad = 0;
    for (int round = 0; round < 50; ++round) {
      std::vector<uint64_t> more;
      for (int k = 0; k < 8; ++k) more.push_back((round * 11 + k * 5) % 58);
      const std::vector<std::string> got = RecordsOf(source.Get(more, true));
      for (size_t k = 0; k < more.size(); ++k) bad += got[k] != all_[more[k]];
    }
    // A new ring where io_uring is there (the count is per process).
    const bool own_ring = !IoUringAvailable() || IoUringRingsSetUp() > rings;
    _exit(bad == 0 && own_ring ? 0 : 1);
  }
  // The parent reads on meanwhile, on its own ring.
  for (int round = 0; round < 50; ++round) {
    EXPECT_EQ(RecordsOf(source.Get(rows, true))[2], all_[36]);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace recflow::pipeline
