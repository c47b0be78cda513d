// The global shuffle: a bijection, every record once per epoch, elastic
// restore.
#include "pipeline/global_shuffle.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <set>

#include "pipeline/dataset.h"
#include "pipeline/io.h"
#include "pipeline/process.h"
#include "pipeline/stages.h"
#include "pipeline/state.h"
#include "pipeline_test_util.h"
#include "records/errors.h"
#include "records/index.h"
#include "records/io_faults.h"
#include "records/tfrecord_format.h"
#include "test_util.h"

namespace recflow::pipeline {
namespace {

using testing::Collect;
using testing::Records;

// The cursor plans the records of its next positions ahead of their turn
// (to prefetch their index entries): what it returns must still be, one by
// one, the order's definition (global_shuffle.cc), across epoch boundaries
// the lookahead runs past first, up to the last epoch's end, and after a
// restore with another sharding mid-way into a cursor that had planned.
TEST(GlobalShuffleCursorTest, ReturnsTheOrdersDefinitionPositionByPosition) {
  stages::GlobalShuffleSource source;
  const std::vector<uint64_t> sizes = {7, 1, 5};  // 13 records
  uint64_t id = 0;
  for (uint64_t n : sizes) {
    auto index = std::make_shared<records::Index>();
    index->entries.resize(n);
    source.indexes.push_back(index);
    source.starts.push_back(id);
    id += n;
  }
  source.total = id;
  source.options.num_epochs = 4;
  const uint64_t seed = 21;
  // Where position p of the epochs' stream is: (file, record).
  auto expected = [&](uint64_t p) {
    const uint64_t epoch = p / source.total;
    const FeistelPermutation order(source.total,
                                   epoch > 0 ? MixSeed(seed, epoch) : seed);
    uint64_t x = order(p % source.total);
    size_t file = 0;
    while (x >= sizes[file]) x -= sizes[file++];
    return std::pair<size_t, uint64_t>(file, x);
  };
  for (int64_t shards : {1, 3}) {
    source.options.num_shards = shards;
    source.options.shard_index = shards - 1;
    stages::GlobalShuffleCursor cursor(&source, seed);
    uint64_t taken = 0;
    size_t file = 0;
    uint64_t record = 0;
    std::string state;
    while (cursor.Next(&file, &record)) {
      const uint64_t p = static_cast<uint64_t>(shards - 1 + taken * shards);
      ASSERT_EQ(std::make_pair(file, record), expected(p))
          << "shards " << shards << " position " << p;
      ++taken;
      if (taken == 9) {
        StateWriter w("cursor");
        cursor.Save(&w);
        state = std::move(w).Finish();
      }
    }
    EXPECT_EQ(taken, (4 * source.total - (shards - 1) + shards - 1) / shards);
    // Restored with 2 readers after 9 records of `shards` readers: the
    // first 9 * shards positions are done; reader 1 of 2 goes on from
    // there, stepping by 2, to the end of the fourth epoch.
    source.options.num_shards = 2;
    source.options.shard_index = 1;
    stages::GlobalShuffleCursor restored(&source, seed);
    // A cursor that planned ahead already: the restore drops that plan.
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(restored.Next(&file, &record));
    StateReader r(state, "cursor");
    restored.Restore(&r);
    uint64_t p = 9 * static_cast<uint64_t>(shards) + 1;
    while (restored.Next(&file, &record)) {
      ASSERT_EQ(std::make_pair(file, record), expected(p))
          << "restored from " << shards << ", position " << p;
      p += 2;
    }
    EXPECT_GE(p, 4 * source.total);
  }
}

TEST(FeistelPermutationTest, IsABijectionForManySizes) {
  for (uint64_t n :
       {1ull, 2ull, 3ull, 7ull, 64ull, 1000ull, 4097ull, 65536ull}) {
    FeistelPermutation p(n, 99);
    std::vector<bool> seen(n);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t x = p(i);
      ASSERT_LT(x, n);
      ASSERT_FALSE(seen[x]) << "n=" << n << " i=" << i;
      seen[x] = true;
    }
  }
}

TEST(FeistelPermutationTest, SeedsGiveDifferentWellSpreadOrders) {
  const uint64_t n = 10000;
  FeistelPermutation a(n, 1), b(n, 2);
  uint64_t same = 0, fixed = 0, displacement = 0;
  for (uint64_t i = 0; i < n; ++i) {
    same += a(i) == b(i);
    fixed += a(i) == i;
    displacement += a(i) > i ? a(i) - i : i - a(i);
  }
  EXPECT_LT(same, 20u);
  EXPECT_LT(fixed, 20u);
  // A uniform permutation moves an element n/3 on average.
  EXPECT_GT(displacement / n, n / 4);
  EXPECT_LT(displacement / n, n / 2);
}

class GlobalShuffleTest : public ::testing::Test {
 protected:
  // Two readers (shards 0 and 1 of 2) take `each` records apiece, as
  // synchronous training steps would, and reader 0 saves; three readers
  // restored from that state read to the end.  Adds every record read to
  // `seen`.
  static void TwoThenThreeReaders(
      const std::function<Dataset(int64_t shards, int64_t index)>& make,
      int each, std::multiset<std::string>* seen) {
    std::string state;
    for (int k = 0; k < 2; ++k) {
      Iterator it = make(2, k).MakeIterator();
      Element e;
      for (int i = 0; i < each; ++i) {
        ASSERT_TRUE(it.Next(&e)) << "reader " << k << " record " << i;
        seen->insert(std::string(e["record"].bytes(0)));
      }
      if (k == 0) state = it.Save();
    }
    for (int k = 0; k < 3; ++k) {
      Iterator it = make(3, k).MakeIterator();
      it.Restore(state);
      Element e;
      while (it.Next(&e)) seen->insert(std::string(e["record"].bytes(0)));
    }
  }

  void SetUp() override {
    for (int f = 0; f < 3; ++f) {
      std::vector<std::string> recs;
      for (int r = 0; r < 50 + 17 * f; ++r) {
        recs.push_back(fmt::format("f{}r{}", f, r));
      }
      files_.push_back(dir_.File(fmt::format("g{}.tfrecord", f)));
      // The first file has an index; the others are indexed in memory.
      records::WriterOptions o;
      testing::WriteRecords(files_.back(), recs, o);
      if (f == 0) {
        records::WriteIndex(records::IndexPathFor(files_.back()),
                            records::BuildIndex(files_.back()));
      }
      for (auto& r : recs) all_.insert(r);
    }
  }
  testing::TempDir dir_;
  std::vector<std::string> files_;
  std::set<std::string> all_;
};

TEST_F(GlobalShuffleTest, EachEpochIsAFreshPermutationOfAllRecords) {
  GlobalShuffleOptions o;
  o.seed = 5;
  SetLogSink([](std::string_view) {});
  auto got = Records(
      Collect(Dataset::FromTFRecordsGlobalShuffle(files_, o).Repeat(2)));
  SetLogSink(nullptr);
  ASSERT_EQ(got.size(), 2 * all_.size());
  std::vector<std::string> e1(got.begin(), got.begin() + all_.size());
  std::vector<std::string> e2(got.begin() + all_.size(), got.end());
  EXPECT_EQ(std::set<std::string>(e1.begin(), e1.end()), all_);
  EXPECT_EQ(std::set<std::string>(e2.begin(), e2.end()), all_);
  EXPECT_NE(e1, e2);
  // Records of all files mix from the start.
  std::set<char> first_files;
  for (size_t i = 0; i < 10; ++i) first_files.insert(e1[i][1]);
  EXPECT_GT(first_files.size(), 1u);
}

TEST_F(GlobalShuffleTest, ShardsPartitionTheEpoch) {
  SetLogSink([](std::string_view) {});
  std::multiset<std::string> union_;
  for (int k = 0; k < 3; ++k) {
    GlobalShuffleOptions o;
    o.seed = 8;
    o.num_shards = 3;
    o.shard_index = k;
    for (auto& r :
         Records(Collect(Dataset::FromTFRecordsGlobalShuffle(files_, o)))) {
      union_.insert(r);
    }
  }
  SetLogSink(nullptr);
  EXPECT_EQ(union_.size(), all_.size());
  EXPECT_EQ(std::set<std::string>(union_.begin(), union_.end()), all_);
}

TEST_F(GlobalShuffleTest,
       ElasticRestoreWithAnotherShardCountLosesAndRepeatsNothing) {
  SetLogSink([](std::string_view) {});
  auto make = [&](int64_t shards, int64_t index) {
    GlobalShuffleOptions o;
    o.seed = 21;
    o.num_shards = shards;
    o.shard_index = index;
    return Dataset::FromTFRecordsGlobalShuffle(files_, o);
  };
  // Two workers take 20 records each, three continue the epoch.
  std::multiset<std::string> seen;
  TwoThenThreeReaders(make, 20, &seen);
  SetLogSink(nullptr);
  if (HasFatalFailure()) return;
  EXPECT_EQ(seen.size(), all_.size());
  EXPECT_EQ(std::set<std::string>(seen.begin(), seen.end()), all_);
}

TEST_F(GlobalShuffleTest, StateIsSmallAndResumesExactly) {
  SetLogSink([](std::string_view) {});
  GlobalShuffleOptions o;
  o.seed = 4;
  auto ds = Dataset::FromTFRecordsGlobalShuffle(files_, o).Repeat(2);
  auto reference = Records(Collect(ds));
  Iterator a = ds.MakeIterator();
  Element e;
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(a.Next(&e));
  const std::string state = a.Save();
  EXPECT_LT(state.size(), 400u);
  Iterator b = ds.MakeIterator();
  b.Restore(state);
  std::vector<std::string> rest;
  while (b.Next(&e)) rest.emplace_back(e["record"].bytes(0));
  SetLogSink(nullptr);
  EXPECT_EQ(rest,
            std::vector<std::string>(reference.begin() + 200, reference.end()));
}

TEST_F(GlobalShuffleTest, EpochsKeepTheShardsInStepAcrossEpochBoundaries) {
  SetLogSink([](std::string_view) {});
  auto make = [&](int64_t shards, int64_t index) {
    GlobalShuffleOptions o;
    o.seed = 5;
    o.num_shards = shards;
    o.shard_index = index;
    o.num_epochs = 3;
    return Dataset::FromTFRecordsGlobalShuffle(files_, o);
  };
  // One reader: epoch 0 is the one-epoch order, later epochs differ, and
  // each epoch holds every record once.
  GlobalShuffleOptions one;
  one.seed = 5;
  const auto epoch0 =
      Records(Collect(Dataset::FromTFRecordsGlobalShuffle(files_, one)));
  const auto all3 = Records(Collect(make(1, 0)));
  ASSERT_EQ(all3.size(), 3 * all_.size());
  const size_t n = all_.size();
  EXPECT_EQ(std::vector<std::string>(all3.begin(), all3.begin() + n), epoch0);
  EXPECT_NE(std::vector<std::string>(all3.begin() + n, all3.begin() + 2 * n),
            epoch0);
  for (int e = 0; e < 3; ++e) {
    EXPECT_EQ(
        std::set<std::string>(all3.begin() + e * n, all3.begin() + (e + 1) * n),
        all_);
  }
  // Two readers (201 records: 2 does not divide them) take 250 each in
  // step, well past the first epoch's end; reader 0's state then goes on
  // with three readers to the end of the third epoch.
  std::multiset<std::string> seen;
  TwoThenThreeReaders(make, 250, &seen);
  SetLogSink(nullptr);
  if (HasFatalFailure()) return;
  ASSERT_EQ(seen.size(), 3 * all_.size());
  for (const auto& r : all_) EXPECT_EQ(seen.count(r), 3u) << r;
}

// The batched random reads the fused global shuffle uses: every range's
// bytes, with io_uring and with pread; ranges past the end come back
// short; injected short reads are completed, injected errors name the file.
TEST(ReadRangesTest, ReadsEveryRangeWithAndWithoutIoUring) {
  testing::TempDir dir;
  const std::string path = dir.File("bytes");
  std::string content(300000, '\0');
  for (size_t i = 0; i < content.size(); ++i) {
    content[i] = static_cast<char>(i * 131 + i / 977);
  }
  testing::WriteFileBytes(path, content);
  const records::ReadableFile file(path);
  // 600 ranges (more than a ring's 256 entries), the last past the end.
  std::vector<std::pair<uint64_t, size_t>> ranges;
  for (uint64_t i = 0; i < 599; ++i) {
    ranges.push_back({(i * 7919) % 299000, 1 + (i * 37) % 1000});
  }
  ranges.push_back({299900, 500});
  auto read_all = [&](std::vector<std::string>* got) {
    got->assign(ranges.size(), std::string());
    std::vector<RangeRead> reads(ranges.size());
    for (size_t i = 0; i < ranges.size(); ++i) {
      (*got)[i].resize(ranges[i].second);
      reads[i] = {&file, ranges[i].first, ranges[i].second, (*got)[i].data(),
                  0};
    }
    ReadRanges(reads);
    for (size_t i = 0; i < ranges.size(); ++i) (*got)[i].resize(reads[i].done);
  };
  auto expect_content = [&](const std::vector<std::string>& got,
                            const std::string& what) {
    for (size_t i = 0; i < ranges.size(); ++i) {
      ASSERT_EQ(got[i], content.substr(ranges[i].first, ranges[i].second))
          << what << " range " << i;
    }
  };
  std::vector<std::string> got;
  for (bool disabled : {false, true}) {
    DisableIoUringForTesting(disabled);
    const std::string what = disabled ? "pread" : "io_uring";
    read_all(&got);
    expect_content(got, what);
    EXPECT_EQ(got.back().size(), 100u) << what;
    {
      // Every third read transfers at most 3 bytes: completed.
      records::NthCallFaults faults(records::IoOp::kRead, 3, 0, 3);
      records::ScopedIoFaults scope(&faults);
      read_all(&got);
      EXPECT_GT(faults.faults(), 0u) << what;
    }
    expect_content(got, what + ", short reads");
    {
      records::NthCallFaults faults(records::IoOp::kRead, 50, EIO);
      records::ScopedIoFaults scope(&faults);
      try {
        read_all(&got);
        FAIL() << what << ": no error";
      } catch (const records::IoError& e) {
        EXPECT_NE(std::string(e.what()).find(path), std::string::npos)
            << e.what();
      }
    }
    // The ring is usable after a failed batch.
    read_all(&got);
    expect_content(got, what + ", after an error");
  }
  DisableIoUringForTesting(false);
}

// A record damaged after indexing fails where the order reaches it, and
// the reader steps past it: IgnoreErrors gets every other record (a
// reader that retried the record would fail on it forever).
TEST_F(GlobalShuffleTest, ADamagedRecordFailsOnceAndIsSteppedPast) {
  for (const auto& f : files_) {
    records::WriteIndex(records::IndexPathFor(f), records::BuildIndex(f));
  }
  std::string bytes = testing::ReadFileBytes(files_[1]);
  bytes[records::kHeaderBytes + 1] ^= 0x20;  // record 0's payload
  testing::WriteFileBytes(files_[1], bytes);
  GlobalShuffleOptions o;
  o.seed = 5;
  const Dataset ds = Dataset::FromTFRecordsGlobalShuffle(files_, o);
  Iterator it = ds.MakeIterator();
  Element e;
  size_t records = 0, errors = 0;
  while (true) {
    try {
      if (!it.Next(&e)) break;
      ++records;
    } catch (const records::RecordError& err) {
      ++errors;
      EXPECT_NE(std::string(err.what()).find(files_[1] + ": record 0 "),
                std::string::npos)
          << err.what();
    }
  }
  EXPECT_EQ(errors, 1u);
  EXPECT_EQ(records, all_.size() - 1);
  EXPECT_EQ(Records(Collect(ds.IgnoreErrors())).size(), all_.size() - 1);
}

// A file that grew after it was indexed: its index would leave the newer
// records out of every epoch, so the dataset refuses it, saying why and
// how to mend it; indexed again, every record is read.
TEST_F(GlobalShuffleTest, AnIndexThatDoesNotReachTheFilesEndIsRefused) {
  const std::string f = files_[0];  // the one with an index
  const uint64_t indexed_bytes = std::filesystem::file_size(f);
  testing::WriteFileBytes(
      f, testing::ReadFileBytes(f) + testing::ReadFileBytes(files_[1]));
  try {
    Dataset::FromTFRecordsGlobalShuffle(files_);
    FAIL() << "a stale index was used";
  } catch (const records::Error& e) {
    EXPECT_EQ(
        std::string(e.what()),
        fmt::format("{}.idx: its 50 records end at byte {}, but {} has "
                    "{} bytes: the file changed after it was indexed "
                    "(`recflow index {}` indexes it again)",
                    f, indexed_bytes, f, std::filesystem::file_size(f), f));
  }
  records::WriteIndex(records::IndexPathFor(f), records::BuildIndex(f));
  EXPECT_EQ(Collect(Dataset::FromTFRecordsGlobalShuffle(files_)).size(),
            all_.size() + 67);
}

TEST_F(GlobalShuffleTest, RejectsZeroEpochs) {
  GlobalShuffleOptions o;
  o.num_epochs = 0;
  EXPECT_THROW(Dataset::FromTFRecordsGlobalShuffle(files_, o), Error);
}

}  // namespace
}  // namespace recflow::pipeline
