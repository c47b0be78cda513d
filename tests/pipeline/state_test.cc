// Iterator::Save / Restore: a restored iterator continues the same stream.
#include "pipeline/state.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <set>

#include "pipeline/dataset.h"
#include "pipeline_test_util.h"
#include "records/csv_reader.h"
#include "records/errors.h"
#include "records/example_parser.h"
#include "records/file_list.h"
#include "records/input_stream.h"
#include "records/tfrecord_format.h"
#include "test_util.h"

namespace recflow::pipeline {
namespace {

using testing::Collect;
using testing::ExpectRefused;
using testing::Forged;
using testing::StateString;
using testing::U64s;

std::string Key(const Element& e) { return e.DebugString(); }

std::vector<std::string> Keys(Iterator& it, size_t limit = SIZE_MAX) {
  std::vector<std::string> out;
  Element e;
  while (out.size() < limit && it.Next(&e)) out.push_back(Key(e));
  return out;
}

// For each save point k: run k elements, save, restore into a new iterator
// (with `restore_threads`), and compare the rest with the reference.
void ExpectResumable(const Dataset& ds, const std::vector<size_t>& points,
                     int threads = 2, int restore_threads = 2) {
  Iterator ref_it = ds.MakeIterator({.threads = threads});
  // The reference with an unseeded stage depends on the iterator's seed,
  // so each save point replays from a saved state of a fresh iterator.
  const std::string initial = ref_it.Save();
  Iterator full = ds.MakeIterator({.threads = threads});
  full.Restore(initial);
  const std::vector<std::string> reference = Keys(full);
  ASSERT_FALSE(reference.empty());
  for (size_t k : points) {
    if (k > reference.size()) continue;
    Iterator a = ds.MakeIterator({.threads = threads});
    a.Restore(initial);
    std::vector<std::string> head = Keys(a, k);
    ASSERT_EQ(head.size(), k);
    const std::string state = a.Save();
    // The saving iterator goes on unchanged.
    std::vector<std::string> rest_a = Keys(a);
    Iterator b = ds.MakeIterator({.threads = restore_threads});
    b.Restore(state);
    std::vector<std::string> rest_b = Keys(b);
    std::vector<std::string> want(reference.begin() + k, reference.end());
    EXPECT_EQ(rest_a, want) << "saver diverged after " << k;
    EXPECT_EQ(rest_b, want) << "restored at " << k;
  }
}

TEST(StateTest, ZipConcatenateAndEnumerateResume) {
  auto renamed = [](const std::string& name) {
    return [name](Element e) {
      Element out;
      out.Set(name, e["value"]);
      return out;
    };
  };
  const Dataset zip =
      Dataset::Zip({Dataset::Range(0, 40).Shuffle(8, 3),
                    Dataset::Range(100, 130).Shuffle(8).Map(renamed("b"))})
          .Enumerate(10)
          .Batch(3);
  ExpectResumable(zip, {0, 1, 4, 9, 10});
  // Saved in the first input, at the switch, and in the second.
  const Dataset concat = Dataset::Range(0, 7)
                             .Shuffle(4)
                             .Concatenate(Dataset::Range(50, 60).Shuffle(3))
                             .Repeat(2);
  ExpectResumable(concat, {0, 3, 7, 8, 12, 17, 20, 33});
}

TEST(StateTest, SampleAndChooseResume) {
  // Unseeded draws and shuffles, redrawn per epoch, saved before, while and
  // after an input ends and across the epoch boundary.
  const Dataset sample =
      Dataset::SampleFromDatasets(
          {Dataset::Range(0, 12).Shuffle(5), Dataset::Range(100, 130),
           Dataset::Range(200, 204)},
          {.weights = {1, 2, 0.5}, .rerandomize_each_iteration = true})
          .Repeat(2);
  ExpectResumable(sample, {0, 1, 5, 13, 30, 45, 46, 60, 91, 92});
  // Restored after the short input ended: the draws go on among the two
  // left, as they did before the save.
  const Dataset left = Dataset::SampleFromDatasets(
      {Dataset::Range(0, 3), Dataset::Range(100, 140),
       Dataset::Range(200, 240)},
      {.seed = 9});
  ExpectResumable(left, {10, 20, 40, 60});
  const Dataset stopping = Dataset::SampleFromDatasets(
      {Dataset::Range(0, 12), Dataset::Range(100, 130)},
      {.seed = 4, .stop_on_empty_dataset = true});
  ExpectResumable(stopping, {0, 3, 11, 12, 13, 20});
  // Choices that skip an ended input, then run on after every input ended.
  const Dataset choose =
      Dataset::ChooseFromDatasets(
          {Dataset::Range(0, 5), Dataset::Range(100, 120).Shuffle(6)},
          Dataset::Range(0, 40)
              .Map([](Element e) {
                return testing::Int(e["value"].scalar<int64_t>() % 3 == 0);
              })
              .Repeat(),
          false)
          .Batch(2);
  ExpectResumable(choose, {0, 1, 2, 6, 11, 12});
}

TEST(StateTest, BucketBySequenceLengthResumes) {
  // Element i: i % 9 values; saved with elements waiting in every bucket,
  // and while the part-full buckets are delivered at the end.
  const Dataset ds =
      Dataset::Range(0, 60)
          .Map([](Element e) {
            const int64_t i = e["value"].scalar<int64_t>();
            Element out;
            out.Set("x",
                    Tensor::FromValues<int64_t>(
                        std::vector<int64_t>(static_cast<size_t>(i % 9), i),
                        Shape{i % 9}));
            return out;
          })
          .Shuffle(10, 3)
          .BucketBySequenceLength("x", {.bucket_boundaries = {3, 6},
                                        .bucket_batch_sizes = {4, 5, 7}})
          .Repeat(2);
  ExpectResumable(ds, {0, 1, 3, 7, 10, 11, 12, 13, 20, 24, 25});
  // RaggedBatch keeps Batch's state: the elements of the batch begun.
  ExpectResumable(Dataset::Range(0, 20)
                      .Map([](Element e) {
                        const int64_t i = e["value"].scalar<int64_t>();
                        Element out;
                        out.Set("x", Tensor::FromValues<int64_t>(
                                         std::vector<int64_t>(
                                             static_cast<size_t>(i % 4), i),
                                         Shape{i % 4}));
                        return out;
                      })
                      .RaggedBatch(3)
                      .Repeat(2),
                  {0, 1, 6, 7, 13});
}

TEST(StateTest, WindowTakeWhileScanUniqueGroupByWindowAndRebatchResume) {
  // Overlapping strided windows, saved with part of the next window's
  // reach read, at the short windows of the end and across epochs.
  const Dataset overlapping = Dataset::Range(0, 20)
                                  .Shuffle(6)
                                  .Window(4, {.shift = 3, .stride = 2})
                                  .Repeat(2);
  ExpectResumable(overlapping, {0, 1, 2, 5, 6, 7, 8, 13});
  // Shifts past the reach: saved with input elements still to drop.
  const Dataset sparse =
      Dataset::Range(0, 30).Window(2, {.shift = 7}).Repeat(2);
  ExpectResumable(sparse, {0, 1, 3, 4, 5, 9});
  // Saved before and after the element that ended the stream.
  const Dataset taking = Dataset::Range(0, 10)
                             .Shuffle(4)
                             .TakeWhile([](const Element& e) {
                               return e["value"].scalar<int64_t>() != 6;
                             })
                             .Repeat(3);
  ExpectResumable(taking, {0, 1, 2, 3, 4, 5, 6, 7, 8});
  {  // saved after the end: restored, it is still at the end
    Iterator a = Dataset::Range(0, 10)
                     .TakeWhile([](const Element& e) {
                       return e["value"].scalar<int64_t>() != 6;
                     })
                     .MakeIterator();
    EXPECT_EQ(Keys(a).size(), 6u);
    Iterator b = Dataset::Range(0, 10)
                     .TakeWhile([](const Element& e) {
                       return e["value"].scalar<int64_t>() != 6;
                     })
                     .MakeIterator();
    b.Restore(a.Save());
    EXPECT_EQ(Keys(b).size(), 0u);
  }
  // The scan's state travels in the iterator's: a running sum.
  Element zero;
  zero.Set("sum", Tensor::Scalar<int64_t>(0));
  const Dataset sums =
      Dataset::Range(0, 12)
          .Shuffle(5)
          .Scan(zero,
                [](const Element& state, Element e) {
                  Element next;
                  next.Set("sum", Tensor::Scalar<int64_t>(
                                      state["sum"].scalar<int64_t>() +
                                      e["value"].scalar<int64_t>()));
                  return std::pair<Element, Element>{next, next};
                })
          .Repeat(2);
  ExpectResumable(sums, {0, 1, 5, 11, 12, 13, 20});
  // Unique's seen elements travel in the state too.
  const Dataset unique =
      Dataset::Range(0, 40)
          .Shuffle(10)
          .Map([](Element e) {
            return testing::Int(e["value"].scalar<int64_t>() % 13);
          })
          .Unique()
          .Repeat(2);
  ExpectResumable(unique, {0, 1, 6, 12, 13, 14, 20, 25});
  // Groups of any key, begun and waiting, and while the groups left are
  // delivered at the end.
  const Dataset groups =
      Dataset::Range(0, 50)
          .Shuffle(8)
          .GroupByWindow(
              [](const Element& e) {
                return 7 - e["value"].scalar<int64_t>() % 4 * 3;
              },
              [](int64_t key) { return key < 0 ? 3 : 5; })
          .Repeat(2);
  ExpectResumable(groups, {0, 1, 4, 10, 12, 13, 14, 15, 20});
  // Rebatch: saved with the input batch being split part-used.
  const Dataset rebatched =
      Dataset::Range(0, 40).Shuffle(9).Batch(7).Rebatch({3, 5}).Repeat(2);
  ExpectResumable(rebatched, {0, 1, 2, 3, 7, 10, 11, 12, 20});
}

TEST(StateTest, CounterRandomRejectionResampleAndAssertCardinalityResume) {
  ExpectResumable(Dataset::Counter(3, -4).Take(20), {0, 1, 7, 19, 20});
  // Unseeded: the seed drawn travels in the state.
  ExpectResumable(Dataset::Random().Take(10).Repeat(2), {0, 1, 9, 10, 11, 19});
  ExpectResumable(Dataset::Random(8, true).Take(10).Repeat(2), {0, 5, 10, 15});
  ExpectResumable(
      Dataset::Range(0, 30).Shuffle(7).AssertCardinality(30).Repeat(2),
      {0, 1, 29, 30, 31, 59});
  // The resampler's generator and estimated counts.
  const auto parity = [](const Element& e) {
    return e["value"].scalar<int64_t>() % 5 == 0 ? 1 : 0;
  };
  ExpectResumable(Dataset::Range(0, 200)
                      .RejectionResample(parity, {.target_dist = {0.5, 0.5}})
                      .Repeat(2),
                  {0, 1, 10, 39, 40, 41, 70});
  // The count travels too: restored after 8 of 9, the 10th is still one
  // too many.
  const Dataset nine = Dataset::Range(0, 10).AssertCardinality(9);
  Iterator a = nine.MakeIterator();
  Element e;
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(a.Next(&e));
  Iterator b = nine.MakeIterator();
  b.Restore(a.Save());
  ASSERT_TRUE(b.Next(&e));
  EXPECT_THROW(b.Next(&e), Error);
}

TEST(StateTest, RangeMapBatchRepeat) {
  auto ds =
      Dataset::Range(0, 23).Map([](Element e) { return e; }).Batch(5).Repeat(3);
  ExpectResumable(ds, {0, 1, 4, 5, 6, 14, 15});
}

TEST(StateTest, MidShuffleBufferAndAcrossEpochs) {
  auto ds = Dataset::Range(0, 100).Shuffle(30).Repeat(3);  // unseeded
  ExpectResumable(ds, {0, 1, 29, 30, 31, 99, 100, 101, 250, 299, 300});
}

TEST(StateTest, ParallelMapAndPrefetchAcrossThreadCounts) {
  MapOptions o;
  o.num_parallel_calls = 4;
  auto ds = Dataset::Range(0, 200)
                .Map(
                    [](Element e) {
                      const int64_t v = e["value"].scalar<int64_t>();
                      return testing::Int(v * 3);
                    },
                    o)
                .Shuffle(16, 9)
                .Batch(8)
                .Prefetch(3)
                .Repeat(2);
  ExpectResumable(ds, {0, 1, 3, 24, 25, 26, 49}, /*threads=*/4,
                  /*restore_threads=*/1);
  ExpectResumable(ds, {2, 30}, /*threads=*/1, /*restore_threads=*/8);
  // An autotuned prefetch resumes with what it had buffered.
  ExpectResumable(Dataset::Range(0, 300).Batch(4).Prefetch(kAutotune),
                  {0, 1, 5, 40, 74}, /*threads=*/2, /*restore_threads=*/1);
}

// An autotuned map runs its calls in the arena at 4 threads and on the
// consumer's thread at 1: a state saved with results (and an error)
// buffered by the first continues in the second, and back.
TEST(StateTest, AnAutotunedMapMovesBetweenOneAndManyThreads) {
  MapOptions o;
  o.num_parallel_calls = kAutotune;
  auto ds = Dataset::Range(0, 120).Map(
      [](Element e) {
        const int64_t v = e["value"].scalar<int64_t>();
        if (v == 40) throw Error("no 40");
        return testing::Int(v * 3);
      },
      o);
  const auto drain = [](Iterator& it, size_t limit) {
    std::vector<std::string> out;
    while (out.size() < limit) {
      try {
        auto e = it.Next();
        if (!e) break;
        out.push_back(Key(*e));
      } catch (const Error& e) {
        out.push_back(e.what());
      }
    }
    return out;
  };
  Iterator whole = ds.MakeIterator({.threads = 1});
  const std::vector<std::string> all = drain(whole, SIZE_MAX);
  ASSERT_EQ(all.size(), 120u);
  EXPECT_EQ(all[40], "no 40");
  for (auto [save, restore] : {std::pair{4, 1}, std::pair{1, 4}}) {
    for (size_t k : {0u, 1u, 30u, 39u, 40u, 41u, 119u, 120u}) {
      Iterator it = ds.MakeIterator({.threads = save});
      ASSERT_EQ(drain(it, k).size(), k);
      Iterator restored = ds.MakeIterator({.threads = restore});
      restored.Restore(it.Save());
      EXPECT_EQ(drain(restored, SIZE_MAX),
                std::vector<std::string>(all.begin() + k, all.end()))
          << save << " -> " << restore << " threads, saved after " << k;
    }
  }
}

TEST(StateTest, InterleaveTakeSkipShardFilterUnbatchPaddedBatch) {
  auto ds = Dataset::Range(0, 12)
                .Interleave(
                    [](const Element& e) {
                      const int64_t v = e["value"].scalar<int64_t>();
                      return Dataset::Range(v * 100, v * 100 + v % 5);
                    },
                    3, 2)
                .Skip(2)
                .Shard(2, 1)
                .Filter([](const Element& e) {
                  return e["value"].scalar<int64_t>() % 7 != 0;
                })
                .Take(40)
                .Batch(3)
                .Unbatch()
                .Map([](Element e) {
                  const int64_t n = e["value"].scalar<int64_t>() % 4;
                  Element out;
                  out.Set("v", Tensor::FromValues<int64_t>(
                                   std::vector<int64_t>(n, n), Shape{n}));
                  return out;
                })
                .PaddedBatch(2);
  ExpectResumable(ds, {0, 1, 2, 3, 5, 7});
}

TEST(StateTest, TFRecordFilesWithParallelReadsShuffledFilesAndCompression) {
  testing::TempDir dir;
  std::vector<std::string> files;
  const records::Compression kinds[] = {
      records::Compression::kNone, records::Compression::kGzip,
      records::Compression::kNone, records::Compression::kZstd};
  for (int f = 0; f < 4; ++f) {
    files.push_back(dir.File(fmt::format("d{}.tfrecord", f)));
    testing::WriteRecords(files.back(),
                          testing::RandomPayloads(30 + f, 3000, f), kinds[f]);
  }
  TFRecordOptions o;
  o.num_parallel_reads = 2;
  o.shuffle_files = true;
  o.io.block_bytes = 4096;
  auto ds = Dataset::FromTFRecords(files, o).Shuffle(10).Repeat(2).Prefetch(2);
  ExpectResumable(ds, {0, 1, 9, 10, 11, 60, 133, 134, 135, 200});
}

TEST(StateTest, ShuffleBufferOfFileRecordsIsSavedAsReferences) {
  testing::TempDir dir;
  const std::string path = dir.File("big.tfrecord");
  testing::WriteRecords(path, testing::RandomPayloads(3000, 2000, 5));
  auto ds = Dataset::FromTFRecords({path}).Shuffle(1000, 2);
  Iterator a = ds.MakeIterator();
  Element e;
  for (int i = 0; i < 500; ++i) ASSERT_TRUE(a.Next(&e));
  const std::string state = a.Save();
  // ~1 MB of buffered records; 40 bytes each as references.
  EXPECT_LT(state.size(), 50'000u);
  const auto rest = Keys(a);
  Iterator b = ds.MakeIterator();
  b.Restore(state);
  EXPECT_EQ(Keys(b), rest);
  // A file changed since: the restore says so instead of going on.
  std::string bytes = testing::ReadFileBytes(path);
  for (size_t i = 100; i < bytes.size(); i += 997) bytes[i] ^= 1;
  testing::WriteFileBytes(path, bytes);
  Iterator c = ds.MakeIterator();
  try {
    c.Restore(state);
    FAIL() << "restored from a changed file";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("changed since the state was saved"),
              std::string::npos)
        << err.what();
  }
}

TEST(StateTest, MemoryCacheStateRebuildsTheCacheInANewIterator) {
  auto ds = Dataset::Range(0, 20).Shuffle(5).Cache().Repeat(3);
  ExpectResumable(ds, {0, 3, 19, 20, 21, 45});
}

// The pipeline both processes build: files in `dir`, an unseeded shuffle
// (its random seed must travel in the state), parallel reads and parse.
Dataset CrossProcessPipeline(const std::string& dir) {
  TFRecordOptions o;
  o.num_parallel_reads = 2;
  MapOptions m;
  m.num_parallel_calls = 2;
  m.name = "length";
  return Dataset::FromTFRecords({dir + "/x0.tfrecord", dir + "/x1.tfrecord"}, o)
      .Shuffle(50)
      .Map(
          [](Element e) {
            e.Set("length", Tensor::Scalar<int64_t>(static_cast<int64_t>(
                                e["record"].bytes(0).size())));
            return e;
          },
          m)
      .Batch(7)
      .Prefetch(2);
}

// Run by RestoresInAnotherProcess in a child process; skipped otherwise.
TEST(StateTest, ChildProcessRestore) {
  const char* dir = std::getenv("RECFLOW_STATE_TEST_DIR");
  if (dir == nullptr)
    GTEST_SKIP() << "runs in a child of RestoresInAnotherProcess";
  Iterator it = CrossProcessPipeline(dir).MakeIterator({.threads = 3});
  it.Restore(testing::ReadFileBytes(std::string(dir) + "/state"));
  std::string out;
  for (const auto& k : Keys(it)) out += k + "\n";
  testing::WriteFileBytes(std::string(dir) + "/child.txt", out);
}

TEST(StateTest, RestoresInAnotherProcess) {
  testing::TempDir dir;
  for (int f = 0; f < 2; ++f) {
    testing::WriteRecords(dir.File(fmt::format("x{}.tfrecord", f)),
                          testing::RandomPayloads(120, 300, 10 + f));
  }
  Iterator it =
      CrossProcessPipeline(dir.path().string()).MakeIterator({.threads = 2});
  Element e;
  for (int i = 0; i < 9; ++i) ASSERT_TRUE(it.Next(&e));
  testing::WriteFileBytes(dir.File("state"), it.Save());
  std::string want;
  for (const auto& k : Keys(it)) want += k + "\n";
  const std::string cmd = fmt::format(
      "RECFLOW_STATE_TEST_DIR={} /proc/{}/exe "
      "--gtest_filter=StateTest.ChildProcessRestore > {} 2>&1",
      dir.path().string(), getpid(), dir.File("child.log"));
  ASSERT_EQ(std::system(cmd.c_str()), 0)
      << testing::ReadFileBytes(dir.File("child.log"));
  EXPECT_EQ(testing::ReadFileBytes(dir.File("child.txt")), want);
  EXPECT_FALSE(want.empty());
}

TEST(StateTest, AStateOfAnotherPipelineIsRefused) {
  Iterator a = Dataset::Range(0, 10).Batch(2).MakeIterator();
  Element e;
  a.Next(&e);
  const std::string state = a.Save();
  Iterator b = Dataset::Range(0, 10).Batch(3).MakeIterator();
  try {
    b.Restore(state);
    FAIL();
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("Batch(2"), std::string::npos)
        << err.what();
  }
}

TEST(StateTest, DamagedStatesAreRefused) {
  Iterator a = Dataset::Range(0, 10).Shuffle(4, 1).MakeIterator();
  Element e;
  a.Next(&e);
  const std::string state = a.Save();
  for (size_t i = 0; i < state.size(); i += 3) {
    std::string bad = state;
    bad[i] ^= 0x10;
    Iterator b = Dataset::Range(0, 10).Shuffle(4, 1).MakeIterator();
    EXPECT_THROW(b.Restore(bad), Error) << "byte " << i;
  }
  for (size_t n = 0; n < state.size(); n += 5) {
    Iterator b = Dataset::Range(0, 10).Shuffle(4, 1).MakeIterator();
    EXPECT_THROW(b.Restore(state.substr(0, n)), Error) << "length " << n;
  }
}

// A state whose CRC is right but whose prefetch buffer contradicts its
// "input ended" flag once made Next() wait forever: the driver stops at an
// end the consumer never sees (fuzz/regressions/iterator_state/).
TEST(StateTest, PrefetchBufferInconsistentWithItsEndIsRefused) {
  const Dataset ds = Dataset::Range(0, 3).Prefetch(2);
  Iterator a = ds.MakeIterator();
  Element e;
  while (a.Next(&e)) {
  }
  const std::string state = a.Save();
  // The stage's fields after its name: ended, one slot, of kind "end".
  const std::string fields = U64s({1, 1, 0});
  {  // unchanged, it restores to the end
    Iterator b = ds.MakeIterator();
    b.Restore(Forged(state, fields, fields));
    EXPECT_FALSE(b.Next(&e));
  }
  ExpectRefused(ds, Forged(state, fields, U64s({1, 0})),
                "marked ended but the buffer lacks its end");
  ExpectRefused(ds, Forged(state, fields, U64s({0, 1, 0})),
                "marked not ended but the buffer holds its end");
  ExpectRefused(ds, Forged(state, fields, U64s({1, 2, 0, 0})),
                "the end of the input at slot 0 of 2");
}

// Positions a stage could not have saved: a Range restored 4 billion
// before its start once made the fuzzer's Take(60) run for minutes.
TEST(StateTest, PositionsOutsideAStagesRangeAreRefused) {
  const Dataset ds =
      Dataset::Range(10, 40, 3).Repeat(2).Skip(2).Take(30).Batch(4).Shard(2, 1);
  Iterator a = ds.MakeIterator();
  Element e;
  ASSERT_TRUE(a.Next(&e));
  const std::string state = a.Save();
  // Shard(2, 1) took two batches: Range delivered 2 + 8 elements and is at
  // 10 + 3 x 10 = 40, the end of its progression.
  const std::string range = StateString("range") + U64s({40});
  {
    Iterator b = ds.MakeIterator();
    b.Restore(Forged(state, range, range));
    ASSERT_TRUE(b.Next(&e));
  }
  for (int64_t bad :
       {int64_t{-4294967296}, int64_t{11}, int64_t{43}, int64_t{7}}) {
    ExpectRefused(
        ds,
        Forged(state, range,
               StateString("range") + U64s({static_cast<uint64_t>(bad)})),
        fmt::format("{} is not a position of Range(10, 40, 3)", bad));
  }
  const std::string repeat = StateString("repeat") + U64s({0});
  ExpectRefused(ds, Forged(state, repeat, StateString("repeat") + U64s({3})),
                "epoch 3 of Repeat(2)");
  const std::string skip = StateString("skip") + U64s({2});
  ExpectRefused(ds, Forged(state, skip, StateString("skip") + U64s({3})),
                "3 elements counted by Skip(2)");
  const std::string take = StateString("take") + U64s({8});
  ExpectRefused(ds,
                Forged(state, take,
                       StateString("take") + U64s({static_cast<uint64_t>(-1)})),
                "-1 elements counted by Take(30)");
  {  // a counter: anywhere on its progression, nowhere else
    const Dataset counter = Dataset::Counter(10, 3).Take(5);
    Iterator c = counter.MakeIterator();
    ASSERT_TRUE(c.Next(&e));
    const std::string at = StateString("counter") + U64s({13});
    const std::string counted = c.Save();
    Iterator d = counter.MakeIterator();
    d.Restore(Forged(counted, at, StateString("counter") + U64s({1000})));
    ASSERT_TRUE(d.Next(&e));
    EXPECT_EQ(e["value"].scalar<int64_t>(), 1000);
    for (int64_t bad : {int64_t{7}, int64_t{14}}) {
      ExpectRefused(
          counter,
          Forged(counted, at,
                 StateString("counter") + U64s({static_cast<uint64_t>(bad)})),
          fmt::format("{} is not a position of Counter(10, 3)", bad));
    }
    const Dataset asserted = Dataset::Range(0, 9).AssertCardinality(9);
    Iterator f = asserted.MakeIterator();
    ASSERT_TRUE(f.Next(&e));
    ExpectRefused(
        asserted,
        Forged(f.Save(), StateString("assert_cardinality") + U64s({1}),
               StateString("assert_cardinality") + U64s({10})),
        "10 elements counted by AssertCardinality(9)");
  }
  const std::string batch = StateString("batch") + U64s({0, 0});
  ExpectRefused(ds, Forged(state, batch, StateString("batch") + U64s({0, 4})),
                "4 pending elements for batches of 4");
}

// A file position no file could hold (a record number greater than the
// bytes before it have room for, 16 a record) is refused as the file is
// opened, by the TFRecord stage and by the fused path.  The fused reader
// read empty chunks forever from record UINT64_MAX (found by the
// iterator_state fuzzer).
TEST(StateTest, ARecordNumberTheBytesBeforeItCannotHoldIsRefused) {
  testing::TempDir dir;
  const std::string path = dir.File("a.tfrecord");
  std::vector<std::string> payloads;
  std::vector<uint64_t> offsets = {0};  // of record k
  // Enough records that the fused reader is still in the file after a
  // batch.
  for (int i = 0; i < 5000; ++i) {
    records::ExampleBuilder b;
    b.AddInt64("id", i);
    payloads.emplace_back(b.Serialize());
    offsets.push_back(offsets.back() + 16 + payloads.back().size());
  }
  testing::WriteRecords(path, payloads);
  const auto spec = records::FeatureSpec::FromJsonText(R"({"features": {
      "id": {"kind": "fixed", "dtype": "int64", "shape": []}}})");
  ParseOptions two;
  two.num_parallel_calls = 2;
  for (const Dataset& ds :
       {Dataset::FromTFRecords({path}),
        Dataset::FromTFRecords({path}).Batch(4).Parse(spec, two)}) {
    SCOPED_TRACE(ds.Describe());
    Iterator a = ds.MakeIterator();
    Element e;
    ASSERT_TRUE(a.Next(&e));
    const std::string state = a.Save();
    // The open file's slot: open, file 0, offset, record number.
    std::string fields;
    size_t k = 0;
    for (; k < offsets.size(); ++k) {
      fields = U64s({1, 0, offsets[k], k});
      if (state.find(fields) != std::string::npos) break;
    }
    ASSERT_LT(k, offsets.size()) << "no file position in the state";
    {  // unchanged, it restores
      Iterator b = ds.MakeIterator();
      b.Restore(Forged(state, fields, fields));
      ASSERT_TRUE(b.Next(&e));
    }
    for (uint64_t bad : {offsets[k] / 16 + 1, ~uint64_t{0}}) {
      ExpectRefused(ds, Forged(state, fields, U64s({1, 0, offsets[k], bad})),
                    fmt::format("{}: record {} cannot start at byte {}", path,
                                bad, offsets[k]));
    }
  }
}

TEST(StateTest, WindowGroupAndScanStatesTheyCouldNotHaveSavedAreRefused) {
  const Dataset ds = Dataset::Range(0, 30).Window(3, {.shift = 5});
  Iterator a = ds.MakeIterator();
  Element e;
  ASSERT_TRUE(a.Next(&e));
  const std::string state = a.Save();
  // Not ended, 2 elements to drop before the next window, none kept.
  const std::string fields = StateString("window") + U64s({0, 2, 0});
  {
    Iterator b = ds.MakeIterator();
    b.Restore(Forged(state, fields, fields));
    ASSERT_TRUE(b.Next(&e));
    EXPECT_EQ(testing::Ints({e}), (std::vector<int64_t>{5, 6, 7}));
  }
  ExpectRefused(ds,
                Forged(state, fields, StateString("window") + U64s({0, 5, 0})),
                "5 elements to skip between windows 5 apart");
  ExpectRefused(ds,
                Forged(state, fields, StateString("window") + U64s({0, 0, 3})),
                "3 elements kept for windows that reach 3");
  // Group keys are saved in order, each group short of its window.
  const Dataset grouped = Dataset::Range(0, 30).GroupByWindow(
      [](const Element& x) { return x["value"].scalar<int64_t>() % 3; }, 5);
  Iterator g = grouped.MakeIterator();
  ASSERT_TRUE(g.Next(&e));  // key 0's 0 3 6 9 12; keys 1 and 2 hold 4 each
  const std::string saved = g.Save();
  // Not ended, 13 read, 2 groups, the first of key 1 with 4 elements.
  const std::string group =
      StateString("group_by_window") + U64s({0, 13, 2, 1, 4});
  {
    Iterator b = grouped.MakeIterator();
    b.Restore(Forged(saved, group, group));
    ASSERT_TRUE(b.Next(&e));
    EXPECT_EQ(testing::Ints({e}), (std::vector<int64_t>{1, 4, 7, 10, 13}));
  }
  ExpectRefused(grouped,
                Forged(saved, group,
                       StateString("group_by_window") + U64s({0, 13, 2, 3, 4})),
                "group keys out of order: 2 after 3");
  ExpectRefused(grouped,
                Forged(saved, group,
                       StateString("group_by_window") + U64s({0, 13, 2, 1, 5})),
                "5 elements in the group of key 1, whose batches are 5");
  // A state saved by a scan whose state is another dtype (the same
  // pipeline's description) is refused by the dtype.
  const auto scan = [](Element initial) {
    return Dataset::Range(0, 5).Scan(
        std::move(initial), [](const Element& s, Element x) {
          return std::pair<Element, Element>{s, std::move(x)};
        });
  };
  Element as_int, as_float;
  as_int.Set("s", Tensor::Scalar<int64_t>(1));
  as_float.Set("s", Tensor::Scalar<float>(1));
  Iterator c = scan(as_int).MakeIterator();
  ASSERT_TRUE(c.Next(&e));
  ExpectRefused(scan(as_float), c.Save(),
                "the saved state has components {s:int64}, the initial "
                "state {s:float32}");
}

TEST(StateTest, RestoreOnlyBeforeTheFirstNext) {
  Iterator a = Dataset::Range(0, 10).MakeIterator();
  const std::string state = a.Save();
  Element e;
  a.Next(&e);
  EXPECT_THROW(a.Restore(state), Error);
}

// Whether a buffered record may be saved by reference is decided from the
// CRC its frame had when read, without reading the file again; a record a
// map changed is saved whole.
TEST(StateTest, ShuffleSavesReferencesWithoutReadingTheFileAgain) {
  testing::TempDir dir;
  const std::string path = dir.File("r.tfrecord");
  testing::WriteRecords(path, testing::RandomPayloads(400, 2000, 9));
  auto ds = Dataset::FromTFRecords({path}).Shuffle(300, 4);
  Iterator a = ds.MakeIterator();
  Element e;
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(a.Next(&e));
  const std::string moved = dir.File("moved.tfrecord");
  ASSERT_EQ(std::rename(path.c_str(), moved.c_str()), 0);
  const std::string state = a.Save();  // the file is not there now
  EXPECT_LT(state.size(), 20'000u);    // ~300 KB of records, by reference
  ASSERT_EQ(std::rename(moved.c_str(), path.c_str()), 0);
  const auto rest = Keys(a);
  Iterator b = ds.MakeIterator();
  b.Restore(state);
  EXPECT_EQ(Keys(b), rest);

  // Bytes changed by a map keep their origin but not their frame's CRC.
  auto changed = Dataset::FromTFRecords({path})
                     .Map([](Element x) {
                       std::string bytes(x["record"].bytes(0));
                       bytes[0] ^= 1;
                       x.Set("record", Tensor::BytesScalar(bytes));
                       return x;
                     })
                     .Shuffle(300, 4);
  Iterator c = changed.MakeIterator();
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(c.Next(&e));
  EXPECT_GT(c.Save().size(), 200'000u);  // saved whole
}

// A buffered error comes back from a saved state as the class it was, with
// its fields, not as a message in a pipeline::Error.
TEST(StateTest, SavedErrorsKeepTheirClassAndFields) {
  const auto round_trip = [](std::exception_ptr error) {
    StateWriter w("errors");
    WriteResult(&w, false, error, Element{});
    const std::string blob = std::move(w).Finish();
    StateReader r(blob, "errors");
    bool end = false;
    std::exception_ptr back;
    Element e;
    ReadResult(&r, &end, &back, &e);
    r.Finish();
    EXPECT_FALSE(end);
    return back ? back
                : std::make_exception_ptr(
                      std::logic_error("no error came back"));
  };
  try {
    std::rethrow_exception(
        round_trip(std::make_exception_ptr(records::RecordError(
            "f.tfrecord", 48, 3, records::DamageKind::kDataCrcMismatch, "d"))));
  } catch (const records::RecordError& e) {
    EXPECT_EQ(e.path(), "f.tfrecord");
    EXPECT_EQ(e.offset(), 48u);
    EXPECT_EQ(e.record_index(), 3u);
    EXPECT_EQ(e.kind(), records::DamageKind::kDataCrcMismatch);
    EXPECT_EQ(e.detail(), "d");
  }
  const records::IoError io("f", "cannot open", ENOENT);
  try {
    std::rethrow_exception(round_trip(std::make_exception_ptr(io)));
  } catch (const records::IoError& e) {
    EXPECT_STREQ(e.what(), io.what());
    EXPECT_EQ(e.errno_value(), ENOENT);
  }
  EXPECT_THROW(std::rethrow_exception(round_trip(
                   std::make_exception_ptr(records::ParseError("p")))),
               records::ParseError);
  EXPECT_THROW(std::rethrow_exception(
                   round_trip(std::make_exception_ptr(records::Error("r")))),
               records::Error);
  try {
    std::rethrow_exception(round_trip(std::make_exception_ptr(
        records::DecompressionError("gzip data is corrupt", 77))));
  } catch (const records::DecompressionError& e) {
    EXPECT_EQ(e.detail(), "gzip data is corrupt");
    EXPECT_EQ(e.compressed_offset(), 77u);
  }
  for (bool row_level : {true, false}) {
    try {
      std::rethrow_exception(round_trip(std::make_exception_ptr(
          records::CsvError("a.csv:3: bad quote", row_level))));
    } catch (const records::CsvError& e) {
      EXPECT_STREQ(e.what(), "a.csv:3: bad quote");
      EXPECT_EQ(e.row_level(), row_level);
    }
  }
  EXPECT_THROW(std::rethrow_exception(round_trip(std::make_exception_ptr(
                   records::FileListError("x*: no file matches")))),
               records::FileListError);
  try {
    std::rethrow_exception(
        round_trip(std::make_exception_ptr(Error("a pipeline error"))));
  } catch (const records::Error&) {
    ADD_FAILURE() << "a pipeline error came back as a records error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "a pipeline error");
  }
}

}  // namespace
}  // namespace recflow::pipeline
