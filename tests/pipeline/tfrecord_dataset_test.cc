// The TFRecord source: files, compressions, parallel reads, io_uring and
// pread, damage, parsing, and memory.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <thread>

#include "pipeline/dataset.h"
#include "pipeline/io.h"
#include "pipeline/process.h"
#include "pipeline/stages.h"
#include "pipeline_test_util.h"
#include "records/example_builder.h"
#include "records/example_parser.h"
#include "records/feature_spec.h"
#include "records/io_faults.h"
#include "test_util.h"

namespace recflow::pipeline {
namespace {

using stages::OpenFileRecords;
using stages::RecordView;
using testing::Collect;
using testing::DrainWithErrors;
using testing::NextOrError;
using testing::Records;

// The records `ds` delivers up to its first RecordError, and that error
// (none where the stream ended without one).
struct UntilError {
  std::vector<std::string> records;
  std::optional<records::RecordError> error;
};
UntilError ReadUntilError(const Dataset& ds) {
  UntilError out;
  Iterator it = ds.MakeIterator();
  Element e;
  try {
    while (it.Next(&e)) out.records.emplace_back(e["record"].bytes(0));
  } catch (const records::RecordError& err) {
    out.error = err;
  }
  return out;
}

class TFRecordDatasetTest : public ::testing::Test {
 protected:
  // Three files of records "f<i>-r<j>" of various sizes, some longer than a
  // 4 KiB block.
  void SetUp() override {
    for (int f = 0; f < 3; ++f) {
      std::vector<std::string> recs;
      for (int r = 0; r < 40 + 10 * f; ++r) {
        std::string rec = fmt::format("f{}-r{}", f, r);
        rec.resize(rec.size() + static_cast<size_t>((r * 997) % 9000), 'x');
        recs.push_back(rec);
      }
      files_.push_back(dir_.File(fmt::format("part-{}.tfrecord", f)));
      testing::WriteRecords(files_.back(), recs);
      all_.push_back(recs);
    }
  }
  // Files 0 and 1, file 1 gzipped, a pipe (which the source refuses as
  // it opens it), file 2, and file 1 as it is.
  std::vector<std::string> FilesWithAPipe() {
    const std::string fifo = dir_.File("pipe.tfrecord");
    EXPECT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    const std::vector<std::string> files = {
        files_[0], dir_.File("part-1.tfrecord.gz"), fifo, files_[2], files_[1]};
    testing::WriteRecords(files[1], all_[1], records::Compression::kGzip);
    return files;
  }
  std::vector<std::string> Sequential() const {
    std::vector<std::string> v;
    for (const auto& f : all_) v.insert(v.end(), f.begin(), f.end());
    return v;
  }

  testing::TempDir dir_;
  std::vector<std::string> files_;
  std::vector<std::vector<std::string>> all_;
};

TEST_F(TFRecordDatasetTest, ReadsFilesInOrder) {
  EXPECT_EQ(Records(Collect(Dataset::FromTFRecords(files_))), Sequential());
  // A directory and a glob give the same files.
  EXPECT_EQ(Records(Collect(Dataset::FromTFRecords({dir_.path().string()}))),
            Sequential());
  EXPECT_EQ(Records(Collect(Dataset::FromTFRecords({dir_.File("part-*")}))),
            Sequential());
  EXPECT_THROW(Dataset::FromTFRecords({dir_.File("nothing-*")}), Error);
}

// FileRecords::KeepBlocksIn (the fused path's reading): views of records
// within a block come without an owner, each block they view kept once,
// before them; records across blocks own their bytes; the kept blocks
// alone hold the views' bytes once the reader is gone; and after
// KeepBlocksIn(nullptr) every view owns its bytes again.
TEST_F(TFRecordDatasetTest, KeptBlocksHoldTheRecordsWithinThem) {
  TFRecordOptions o;
  o.io.block_bytes = 4096;
  const auto path = std::make_shared<const std::string>(files_[0]);
  auto reader = OpenFileRecords(path, 0, 0, o);
  std::vector<std::shared_ptr<const void>> blocks;
  reader->KeepBlocksIn(&blocks);
  std::vector<RecordView> views;
  size_t within = 0;
  for (RecordView v; reader->NextView(&v); v = RecordView{}) {
    if (v.owner == nullptr) {
      ++within;
      ASSERT_FALSE(blocks.empty()) << views.size();
      const auto* block = static_cast<const char*>(blocks.back().get());
      EXPECT_TRUE(v.data >= block && v.data + v.size <= block + 4096)
          << "record " << views.size() << " is not in the last block kept";
    }
    views.push_back(std::move(v));
  }
  ASSERT_EQ(views.size(), all_[0].size());
  EXPECT_GT(within, 0u);
  EXPECT_LT(within, views.size()) << "some records cross blocks";
  std::set<const void*> distinct;
  for (const auto& b : blocks) distinct.insert(b.get());
  EXPECT_EQ(distinct.size(), blocks.size()) << "a block kept twice";
  reader.reset();
  for (size_t i = 0; i < views.size(); ++i) {
    EXPECT_EQ(views[i].bytes(), all_[0][i]) << i;
  }

  reader = OpenFileRecords(path, 0, 0, o);
  blocks.clear();
  reader->KeepBlocksIn(&blocks);
  RecordView v;
  ASSERT_TRUE(reader->NextView(&v));
  EXPECT_EQ(v.owner, nullptr);
  EXPECT_EQ(blocks.size(), 1u);
  reader->KeepBlocksIn(nullptr);
  for (size_t i = 1; i < all_[0].size(); ++i) {
    ASSERT_TRUE(reader->NextView(&v));
    EXPECT_NE(v.owner, nullptr) << i;
    EXPECT_EQ(v.bytes(), all_[0][i]) << i;
  }
  EXPECT_EQ(blocks.size(), 1u);
}

TEST_F(TFRecordDatasetTest, FileSourcesRefuseAPipe) {
  // A pipe gives its records once: a second epoch, a second reader or a
  // restored state would silently get none, and reopening a named pipe
  // waits for a writer.  (The sources only stat the name: opening it here,
  // with no writer, would hang this test.)  FromTFRecords checks each
  // file as it opens it, in its place in the stream (a long file list is
  // not stat'ed when the dataset is made, as tf.data touches no file
  // then); the global shuffle and FromCsv's first file when made.
  const std::string fifo = dir_.File("pipe.tfrecord");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string expected =
      fifo + ": not a regular file (a pipe, socket or device): " +
      std::string(kSourcesNeedRegularFiles) + "; write it to a file first";
  auto message = [](auto make) {
    try {
      make();
    } catch (const records::IoError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  Iterator it = Dataset::FromTFRecords({files_[0], fifo}).MakeIterator();
  Element e;
  for (size_t i = 0; i < all_[0].size(); ++i) ASSERT_TRUE(it.Next(&e));
  EXPECT_EQ(message([&] { it.Next(&e); }), expected);
  EXPECT_EQ(message([&] {
              Collect(Dataset::FromTFRecords({fifo}).Batch(4).Parse(
                  records::FeatureSpec{}));
            }),
            expected);  // the fused path
  EXPECT_EQ(message([&] { Dataset::FromTFRecordsGlobalShuffle({fifo}); }),
            expected);
  EXPECT_EQ(message([&] { Dataset::FromCsv({fifo}); }), expected);
  // A character device too (what /dev/stdin is with nothing redirected).
  EXPECT_THROW(Collect(Dataset::FromTFRecords({"/dev/null"})),
               records::IoError);
}

TEST_F(TFRecordDatasetTest, AutotunedParallelReadsAreOneFilePerCore) {
  // tf.data.AUTOTUNE's cycle length: the machine's cores, here at most the
  // three files; fixed when the dataset is made, so the iterator's threads
  // do not change the order.
  TFRecordOptions o;
  o.num_parallel_reads = kAutotune;
  const Dataset tuned = Dataset::FromTFRecords(files_, o);
  const int n = static_cast<int>(
      std::min(3u, std::max(1u, std::thread::hardware_concurrency())));
  EXPECT_NE(tuned.Describe().find(fmt::format("parallel_reads={},", n)),
            std::string::npos)
      << tuned.Describe();
  o.num_parallel_reads = n;
  const auto want = Records(Collect(Dataset::FromTFRecords(files_, o)));
  for (int threads : {1, 4}) {
    EXPECT_EQ(Records(Collect(tuned, {.threads = threads})), want) << threads;
  }
  o.num_parallel_reads = -2;
  EXPECT_THROW(Dataset::FromTFRecords(files_, o), Error);
}

TEST_F(TFRecordDatasetTest, ParallelReadsInterleaveRecordByRecord) {
  TFRecordOptions o;
  o.num_parallel_reads = 2;
  const auto got = Records(Collect(Dataset::FromTFRecords(files_, o)));
  // Files 0 and 1 alternate; file 2 takes file 0's slot when it ends.
  std::vector<std::string> want;
  size_t i0 = 0, i1 = 0, i2 = 0;
  int slot = 0;
  // slot 0: file 0 then file 2; slot 1: file 1.
  bool slot0_on_file2 = false;
  while (want.size() < Sequential().size()) {
    if (slot == 0) {
      if (!slot0_on_file2 && i0 < all_[0].size()) {
        want.push_back(all_[0][i0++]);
      } else if (!slot0_on_file2) {
        slot0_on_file2 = true;  // the slot closes; the cycle moves on
        slot = 1;
        continue;
      } else if (i2 < all_[2].size()) {
        want.push_back(all_[2][i2++]);
      }
    } else if (i1 < all_[1].size()) {
      want.push_back(all_[1][i1++]);
    }
    slot ^= 1;
  }
  EXPECT_EQ(got, want);
}

// tf.data's interleave with a block_length: that many records from each
// open file in turn, fewer where a file ends (the cycle then moves on and
// the next block starts whole), a finished file's slot refilled when the
// cycle comes back to it.  Worked by hand for files of 5 and 3 records
// and blocks of 2, then checked against tf.data's loop written out.
TEST_F(TFRecordDatasetTest, BlockLengthTakesThatManyRecordsFromEachFile) {
  std::vector<std::string> small;
  const std::pair<int, int> sizes[] = {{0, 5}, {1, 3}};
  for (const auto& [f, n] : sizes) {
    std::vector<std::string> recs;
    for (int r = 0; r < n; ++r) recs.push_back(fmt::format("s{}r{}", f, r));
    small.push_back(dir_.File(fmt::format("small-{}.tfrecord", f)));
    testing::WriteRecords(small.back(), recs);
  }
  TFRecordOptions o;
  o.num_parallel_reads = 2;
  o.block_length = 2;
  EXPECT_EQ(Records(Collect(Dataset::FromTFRecords(small, o))),
            (std::vector<std::string>{"s0r0", "s0r1", "s1r0", "s1r1", "s0r2",
                                      "s0r3", "s1r2", "s0r4"}));

  for (int block : {1, 3, 7, 100}) {
    o.block_length = block;
    // tf.data's InterleaveDataset loop over the three fixture files.
    std::vector<std::string> want;
    std::vector<int> file(2, -1);
    std::vector<size_t> next(2, 0);
    size_t cycle = 0, opened = 0;
    int open = 0, taken = 0;
    while (open > 0 || opened < all_.size()) {
      if (file[cycle] >= 0) {
        const auto& recs = all_[static_cast<size_t>(file[cycle])];
        if (next[cycle] < recs.size()) {
          want.push_back(recs[next[cycle]++]);
          if (++taken == block) {
            cycle = (cycle + 1) % 2;
            taken = 0;
          }
          continue;
        }
        file[cycle] = -1;
        --open;
      } else if (opened < all_.size()) {
        file[cycle] = static_cast<int>(opened++);
        next[cycle] = 0;
        ++open;
        continue;
      }
      cycle = (cycle + 1) % 2;
      taken = 0;
    }
    EXPECT_EQ(Records(Collect(Dataset::FromTFRecords(files_, o))), want)
        << "block_length " << block;
  }
  o.block_length = 0;
  EXPECT_THROW(Dataset::FromTFRecords(files_, o), Error);
}

TEST_F(TFRecordDatasetTest, CompressedFilesGiveTheSameRecords) {
  for (auto c : {records::Compression::kZlib, records::Compression::kGzip,
                 records::Compression::kZstd}) {
    std::vector<std::string> files;
    for (size_t f = 0; f < all_.size(); ++f) {
      files.push_back(dir_.File(
          fmt::format("c{}.tfrecord{}", f, records::CompressionSuffix(c))));
      testing::WriteRecords(files.back(), all_[f], c);
    }
    TFRecordOptions o;
    o.num_parallel_reads = 3;
    EXPECT_EQ(Records(Collect(Dataset::FromTFRecords(files, o))),
              Records(Collect(Dataset::FromTFRecords(files_, o))));
  }
}

TEST_F(TFRecordDatasetTest, IoUringAndPreadGiveIdenticalStreams) {
  std::vector<std::vector<std::string>> streams;
  for (auto backend : {IoBackend::kIoUring, IoBackend::kPread}) {
    for (size_t block : {size_t{4096}, size_t{1} << 20}) {
      if (backend == IoBackend::kIoUring && !IoUringAvailable()) continue;
      TFRecordOptions o;
      o.io.backend = backend;
      o.io.block_bytes = block;
      o.io.read_ahead = 3;
      streams.push_back(Records(Collect(Dataset::FromTFRecords(files_, o))));
    }
  }
  ASSERT_GE(streams.size(), 2u);
  for (const auto& s : streams) EXPECT_EQ(s, Sequential());
}

// A file in the page cache is read with non-blocking reads: the io_uring
// reader sets up its ring only for a read that would wait (here, one that
// the fault seam sends through the ring).
TEST_F(TFRecordDatasetTest, IoUringSetsUpARingOnlyForReadsThatWait) {
  if (!IoUringAvailable()) GTEST_SKIP() << "io_uring is not available here";
  TFRecordOptions o;
  o.io.backend = IoBackend::kIoUring;
  o.io.block_bytes = 8192;
  Collect(Dataset::FromTFRecords(files_, o));  // now cached
  const uint64_t before = IoUringRingsSetUp();
  EXPECT_EQ(Records(Collect(Dataset::FromTFRecords(files_, o))), Sequential());
  EXPECT_EQ(IoUringRingsSetUp(), before);
  records::NthCallFaults faults(records::IoOp::kRead, 2, 0, 100);
  records::ScopedIoFaults scope(&faults);
  EXPECT_EQ(Records(Collect(Dataset::FromTFRecords(files_, o))), Sequential());
  EXPECT_GT(IoUringRingsSetUp(), before);
}

// Through the fault seam (records/io_faults.h), for both readers: a failing
// read reaches next() as an IoError naming the file; short reads change
// nothing.
TEST_F(TFRecordDatasetTest, ReadFaultsReachNextAndShortReadsChangeNothing) {
  for (auto backend : {IoBackend::kIoUring, IoBackend::kPread}) {
    if (backend == IoBackend::kIoUring && !IoUringAvailable()) continue;
    for (bool direct : {false, true}) {
      TFRecordOptions o;
      o.io.backend = backend;
      o.io.block_bytes = 8192;
      o.io.read_ahead = 3;
      o.io.direct = direct;
      SCOPED_TRACE(fmt::format("{} direct={}", IoBackendName(backend), direct));
      for (uint64_t every : {1, 3, 10}) {
        records::NthCallFaults faults(records::IoOp::kRead, every, EIO);
        records::ScopedIoFaults scope(&faults);
        try {
          Collect(Dataset::FromTFRecords(files_, o));
          ADD_FAILURE() << "no error, every " << every;
        } catch (const records::IoError& e) {
          EXPECT_NE(std::find(files_.begin(), files_.end(), e.path()),
                    files_.end())
              << e.what();
          EXPECT_EQ(e.errno_value(), EIO);
        }
      }
      for (size_t short_bytes : {size_t{1}, size_t{100}, size_t{5000}}) {
        records::NthCallFaults faults(records::IoOp::kRead, 2, 0, short_bytes);
        records::ScopedIoFaults scope(&faults);
        EXPECT_EQ(Records(Collect(Dataset::FromTFRecords(files_, o))),
                  Sequential());
        EXPECT_GT(faults.faults(), 0u);
      }
    }
  }
}

TEST_F(TFRecordDatasetTest, DirectIoGivesTheSameRecords) {
  TFRecordOptions o;
  o.io.direct = true;
  o.io.block_bytes = 8192;
  std::vector<std::string> log;
  SetLogSink([&](std::string_view l) { log.emplace_back(l); });
  EXPECT_EQ(Records(Collect(Dataset::FromTFRecords(files_, o))), Sequential());
  SetLogSink(nullptr);
}

TEST_F(TFRecordDatasetTest, WithoutIoUringAutoFallsBackToPread) {
  DisableIoUringForTesting(true);
  auto blocks = OpenBlockReader(files_[0], 0, IoOptions{});
  EXPECT_EQ(blocks->backend(), IoBackend::kPread);
  IoOptions forced;
  forced.backend = IoBackend::kIoUring;
  EXPECT_THROW(OpenBlockReader(files_[0], 0, forced), records::IoError);
  EXPECT_EQ(Records(Collect(Dataset::FromTFRecords(files_))), Sequential());
  DisableIoUringForTesting(false);
  if (IoUringAvailable()) {
    EXPECT_EQ(OpenBlockReader(files_[0], 0, IoOptions{})->backend(),
              IoBackend::kIoUring);
  }
}

TEST_F(TFRecordDatasetTest, ShuffledFilesChangeOrderPerEpoch) {
  TFRecordOptions o;
  o.shuffle_files = true;
  o.seed = 11;
  auto got = Records(Collect(Dataset::FromTFRecords(files_, o).Repeat(4)));
  // Each epoch is the files in some order; not all epochs alike.
  std::set<std::string> firsts;
  const size_t n = Sequential().size();
  for (size_t e = 0; e < 4; ++e) {
    std::vector<std::string> epoch(got.begin() + e * n,
                                   got.begin() + (e + 1) * n);
    auto sorted = epoch;
    std::sort(sorted.begin(), sorted.end());
    auto want = Sequential();
    std::sort(want.begin(), want.end());
    EXPECT_EQ(sorted, want);
    firsts.insert(epoch[0]);
  }
  EXPECT_GT(firsts.size(), 1u);
}

TEST_F(TFRecordDatasetTest, ShardTakesWholeFilesWhenThereAreEnough) {
  auto ds = Dataset::FromTFRecords(files_);
  EXPECT_EQ(Records(Collect(ds.Shard(3, 1))), all_[1]);
  // Four shards of three files: by record.
  auto by_record = Records(Collect(ds.Shard(4, 1)));
  const auto seq = Sequential();
  std::vector<std::string> want;
  for (size_t i = 1; i < seq.size(); i += 4) want.push_back(seq[i]);
  EXPECT_EQ(by_record, want);
}

TEST_F(TFRecordDatasetTest, DamageNamesFileOffsetAndRecord) {
  std::string bytes = testing::ReadFileBytes(files_[1]);
  // Flip a byte inside record 2's payload.
  const auto recs = all_[1];
  const size_t offset2 = recs[0].size() + recs[1].size() + 32;
  bytes[offset2 + 12 + 3] ^= 0x40;
  testing::WriteFileBytes(files_[1], bytes);
  const UntilError got = ReadUntilError(Dataset::FromTFRecords(files_));
  ASSERT_TRUE(got.error) << "damage not reported";
  EXPECT_EQ(got.error->path(), files_[1]);
  EXPECT_EQ(got.error->offset(), offset2);
  EXPECT_EQ(got.error->record_index(), 2u);
  EXPECT_EQ(got.error->kind(), records::DamageKind::kDataCrcMismatch);
  EXPECT_EQ(got.records.size(), all_[0].size() + 2);
  // IgnoreErrors: the damaged file ends there, the next file follows.
  auto rest = Records(Collect(Dataset::FromTFRecords(files_).IgnoreErrors()));
  EXPECT_EQ(rest.size(), all_[0].size() + 2 + all_[2].size());
}

// A block's short records are checked many at once, ahead of the reader
// (the rest of the block as it is reached); a damaged one far into the
// block still ends the stream at its place, after every record before it.
TEST_F(TFRecordDatasetTest, DamageFarIntoABlockKeepsItsPlace) {
  testing::TempDir dir;
  const std::string file = dir.File("short.tfrecord");
  std::vector<std::string> recs;
  for (int i = 0; i < 200; ++i) recs.push_back(fmt::format("record {:03}", i));
  testing::WriteRecords(file, recs);
  for (const size_t damaged :
       {size_t{70}, size_t{31}, size_t{32}, size_t{199}}) {
    std::string bytes = testing::ReadFileBytes(file);
    size_t offset = 0;
    for (size_t i = 0; i < damaged; ++i) offset += recs[i].size() + 16;
    std::string broken = bytes;
    broken[offset + 12 + 2] ^= 0x01;
    const std::string path =
        dir.File(fmt::format("broken{}.tfrecord", damaged));
    testing::WriteFileBytes(path, broken);
    const UntilError got = ReadUntilError(Dataset::FromTFRecords({path}));
    ASSERT_TRUE(got.error) << "damage to record " << damaged << " not reported";
    EXPECT_EQ(got.error->offset(), offset);
    EXPECT_EQ(got.error->record_index(), damaged);
    EXPECT_EQ(got.error->kind(), records::DamageKind::kDataCrcMismatch);
    const std::vector<std::string> before(
        recs.begin(), recs.begin() + static_cast<std::ptrdiff_t>(damaged));
    EXPECT_EQ(got.records, before);
  }
}

// max_record_bytes holds for records whose frames were checked ahead (and
// kept then) as for the rest: the first record over it ends the stream.
TEST_F(TFRecordDatasetTest, ARecordOverTheMaximumEndsTheStreamAtItsPlace) {
  testing::TempDir dir;
  const std::string file = dir.File("mixed.tfrecord");
  std::vector<std::string> recs;
  for (int i = 0; i < 60; ++i)
    recs.push_back(std::string(i == 45 ? 40 : 20, 'a'));
  testing::WriteRecords(file, recs);
  TFRecordOptions options;
  options.max_record_bytes = 30;
  const UntilError got =
      ReadUntilError(Dataset::FromTFRecords({file}, options));
  ASSERT_TRUE(got.error) << "a record over the maximum was read";
  EXPECT_EQ(got.error->record_index(), 45u);
  EXPECT_EQ(got.error->offset(), 45u * (20 + 16));
  EXPECT_EQ(got.error->kind(), records::DamageKind::kImplausibleLength);
  EXPECT_EQ(got.records.size(), 45u);
}

TEST_F(TFRecordDatasetTest, TruncatedFileIsAnErrorNotAShorterStream) {
  std::string bytes = testing::ReadFileBytes(files_[0]);
  bytes.resize(bytes.size() - 5);
  testing::WriteFileBytes(files_[0], bytes);
  EXPECT_THROW(Collect(Dataset::FromTFRecords({files_[0]})),
               records::RecordError);
}

std::string MakeExample(int64_t label, int n) {
  records::ExampleBuilder b;
  b.AddInt64("label", label);
  std::vector<float> px(4);
  for (int k = 0; k < 4; ++k) px[k] = static_cast<float>(label * 10 + k);
  b.AddFloatList("pixels", px);
  std::vector<int64_t> tokens(static_cast<size_t>(n), label);
  b.AddInt64List("tokens", tokens);
  return std::string(b.Serialize());
}

records::FeatureSpec Spec() {
  return records::FeatureSpec::FromJsonText(R"({"features": {
    "label": {"kind": "fixed", "dtype": "int64", "shape": []},
    "pixels": {"kind": "fixed", "dtype": "float32", "shape": [2, 2]},
    "tokens": {"kind": "var", "dtype": "int64"}}})");
}

TEST(ParseDatasetTest, ParsesOneOrABatchOfExamples) {
  testing::TempDir dir;
  std::vector<std::string> recs;
  for (int i = 0; i < 10; ++i) recs.push_back(MakeExample(i, i % 3));
  testing::WriteRecords(dir.File("ex.tfrecord"), recs);
  auto source = Dataset::FromTFRecords({dir.File("ex.tfrecord")});

  auto one = Collect(source.Parse(Spec()));
  ASSERT_EQ(one.size(), 10u);
  EXPECT_EQ(one[7]["label"].shape(), (Shape{}));
  EXPECT_EQ(one[7]["label"].scalar<int64_t>(), 7);
  EXPECT_EQ(one[7]["pixels"].shape(), (Shape{2, 2}));
  EXPECT_EQ(one[7]["pixels"].data<float>()[3], 73.0f);
  EXPECT_EQ(one[5]["tokens"].shape(), (Shape{2}));

  ParseOptions po;
  po.num_parallel_calls = 2;
  auto batched = Collect(source.Batch(4).Parse(Spec(), po), {.threads = 2});
  ASSERT_EQ(batched.size(), 3u);
  EXPECT_EQ(batched[1]["pixels"].shape(), (Shape{4, 2, 2}));
  EXPECT_EQ(batched[1]["label"].data<int64_t>()[3], 7);
  ASSERT_TRUE(batched[1]["tokens"].ragged());
  EXPECT_EQ(batched[1]["tokens"].row_lengths().values<int64_t>()[1],
            2);  // ex 5
  // Unbatching the parsed batches gives the per-example parse.
  auto unbatched = Collect(source.Batch(4).Parse(Spec()).Unbatch());
  ASSERT_EQ(unbatched.size(), one.size());
  for (size_t i = 0; i < one.size(); ++i) EXPECT_EQ(unbatched[i], one[i]) << i;
}

TEST(ParseDatasetTest, ParseErrorsNameTheFileAndRecord) {
  testing::TempDir dir;
  std::vector<std::string> recs;
  for (int i = 0; i < 6; ++i) recs.push_back(MakeExample(i, 1));
  records::ExampleBuilder b;
  b.AddFloatList("label", std::vector<float>{1.0f});  // wrong type
  recs[4] = std::string(b.Serialize());
  testing::WriteRecords(dir.File("bad.tfrecord"), recs);
  for (bool batch : {false, true}) {
    auto ds = Dataset::FromTFRecords({dir.File("bad.tfrecord")}).Shuffle(6, 1);
    ds = batch ? ds.Batch(3).Parse(Spec()) : ds.Parse(Spec());
    try {
      Collect(ds);
      FAIL() << "no parse error";
    } catch (const records::ParseError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(dir.File("bad.tfrecord") + ": record 4"),
                std::string::npos)
          << what;
      EXPECT_NE(what.find("label"), std::string::npos) << what;
    }
  }
}

TEST(FixtureDatasetTest, MnistFixtureParsesThroughThePipeline) {
  const std::string dir = testing::FixturesDir();
  if (dir.empty()) GTEST_SKIP() << "fixtures not found";
  const std::string path = dir + "/tf/tfx_mnist_1000_example.tfrecord";
  auto spec = records::FeatureSpec::FromJsonText(R"({"features": {
    "image_class": {"kind": "fixed", "dtype": "int64", "shape": []},
    "image_floats": {"kind": "fixed", "dtype": "float32", "shape": [784]}}})");
  auto out = Collect(Dataset::FromTFRecords({path})
                         .Shuffle(256, 5)
                         .Batch(100, true)
                         .Parse(spec)
                         .Prefetch(2));
  ASSERT_EQ(out.size(), 10u);
  std::multiset<int64_t> labels;
  for (const auto& b : out) {
    EXPECT_EQ(b["image_floats"].shape(), (Shape{100, 784}));
    for (int64_t l : b["image_class"].values<int64_t>()) labels.insert(l);
  }
  EXPECT_EQ(labels.size(), 1000u);
  for (int64_t l : labels) {
    EXPECT_GE(l, 0);
    EXPECT_LE(l, 9);
  }
}

// The shuffle copies records out of their read blocks into reused slots
// of size classes (shuffle.cc's SlotPool): every size, at and around the
// class edges and past the largest class, must come out byte for byte,
// and records held after later epochs reused the slots must not change.
TEST(ShuffleSlotsTest, ShuffledRecordsAreExactCopiesWhateverTheirSize) {
  testing::TempDir dir;
  const std::string path = dir.File("sizes.tfrecord");
  std::vector<std::string> recs;
  for (size_t n : {0,    1,    63,    64,    65,    127,   128,   129,
                   159,  160,  161,   1000,  3135,  3136,  3137,  4095,
                   4096, 4097, 40000, 65535, 65536, 65537, 100000}) {
    for (int copy = 0; copy < 3; ++copy) {
      std::string r(n, '\0');
      for (size_t i = 0; i < n; ++i) {
        r[i] = static_cast<char>((i * 131 + n * 7 + copy) & 0xff);
      }
      recs.push_back(std::move(r));
    }
  }
  testing::WriteRecords(path, recs);
  std::multiset<std::string> want(recs.begin(), recs.end());
  const auto got =
      Records(Collect(Dataset::FromTFRecords({path}).Shuffle(16, 9).Repeat(4)));
  ASSERT_EQ(got.size(), 4 * recs.size());
  for (size_t epoch = 0; epoch < 4; ++epoch) {
    const auto begin =
        got.begin() + static_cast<std::ptrdiff_t>(epoch * recs.size());
    EXPECT_EQ(std::multiset<std::string>(
                  begin, begin + static_cast<std::ptrdiff_t>(recs.size())),
              want)
        << "epoch " << epoch;
  }
  // And shuffled: the first epoch is not the file's order.
  EXPECT_NE(
      std::vector<std::string>(
          got.begin(), got.begin() + static_cast<std::ptrdiff_t>(recs.size())),
      recs);
}

uint64_t RssBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * 4096;
}

TEST(StreamingMemoryTest, ADatasetLargerThanTheBuffersStreamsWithFlatMemory) {
  testing::TempDir dir;
  const std::string path = dir.File("big.tfrecord");
  {
    records::TFRecordWriter w(path);
    std::string rec(1000, 'r');
    for (int i = 0; i < 96 * 1024; ++i) {  // ~96 MiB
      rec[0] = static_cast<char>(i);
      w.Write(rec);
    }
    w.Close();
  }
  auto ds =
      Dataset::FromTFRecords({path}).Shuffle(1000, 1).Batch(64).Prefetch(4);
  Iterator it = ds.MakeIterator();
  Element e;
  ASSERT_TRUE(it.Next(&e));
  const uint64_t base = RssBytes();
  uint64_t peak = base;
  size_t batches = 1;
  while (it.Next(&e)) {
    if (++batches % 64 == 0) peak = std::max(peak, RssBytes());
  }
  EXPECT_EQ(batches, (96 * 1024 + 63) / 64);
  // Buffers: shuffle ~1 MB, prefetch 4 x 64 KB, a few 1 MiB blocks.  The
  // data is 96 MiB; growth must stay far below it.
  EXPECT_LT(peak - base, uint64_t{24} << 20)
      << "RSS grew from " << base << " to " << peak;
}

// The pipeline's own reader of uncompressed files says what a file of
// another format starts like, as records::TFRecordReader does.
TEST_F(TFRecordDatasetTest, AFileOfAnotherFormatIsNamedAsSuch) {
  testing::WriteFileBytes(dir_.File("data.tfrecord"), "a,b\n1,2\n3,4\n");
  try {
    Collect(Dataset::FromTFRecords({dir_.File("data.tfrecord")}));
    FAIL() << "a CSV file was read as records";
  } catch (const records::RecordError& e) {
    EXPECT_NE(std::string(e.what()).find("the stream starts like text, not a "
                                         "TFRecord frame"),
              std::string::npos)
        << e.what();
  }
}

// TFRecordOptions::shuffle_buffer_per_file is, by definition, the
// interleave of each file shuffled on its own: Interleave over the files'
// places of FromTFRecords({file}).Shuffle(n, FileShuffleSeed(seed, i)).
Dataset ShuffledPerFileByHand(const std::vector<std::string>& files,
                              int64_t cycle, int64_t buffer, uint64_t seed) {
  return Dataset::Range(0, static_cast<int64_t>(files.size()))
      .Interleave(
          [files, buffer, seed](const Element& e) {
            const auto i = static_cast<size_t>(e["value"].scalar<int64_t>());
            return Dataset::FromTFRecords({files[i]})
                .Shuffle(buffer, stages::FileShuffleSeed(seed, i),
                         /*reshuffle_each_iteration=*/false);
          },
          cycle, 1);
}

TEST_F(TFRecordDatasetTest,
       AShuffleBufferPerFileShufflesEachFileThenInterleaves) {
  for (int cycle : {1, 2, 3}) {
    for (int64_t buffer : {2, 7, 45, 1000}) {
      TFRecordOptions o;
      o.num_parallel_reads = cycle;
      o.shuffle_buffer_per_file = buffer;
      o.seed = 5;
      o.reshuffle_each_iteration = false;
      const auto got = Records(Collect(Dataset::FromTFRecords(files_, o)));
      EXPECT_EQ(
          got,
          Records(Collect(ShuffledPerFileByHand(files_, cycle, buffer, 5))))
          << "cycle " << cycle << " buffer " << buffer;
      // A permutation of the records, each file's among themselves: the
      // cycle's turns take the files as unshuffled reads do.
      TFRecordOptions plain;
      plain.num_parallel_reads = cycle;
      const auto unshuffled =
          Records(Collect(Dataset::FromTFRecords(files_, plain)));
      ASSERT_EQ(got.size(), unshuffled.size());
      EXPECT_NE(got, unshuffled) << "cycle " << cycle << " buffer " << buffer;
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].substr(0, 3), unshuffled[i].substr(0, 3)) << i;
      }
      auto sorted = got;
      std::sort(sorted.begin(), sorted.end());
      auto want = Sequential();
      std::sort(want.begin(), want.end());
      EXPECT_EQ(sorted, want);
    }
  }
  // A buffer of one record draws the only one: the files' own order.
  TFRecordOptions one;
  one.num_parallel_reads = 2;
  one.shuffle_buffer_per_file = 1;
  TFRecordOptions plain;
  plain.num_parallel_reads = 2;
  EXPECT_EQ(Records(Collect(Dataset::FromTFRecords(files_, one))),
            Records(Collect(Dataset::FromTFRecords(files_, plain))));
}

TEST_F(TFRecordDatasetTest, AShuffleBufferPerFileReshufflesEachEpochBySeed) {
  TFRecordOptions o;
  o.num_parallel_reads = 2;
  o.shuffle_buffer_per_file = 16;
  o.seed = 9;
  const auto ds = Dataset::FromTFRecords(files_, o).Repeat(3);
  const auto got = Records(Collect(ds));
  EXPECT_EQ(Records(Collect(ds)), got);  // the same seed, the same order
  const size_t n = Sequential().size();
  ASSERT_EQ(got.size(), 3 * n);
  auto want = Sequential();
  std::sort(want.begin(), want.end());
  std::set<std::vector<std::string>> epochs;
  for (size_t e = 0; e < 3; ++e) {
    std::vector<std::string> epoch(got.begin() + e * n,
                                   got.begin() + (e + 1) * n);
    epochs.insert(epoch);
    std::sort(epoch.begin(), epoch.end());
    EXPECT_EQ(epoch, want) << "epoch " << e;
  }
  EXPECT_EQ(epochs.size(), 3u);
  o.seed = 10;
  EXPECT_NE(Records(Collect(Dataset::FromTFRecords(files_, o).Repeat(3))), got);
  // Not reshuffled: every epoch alike.
  o.reshuffle_each_iteration = false;
  const auto same =
      Records(Collect(Dataset::FromTFRecords(files_, o).Repeat(2)));
  EXPECT_TRUE(std::equal(same.begin(), same.begin() + static_cast<ptrdiff_t>(n),
                         same.begin() + static_cast<ptrdiff_t>(n)));
  o.shuffle_buffer_per_file = -1;
  EXPECT_THROW(Dataset::FromTFRecords(files_, o), Error);
}

// Saved after each record, stage by stage (the fused path's states are
// tested with it, batch_parse_fusion_test.cc): the buffers are saved by
// reference, and a restored iterator gives the rest.
TEST_F(TFRecordDatasetTest, AShuffleBufferPerFileIsSavedAndRestored) {
  TFRecordOptions o;
  o.num_parallel_reads = 2;
  o.shuffle_buffer_per_file = 12;
  const auto ds = Dataset::FromTFRecords(files_, o).Repeat(2);
  const IteratorOptions stages{.threads = 1, .optimize = false};
  Iterator it = ds.MakeIterator(stages);  // unseeded: the state keeps it
  std::vector<std::string> all;
  std::vector<std::string> states;
  Element e;
  states.push_back(it.Save());
  while (it.Next(&e)) {
    all.emplace_back(e["record"].bytes(0));
    states.push_back(it.Save());
  }
  for (size_t k = 0; k < states.size(); k += 7) {
    Iterator restored = ds.MakeIterator(stages);
    restored.Restore(states[k]);
    std::vector<std::string> rest;
    while (restored.Next(&e)) rest.emplace_back(e["record"].bytes(0));
    EXPECT_TRUE(std::equal(rest.begin(), rest.end(),
                           all.begin() + static_cast<ptrdiff_t>(k), all.end()))
        << "k " << k;
    EXPECT_EQ(rest.size(), all.size() - k) << "k " << k;
  }
}

// A damaged record ends its file after the records buffered before it
// were drawn: none of them is lost, and the error names its place.
TEST_F(TFRecordDatasetTest, AShuffleBufferPerFileLosesNoRecordBeforeDamage) {
  std::string bytes = testing::ReadFileBytes(files_[1]);
  const auto& recs = all_[1];
  uint64_t offset = 0;
  for (int r = 0; r < 20; ++r)
    offset += recs[static_cast<size_t>(r)].size() + 16;
  bytes[offset + 12 + 3] ^= 0x40;
  testing::WriteFileBytes(files_[1], bytes);
  TFRecordOptions o;
  o.shuffle_buffer_per_file = 8;
  o.seed = 3;
  const UntilError got = ReadUntilError(Dataset::FromTFRecords(files_, o));
  ASSERT_TRUE(got.error);
  EXPECT_EQ(got.error->path(), files_[1]);
  EXPECT_EQ(got.error->offset(), offset);
  EXPECT_EQ(got.error->record_index(), 20u);
  // File 0 whole, then file 1's first 20 records in some order.
  ASSERT_EQ(got.records.size(), all_[0].size() + 20);
  std::vector<std::string> before(
      got.records.begin() + static_cast<ptrdiff_t>(all_[0].size()),
      got.records.end());
  std::sort(before.begin(), before.end());
  std::vector<std::string> want(recs.begin(), recs.begin() + 20);
  std::sort(want.begin(), want.end());
  EXPECT_EQ(before, want);
  EXPECT_EQ(
      Records(Collect(Dataset::FromTFRecords(files_, o).IgnoreErrors())).size(),
      all_[0].size() + 20 + all_[2].size());
}

// Sets stages::SetTFRecordReadAhead back to its default when a test that
// turned it off ends.
struct ReadAheadAgain {
  ~ReadAheadAgain() { stages::SetTFRecordReadAhead(true); }
};

// Reading each open file, and as many upcoming ones, ahead on a thread of
// its own (num_parallel_reads > 1) changes only where the reading happens:
// the records, the errors' places and the states after every one of them
// are those of reading the files in turn, byte for byte, for a compressed
// file, one that cannot be opened (a pipe) and a damaged one, blocks and
// shuffle buffers per file, over two epochs; and a restored iterator
// gives the rest.
TEST_F(TFRecordDatasetTest, ReadingAheadGivesWhatReadingInTurnGives) {
  const std::vector<std::string> files = FilesWithAPipe();
  std::string bytes = testing::ReadFileBytes(files_[2]);
  uint64_t offset = 0;
  for (size_t r = 0; r < 25; ++r) offset += all_[2][r].size() + 16;
  bytes[offset + 12 + 1] ^= 0x20;
  testing::WriteFileBytes(files_[2], bytes);
  ReadAheadAgain read_ahead_again;
  const IteratorOptions one{.threads = 1};
  for (int cycle : {2, 3}) {
    for (int block : {1, 2}) {
      for (int64_t buffer : {0, 5}) {
        TFRecordOptions o;
        o.num_parallel_reads = cycle;
        o.block_length = block;
        o.shuffle_buffer_per_file = buffer;
        const auto ds = Dataset::FromTFRecords(files, o).Repeat(2);
        std::vector<std::string> got[2];
        std::vector<std::string> states[2];
        for (int ahead : {0, 1}) {
          stages::SetTFRecordReadAhead(ahead == 1);
          Iterator it = ds.MakeIterator(one);
          // The same seed (the state's) for both.
          if (ahead == 1) it.Restore(states[0][0]);
          states[ahead].push_back(it.Save());
          do {
            got[ahead].push_back(NextOrError(it));
            states[ahead].push_back(it.Save());
          } while (got[ahead].back() != "<end>");
        }
        const std::string config =
            fmt::format("cycle {} block {} buffer {}", cycle, block, buffer);
        EXPECT_EQ(std::count_if(
                      got[1].begin(), got[1].end(),
                      [](const std::string& g) { return g.starts_with("!"); }),
                  4)
            << config;
        EXPECT_EQ(got[1].size(),
                  2 * (all_[0].size() + 2 * all_[1].size() + 25 + 2) + 1)
            << config;
        EXPECT_EQ(got[1], got[0]) << config;
        EXPECT_EQ(states[1], states[0]) << config;
        for (size_t k = 0; k < got[1].size(); k += 9) {
          Iterator restored = ds.MakeIterator(one);
          restored.Restore(states[1][k]);
          EXPECT_EQ(
              DrainWithErrors(restored),
              std::vector<std::string>(
                  got[1].begin() + static_cast<ptrdiff_t>(k), got[1].end()))
              << config << " saved after " << k;
        }
      }
    }
  }
}

// Not deterministic, the states save and restore exactly too: from a
// state saved after any record or error, a restored iterator gives the
// rest, and with what came before, every record and error once.  (The
// order may differ: it depends on timing.)  A file that cannot be opened,
// saved opened early and not read from, throws at its turn, not when
// the state is restored.
TEST_F(TFRecordDatasetTest, NondeterministicReadsSaveAndRestoreExactly) {
  const std::vector<std::string> files = FilesWithAPipe();
  TFRecordOptions o;
  o.num_parallel_reads = 2;
  o.deterministic = false;
  o.shuffle_buffer_per_file = 3;
  o.seed = 8;
  const auto ds = Dataset::FromTFRecords(files, o);
  const IteratorOptions one{.threads = 1};
  Iterator it = ds.MakeIterator(one);
  std::vector<std::string> got;
  std::vector<std::string> states = {it.Save()};
  do {
    got.push_back(NextOrError(it));
    states.push_back(it.Save());
  } while (got.back() != "<end>");
  auto sorted = [](std::vector<std::string> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  ASSERT_EQ(got.size(), all_[0].size() + 2 * all_[1].size() + all_[2].size() +
                            2);  // and the pipe's error
  for (size_t k = 0; k < got.size(); ++k) {
    Iterator restored = ds.MakeIterator(one);
    restored.Restore(states[k]);
    std::vector<std::string> whole(got.begin(),
                                   got.begin() + static_cast<ptrdiff_t>(k));
    const auto rest = DrainWithErrors(restored);
    whole.insert(whole.end(), rest.begin(), rest.end());
    EXPECT_EQ(sorted(whole), sorted(got)) << "saved after " << k;
  }
}

// Each open file, and each of as many upcoming ones, has a reader thread
// while it is being read (files of more records than a reader reads
// ahead), also after a restore, and none once the iterator is gone;
// reading in turn has none.
TEST_F(TFRecordDatasetTest, ParallelReadsReadEachOpenFileOnAThreadOfItsOwn) {
  ReadAheadAgain read_ahead_again;
  std::vector<std::string> files;
  for (int f = 0; f < 6; ++f) {
    files.push_back(dir_.File(fmt::format("long-{}.tfrecord", f)));
    testing::WriteRecords(files.back(),
                          std::vector<std::string>(20000, "record"));
  }
  TFRecordOptions o;
  o.num_parallel_reads = 3;
  const auto ds = Dataset::FromTFRecords(files, o);
  // Threads the process keeps once an iterator was made (TBB's) are made.
  ds.MakeIterator({.threads = 1}).Next();
  for (bool ahead : {true, false}) {
    stages::SetTFRecordReadAhead(ahead);
    const size_t before = testing::ThreadsNow();
    {
      Iterator it = ds.MakeIterator({.threads = 1});
      const size_t made = testing::ThreadsNow();
      Element e;
      for (int i = 0; i < 3; ++i) ASSERT_TRUE(it.Next(&e));  // 3 files open
      EXPECT_EQ(testing::ThreadsNow(), made + (ahead ? 6 : 0)) << ahead;
      // Restored with every slot open, the upcoming files too.
      Iterator restored = ds.MakeIterator({.threads = 1});
      restored.Restore(it.Save());
      ASSERT_TRUE(restored.Next(&e));
      EXPECT_EQ(testing::ThreadsNow(), made + (ahead ? 12 : 0)) << ahead;
    }
    EXPECT_EQ(testing::ThreadsOnceExitsSettle(before), before) << ahead;
  }
}

// Read ahead, the files' reading is the tfrecord stage's work wherever it
// runs: every read sleeps 20 ms on the reader threads, and the stage's
// busy time holds all those sleeps (three files read at once: some three
// times the time the iterator ran), while the consumer's time waiting for
// a reader, in turn (deterministic) or for any file (not), is its wait
// time, not its work.  Its parallelism is the files read at once.
TEST_F(TFRecordDatasetTest, ReadingAheadIsTheStagesBusyTimeOnItsReaders) {
  class SlowReads final : public records::IoFaultInjector {
   public:
    records::IoFault Before(records::IoOp op, std::string_view,
                            size_t) override {
      if (op == records::IoOp::kRead &&
          std::this_thread::get_id() != consumer_) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        slept_ms_.fetch_add(20);
      }
      return {};
    }
    double slept_seconds() const { return slept_ms_.load() / 1000.0; }

   private:
    const std::thread::id consumer_ = std::this_thread::get_id();
    std::atomic<uint64_t> slept_ms_{0};
  };
  for (bool deterministic : {true, false}) {
    SCOPED_TRACE(deterministic);
    SlowReads slow;
    records::ScopedIoFaults faults(&slow);
    TFRecordOptions o;
    o.num_parallel_reads = 2;
    o.deterministic = deterministic;
    Iterator it =
        Dataset::FromTFRecords(files_, o).MakeIterator({.threads = 1});
    Element e;
    size_t records = 0;
    while (it.Next(&e)) ++records;
    EXPECT_EQ(records, 40u + 50u + 60u);
    ASSERT_GE(slow.slept_seconds(), 0.06);  // a read of each file at least
    std::optional<StageStats> tfrecord;
    for (const StageStats& s : it.Stats()) {
      if (s.name == "tfrecord") tfrecord = s;
    }
    ASSERT_TRUE(tfrecord.has_value());
    EXPECT_EQ(tfrecord->parallelism, 2);
    EXPECT_GE(tfrecord->busy_seconds, 0.95 * slow.slept_seconds());
    EXPECT_GE(tfrecord->wait_seconds, 0.015);
  }
}

// deterministic = false: when the file whose turn it is has nothing read
// yet, an open file that has a record gives it.  File 0's reader decodes
// a record of 64 MiB (gzipped, tens of milliseconds) after its first 40,
// while file 1's 200 small records are read at once: in turn the large
// record comes after file 1's 40th, out of turn after (nearly) all of
// file 1.  Each file's records keep their order, none is lost or
// repeated, and deterministic reads give the order of reading in turn.
TEST_F(TFRecordDatasetTest, NondeterministicReadsTakeARecordReadyOutOfTurn) {
  std::vector<std::string> slow;
  for (int r = 0; r < 40; ++r) slow.push_back(fmt::format("slow-{}", r));
  slow.push_back(std::string(size_t{64} << 20, 'z'));
  slow.push_back("slow-last");
  std::vector<std::string> fast;
  for (int r = 0; r < 200; ++r) fast.push_back(fmt::format("fast-{}", r));
  const std::vector<std::string> files = {dir_.File("slow.tfrecord.gz"),
                                          dir_.File("fast.tfrecord")};
  testing::WriteRecords(files[0], slow, records::Compression::kGzip);
  testing::WriteRecords(files[1], fast);
  std::vector<std::string> in_turn;
  for (size_t r = 0; r < fast.size(); ++r) {
    if (r < slow.size()) in_turn.push_back(slow[r]);
    in_turn.push_back(fast[r]);
  }
  for (bool deterministic : {true, false}) {
    TFRecordOptions o;
    o.num_parallel_reads = 2;
    o.deterministic = deterministic;
    const auto got =
        Records(Collect(Dataset::FromTFRecords(files, o), {.threads = 1}));
    ASSERT_EQ(got.size(), slow.size() + fast.size());
    if (deterministic) {
      EXPECT_TRUE(got == in_turn);
      continue;
    }
    std::vector<std::string> of[2];
    for (const std::string& g : got) {
      of[g.starts_with("fast") ? 1 : 0].push_back(g);
    }
    EXPECT_TRUE(of[0] == slow);
    EXPECT_EQ(of[1], fast);
    const auto at = [&](const std::string& r) {
      return std::find(got.begin(), got.end(), r) - got.begin();
    };
    EXPECT_GT(at(slow[40]), at(fast[150]));
  }
}

}  // namespace
}  // namespace recflow::pipeline
