// The fused batch-parse path (pipeline/batch_parse_fusion.cc) against the
// same pipelines run stage by stage (IteratorOptions::optimize = false):
// elements, order, origins, errors, saved states and statistics.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <thread>
#include <tuple>

#include "pipeline/block_arena.h"
#include "pipeline/dataset.h"
#include "pipeline/stages.h"
#include "pipeline_test_util.h"
#include "records/example_builder.h"
#include "records/example_parser.h"
#include "records/index.h"
#include "records/io_faults.h"
#include "records/tfrecord_format.h"
#include "test_util.h"

namespace recflow::pipeline {
namespace {

using testing::Collect;

std::string MakeExample(int f, int i) { return testing::MixedExample(f, i); }

records::FeatureSpec Spec() { return testing::MixedSpec(); }

IteratorOptions Unfused() { return {.threads = 1, .optimize = false}; }

// Appends what each Next() of `it` gives, to the end, to *out (as
// Outcomes); after each error, after_error(it) where given.
void AppendOutcomes(Iterator& it, std::vector<std::string>* out,
                    const std::function<void(Iterator&)>& after_error = {}) {
  Element e;
  while (true) {
    try {
      if (!it.Next(&e)) break;
      out->push_back(fmt::format("{} rows, first {}", e["label"].num_rows(),
                                 e["label"].data<int64_t>()[0]));
    } catch (const recflow::Error& err) {
      out->push_back(std::string("error: ") + err.what());
      // A restart that meets the same error again would never end.
      if (out->size() > 10000) break;
      if (after_error) after_error(it);
    }
  }
}

// What each Next() of `ds` gives, to the end: "ROWS rows, first LABEL" or
// "error: MESSAGE"; iteration goes on after errors.
// With `restart_after_error`, each error is followed by a save and a
// restore into a fresh iterator, which goes on from there.
std::vector<std::string> Outcomes(const Dataset& ds, IteratorOptions o,
                                  bool restart_after_error = false) {
  std::vector<std::string> out;
  Iterator it = ds.MakeIterator(o);
  if (!restart_after_error) {
    AppendOutcomes(it, &out);
    return out;
  }
  AppendOutcomes(it, &out, [&](Iterator& at) {
    const std::string state = at.Save();
    at = ds.MakeIterator(o);
    at.Restore(state);
  });
  return out;
}

class BatchParseFusionTest : public ::testing::Test {
 protected:
  // As on a 16-core machine (the fused path's choices by cores: epochs
  // prepared ahead, the planner task), whatever this one has.
  void TearDown() override { stages::SetFusedCores(0); }
  // The records of file f (part-f.tfrecord), and of all four.
  static int RecordsInFile(int f) { return 150 + 37 * f; }
  static uint64_t AllRecords() {
    uint64_t n = 0;
    for (int f = 0; f < 4; ++f) n += RecordsInFile(f);
    return n;
  }
  // What the statistics tests compare: fused at 1 and 4 threads, and the
  // stages one by one.
  static std::vector<IteratorOptions> StatsRuns() {
    return {{.threads = 1}, {.threads = 4}, Unfused()};
  }
  // Runs `ds` to its end with `o`: its stages' statistics, and the
  // elements it gave in *elements.
  static std::vector<StageStats> StatsAtTheEnd(const Dataset& ds,
                                               IteratorOptions o,
                                               uint64_t* elements) {
    Iterator it = ds.MakeIterator(o);
    Element e;
    *elements = 0;
    while (it.Next(&e)) ++*elements;
    return it.Stats();
  }
  void SetUp() override {
    stages::SetFusedCores(16);
    const records::Compression kinds[] = {
        records::Compression::kNone, records::Compression::kNone,
        records::Compression::kNone, records::Compression::kGzip};
    for (int f = 0; f < 4; ++f) {
      std::vector<std::string> recs;
      for (int i = 0; i < RecordsInFile(f); ++i) {
        recs.push_back(MakeExample(f, i));
      }
      files_.push_back(dir_.File(fmt::format("part-{}.tfrecord", f)));
      testing::WriteRecords(files_.back(), recs, kinds[f]);
    }
  }

  // Every element the pipeline gives with each option set, the
  // stage-by-stage run first; all must be equal, element by element, with
  // the same origins.  (8 threads: the planner task, on the fixture's 16
  // cores.)
  void ExpectSameAsUnfused(const Dataset& ds, const std::string& what) {
    const auto want = Collect(ds, Unfused());
    ASSERT_FALSE(want.empty()) << what;
    for (int threads : {1, 2, 4, 8}) {
      const auto got = Collect(ds, {.threads = threads});
      ASSERT_EQ(got.size(), want.size()) << what << " threads " << threads;
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(got[i], want[i])
            << what << " threads " << threads << " element " << i;
        ASSERT_TRUE(got[i].batch_origins && want[i].batch_origins);
        for (size_t r = 0; r < want[i].batch_origins->size(); ++r) {
          const Origin& a = (*got[i].batch_origins)[r];
          const Origin& b = (*want[i].batch_origins)[r];
          ASSERT_EQ(a.ToString(), b.ToString()) << what << " " << i;
        }
      }
    }
  }

  // Flips a bit of record `r`'s payload in `path` (an uncompressed file);
  // returns the record's offset.
  static uint64_t DamageRecord(const std::string& path, int r) {
    std::string bytes = testing::ReadFileBytes(path);
    uint64_t offset = 0;
    for (int i = 0; i < r; ++i) {
      offset += records::HeaderLength(bytes.data() + offset) +
                records::kFrameOverhead;
    }
    bytes[offset + records::kHeaderBytes + 5] ^= 0x40;
    testing::WriteFileBytes(path, bytes);
    return offset;
  }

  // SavedStatesContinueTheSameStream's checks of one pipeline.
  static void SavedStatesContinue(const Dataset& ds);
  // NondeterministicReadsLoseAndRepeatNothing's checks with `calls` parse
  // calls.
  void NondeterministicReadsLoseAndRepeatNothingWith(int calls);

  // `ds` fails `errors` times, stage by stage, and fused at 1, 2, 4 and 8
  // threads gives the same outcomes, errors at the same places; so does
  // each, at 1 and 2 threads, when every error is followed by a saved
  // state restored into a fresh iterator.
  static void ExpectErrorsWhereTheStagesHaveThem(const Dataset& ds, int errors,
                                                 const std::string& where) {
    const auto want = Outcomes(ds, Unfused());
    int seen = 0;
    for (const auto& line : want) seen += line.starts_with("error: ");
    ASSERT_EQ(seen, errors) << where;
    for (int threads : {1, 2, 4, 8}) {
      EXPECT_EQ(Outcomes(ds, {.threads = threads}), want)
          << where << " threads " << threads;
    }
    // A state saved right after an error goes on past it, as the stages'
    // does.  (One parse call plans nothing ahead, so the state is taken
    // where the error left the planner.)
    ASSERT_EQ(Outcomes(ds, Unfused(), true), want) << where;
    for (int threads : {1, 2}) {
      EXPECT_EQ(Outcomes(ds, {.threads = threads}, true), want)
          << where << " threads " << threads;
    }
  }

  testing::TempDir dir_;
  std::vector<std::string> files_;
};

// A fresh iterator of `ds` at 1 and at 2 threads, restored from `state`
// (saved after k elements), gives the rest of `all` and then ends.
void ExpectRestoredToContinue(const Dataset& ds, const std::string& state,
                              const std::vector<Element>& all, size_t k) {
  Element e;
  for (int threads : {1, 2}) {
    Iterator restored = ds.MakeIterator({.threads = threads});
    restored.Restore(state);
    for (size_t i = k; i < all.size(); ++i) {
      ASSERT_TRUE(restored.Next(&e)) << "k " << k << " i " << i;
      ASSERT_EQ(e, all[i]) << "k " << k << " i " << i;
    }
    EXPECT_FALSE(restored.Next(&e));
  }
}

ParseOptions Calls(int n, bool keep_record = false) {
  ParseOptions p;
  p.num_parallel_calls = n;
  p.keep_record = keep_record;
  return p;
}

TEST_F(BatchParseFusionTest, GivesTheElementsOfTheStagesRunOneByOne) {
  TFRecordOptions interleaved;
  interleaved.num_parallel_reads = 3;
  TFRecordOptions shuffled_files;
  shuffled_files.shuffle_files = true;
  shuffled_files.seed = 11;
  shuffled_files.num_parallel_reads = 2;
  TFRecordOptions per_file;
  per_file.num_parallel_reads = 3;
  per_file.shuffle_buffer_per_file = 40;
  per_file.seed = 5;
  const std::vector<std::pair<std::string, std::function<Dataset()>>> cases = {
      {"a shuffle buffer per file, three files at once",
       [&] { return Dataset::FromTFRecords(files_, per_file).Batch(32); }},
      {"a shuffle buffer per file, reshuffled each epoch, then a Shuffle",
       [&] {
         TFRecordOptions all = per_file;
         all.num_parallel_reads = 4;
         return Dataset::FromTFRecords(files_, all)
             .Repeat(3)
             .Shuffle(30, 2)
             .Batch(40);
       }},
      {"a shuffle buffer per file larger than the files, one at a time",
       [&] {
         TFRecordOptions one = per_file;
         one.num_parallel_reads = 1;
         one.shuffle_buffer_per_file = 1000;
         return Dataset::FromTFRecords(files_, one).Batch(50);
       }},
      {"batch", [&] { return Dataset::FromTFRecords(files_).Batch(32); }},
      {"interleaved, drop remainder",
       [&] {
         return Dataset::FromTFRecords(files_, interleaved).Batch(50, true);
       }},
      {"interleaved in blocks of 7",
       [&] {
         TFRecordOptions blocks = interleaved;
         blocks.block_length = 7;
         return Dataset::FromTFRecords(files_, blocks).Shuffle(20, 6).Batch(30);
       }},
      {"repeat, one file at a time in blocks of 5 (batches taken in runs)",
       [&] {
         TFRecordOptions one;
         one.block_length = 5;
         return Dataset::FromTFRecords(files_, one).Repeat(3).Batch(40);
       }},
      {"shuffle",
       [&] {
         return Dataset::FromTFRecords(files_).Shuffle(100, 3).Batch(17);
       }},
      {"shuffle then repeat",
       [&] {
         return Dataset::FromTFRecords(files_, shuffled_files)
             .Shuffle(64, 5)
             .Repeat(3)
             .Batch(40);
       }},
      {"repeat then shuffle (across epochs)",
       [&] {
         return Dataset::FromTFRecords(files_).Repeat(2).Shuffle(500, 9).Batch(
             64, true);
       }},
      {"two shuffles, a buffer larger than the data",
       [&] {
         return Dataset::FromTFRecords(files_)
             .Shuffle(7, 1)
             .Shuffle(100000, 2)
             .Batch(33);
       }},
  };
  for (const auto& [what, make] : cases) {
    for (int calls : {1, 3, kAutotune}) {
      ExpectSameAsUnfused(make().Parse(Spec(), Calls(calls)),
                          fmt::format("{}, {} calls", what, calls));
    }
  }
  ExpectSameAsUnfused(
      Dataset::FromTFRecords(files_).Shuffle(50, 4).Batch(16).Parse(
          Spec(), Calls(2, /*keep_record=*/true)),
      "keep_record");
}

TEST_F(BatchParseFusionTest, RunsFusedOnlyWhereItApplies) {
  // The stages' names, and whether the fused path read the files (its
  // readers are counted; the stages one by one make none).
  struct Run {
    std::set<std::string> names;
    bool fused = false;
  };
  auto run = [](const Dataset& ds, IteratorOptions o) {
    const uint64_t readers = stages::FusedFileReadersMade();
    Iterator it = ds.MakeIterator(o);
    Element e;
    it.Next(&e);
    Run out;
    for (const auto& s : it.Stats()) out.names.insert(s.name);
    out.fused = stages::FusedFileReadersMade() > readers;
    return out;
  };
  const Dataset fusable =
      Dataset::FromTFRecords(files_).Shuffle(64, 1).Batch(8).Parse(Spec());
  // Fused, the shuffle's own work is still its stage's (the rest of the
  // planning is "batch"'s).
  const std::set<std::string> stages = {"tfrecord", "shuffle", "batch",
                                        "parse"};
  for (int threads : {1, 2}) {
    const Run fused = run(fusable, {.threads = threads});
    EXPECT_TRUE(fused.fused) << threads;
    EXPECT_EQ(fused.names, stages) << threads;
  }
  const Run unfused = run(fusable, Unfused());
  EXPECT_FALSE(unfused.fused);
  EXPECT_EQ(unfused.names, stages);
  // A Take, Skip or Shard between the source and Batch is fused, its
  // stage counted; a Filter keeps every stage.
  const Run take = run(Dataset::FromTFRecords(files_)
                           .Skip(10)
                           .Shard(5, 1)
                           .Take(100)
                           .Batch(8)
                           .Parse(Spec()),
                       {.threads = 2});
  EXPECT_TRUE(take.fused);
  EXPECT_EQ(take.names, (std::set<std::string>{"tfrecord", "skip", "shard",
                                               "take", "batch", "parse"}));
  const auto all = [](const Element&) { return true; };
  const Run filter =
      run(Dataset::FromTFRecords(files_).Filter(all).Batch(8).Parse(Spec()),
          {.threads = 2});
  EXPECT_FALSE(filter.fused);
  EXPECT_EQ(filter.names, (std::set<std::string>{"tfrecord", "filter:filter",
                                                 "batch", "parse"}));
  // A mixture of fusable inputs is fused, its stage counted, a global
  // shuffle among them too; one whose input is not fusable (a Filter) is
  // not.
  const Dataset a = Dataset::FromTFRecords({files_[0], files_[1]});
  const Run mixed =
      run(Dataset::SampleFromDatasets({a, Dataset::FromTFRecords({files_[2]})},
                                      {.seed = 3})
              .Batch(8)
              .Parse(Spec()),
          {.threads = 2});
  EXPECT_TRUE(mixed.fused);
  EXPECT_EQ(mixed.names,
            (std::set<std::string>{"tfrecord", "sample_from_datasets", "batch",
                                   "parse"}));
  // Seeded: a global shuffle reads by its own reader, not a fused file
  // reader, so without a seed the first batch's eight draws could all
  // fall to it (1 run in 256) and leave nothing to count.
  const Run with_global =
      run(Dataset::SampleFromDatasets(
              {a, Dataset::FromTFRecordsGlobalShuffle({files_[2]}, {})},
              {.seed = 3})
              .Batch(8)
              .Parse(Spec()),
          {.threads = 2});
  EXPECT_TRUE(with_global.fused);
  EXPECT_EQ(with_global.names,
            (std::set<std::string>{"tfrecord", "global_shuffle",
                                   "sample_from_datasets", "batch", "parse"}));
  const Run unfusable = run(Dataset::SampleFromDatasets({a, a.Filter(all)}, {})
                                .Batch(8)
                                .Parse(Spec()),
                            {.threads = 2});
  EXPECT_FALSE(unfusable.fused);
  EXPECT_TRUE(unfusable.names.contains("sample_from_datasets"));
  // So is a ChooseFromDatasets of fusable inputs, its choices' stages as
  // written.
  const Run chosen =
      run(Dataset::ChooseFromDatasets({a, Dataset::FromTFRecords({files_[2]})},
                                      Dataset::Range(0, 2).Repeat())
              .Batch(8)
              .Parse(Spec()),
          {.threads = 2});
  EXPECT_TRUE(chosen.fused);
  EXPECT_EQ(chosen.names,
            (std::set<std::string>{"tfrecord", "choose_from_datasets", "range",
                                   "repeat", "batch", "parse"}));
  const Run unchosen =
      run(Dataset::ChooseFromDatasets({a, a.Filter(all)},
                                      Dataset::Range(0, 2).Repeat())
              .Batch(8)
              .Parse(Spec()),
          {.threads = 2});
  EXPECT_FALSE(unchosen.fused);
  EXPECT_TRUE(unchosen.names.contains("choose_from_datasets"));
  // Parse-only, fused, has no shuffle stage.
  const Run plain = run(Dataset::FromTFRecords(files_).Batch(8).Parse(Spec()),
                        {.threads = 2});
  EXPECT_TRUE(plain.fused);
  EXPECT_EQ(plain.names, (std::set<std::string>{"tfrecord", "batch", "parse"}));
}

// SampleFromDatasets over fusable inputs runs fused, each input a chain of
// its own (its files read by reader tasks, its shuffles planned): the
// stages' elements, order and origins, whatever the inputs' options, the
// draws' weights and ends, and the stages around the mixture.
TEST_F(BatchParseFusionTest, MixturesGiveTheElementsOfTheStages) {
  const std::vector<std::string> first(files_.begin(), files_.begin() + 2);
  // Its second file is gzipped.
  const std::vector<std::string> last(files_.begin() + 2, files_.end());
  TFRecordOptions interleaved;
  interleaved.num_parallel_reads = 2;
  interleaved.block_length = 3;
  TFRecordOptions per_file;
  per_file.shuffle_buffer_per_file = 40;
  per_file.seed = 5;
  const Dataset a = Dataset::FromTFRecords(first);
  const Dataset b = Dataset::FromTFRecords(last, interleaved);
  const Dataset c = Dataset::FromTFRecords(files_, per_file);
  const std::vector<std::pair<std::string, std::function<Dataset()>>> cases = {
      {"two inputs alike",
       [&] {
         return Dataset::SampleFromDatasets({a, b}, {.seed = 1});
       }},
      {"shuffled inputs, weights, a shuffle after",
       [&] {
         return Dataset::SampleFromDatasets(
                    {a.Shuffle(30, 2), b.Repeat(2).Shuffle(50, 3), c},
                    {.weights = {0.5, 0.2, 0.3}, .seed = 4})
             .Shuffle(40, 6);
       }},
      {"stop on the first input to end",
       [&] {
         return Dataset::SampleFromDatasets(
             {a, b},
             {.weights = {3, 1}, .seed = 7, .stop_on_empty_dataset = true});
       }},
      {"repeated, the same draws each epoch",
       [&] {
         return Dataset::SampleFromDatasets({a, b.Shuffle(20, 1)}, {.seed = 8})
             .Repeat(3);
       }},
      {"repeated, other draws each epoch",
       [&] {
         return Dataset::SampleFromDatasets(
                    {a.Shuffle(20, 3), b},
                    {.seed = 9, .rerandomize_each_iteration = true})
             .Repeat(2);
       }},
      {"one input twice, one of weight 0, a mixture in a mixture",
       [&] {
         return Dataset::SampleFromDatasets(
             {a, a, Dataset::SampleFromDatasets({b, c}, {.seed = 2}), c},
             {.weights = {1, 1, 2, 0}, .seed = 10});
       }},
  };
  for (const auto& [what, make] : cases) {
    for (int calls : {1, 3, kAutotune}) {
      ExpectSameAsUnfused(make().Batch(32).Parse(Spec(), Calls(calls)),
                          fmt::format("{}, {} calls", what, calls));
    }
  }
}

// ChooseFromDatasets over fusable inputs runs fused, each input a chain of
// its own, the choice dataset as written: the stages' elements, order and
// origins, whatever the choices (round robin, shuffled with a seed each
// epoch, through a prefetch's thread), the ends, and the stages around.
TEST_F(BatchParseFusionTest, ChoicesGiveTheElementsOfTheStages) {
  TFRecordOptions interleaved;
  interleaved.num_parallel_reads = 2;
  interleaved.block_length = 3;
  const Dataset a = Dataset::FromTFRecords({files_[0], files_[1]});
  // Its second file is gzipped.
  const Dataset b = Dataset::FromTFRecords({files_[2], files_[3]}, interleaved);
  const Dataset c = Dataset::FromTFRecords({files_[1]}).Shuffle(30, 4);
  const auto round_robin = [](int64_t n) {
    return Dataset::Range(0, n).Repeat();
  };
  const std::vector<std::pair<std::string, std::function<Dataset()>>> cases = {
      {"round robin, to the first input's end",
       [&] {
         return Dataset::ChooseFromDatasets({a, b, c}, round_robin(3));
       }},
      {"round robin, on after the first input's end",
       [&] {
         return Dataset::ChooseFromDatasets({a, b, c}, round_robin(3), false);
       }},
      {"shuffled choices that end first, other ones each epoch",
       [&] {
         return Dataset::ChooseFromDatasets(
                    {a.Shuffle(40, 1), b},
                    Dataset::Range(0, 2).Repeat(90).Shuffle(50, 2))
             .Repeat(3);
       }},
      {"choices through a prefetch, one input twice, a mixture in it",
       [&] {
         return Dataset::ChooseFromDatasets(
             {a, Dataset::SampleFromDatasets({b, c}, {.seed = 3}), a},
             round_robin(3).Prefetch(8), false);
       }},
  };
  for (const auto& [what, make] : cases) {
    for (int calls : {1, 3, kAutotune}) {
      ExpectSameAsUnfused(make().Batch(32).Parse(Spec(), Calls(calls)),
                          fmt::format("{}, {} calls", what, calls));
    }
  }
}

// Global shuffles as inputs of a mixture run fused (their records planned
// unread, each read by the parse call of its batch with the other inputs'
// records beside it): the stages' elements, order and origins, with file
// streams beside them, one global shuffle twice, over several epochs and
// shards, under a shuffle and a repeat.
TEST_F(BatchParseFusionTest,
       GlobalShufflesInMixturesGiveTheElementsOfTheStages) {
  GlobalShuffleOptions o;
  o.seed = 3;
  const Dataset g =
      Dataset::FromTFRecordsGlobalShuffle({files_[0], files_[1]}, o);
  GlobalShuffleOptions sharded;
  sharded.seed = 4;
  sharded.num_epochs = 2;
  sharded.num_shards = 3;
  sharded.shard_index = 1;
  const Dataset h = Dataset::FromTFRecordsGlobalShuffle({files_[2]}, sharded);
  // Gzipped: a file stream.
  const Dataset stream = Dataset::FromTFRecords({files_[3], files_[1]});
  const std::vector<std::pair<std::string, std::function<Dataset()>>> cases = {
      {"a global shuffle and a file stream",
       [&] {
         return Dataset::SampleFromDatasets({g, stream}, {.seed = 1});
       }},
      {"two global shuffles, one twice, chosen round robin",
       [&] {
         return Dataset::ChooseFromDatasets(
             {g, h, g}, Dataset::Range(0, 3).Repeat(), false);
       }},
      {"under a shuffle, repeated, a global shuffle shuffled again",
       [&] {
         return Dataset::SampleFromDatasets({g.Shuffle(30, 2), h, stream},
                                            {.weights = {2, 1, 1}, .seed = 5})
             .Shuffle(40, 6)
             .Repeat(2);
       }},
  };
  for (const auto& [what, make] : cases) {
    for (int calls : {1, 3, kAutotune}) {
      ExpectSameAsUnfused(make().Batch(32).Parse(Spec(), Calls(calls)),
                          fmt::format("{}, {} calls", what, calls));
    }
  }
  // Saved anywhere (a shuffle's buffer holding records planned unread,
  // of each file of a global shuffle after a file stream's), the state
  // continues the same stream.
  for (int calls : {1, kAutotune}) {
    SavedStatesContinue(
        Dataset::SampleFromDatasets({stream.Shuffle(50, 7), g.Shuffle(30, 2)},
                                    {.seed = 8})
            .Batch(24)
            .Parse(Spec(), Calls(calls)));
  }
}

// Fused, a mixture counts what its stage does: every record it gives.
TEST_F(BatchParseFusionTest, AFusedMixtureCountsItsRecords) {
  const Dataset ds = Dataset::SampleFromDatasets(
                         {Dataset::FromTFRecords({files_[0], files_[1]}),
                          Dataset::FromTFRecords({files_[2], files_[3]})},
                         {.seed = 1})
                         .Batch(16)
                         .Parse(Spec());
  for (const IteratorOptions& o : StatsRuns()) {
    uint64_t batches = 0;
    // Each source counts its own records.
    uint64_t drawn = 0, read = 0;
    for (const auto& s : StatsAtTheEnd(ds, o, &batches)) {
      if (s.name == "sample_from_datasets") drawn += s.elements;
      if (s.name == "tfrecord") read += s.elements;
    }
    EXPECT_EQ(drawn, AllRecords()) << o.threads;
    EXPECT_EQ(read, AllRecords()) << o.threads;
  }
  // A ChooseFromDatasets too, and its choices' stages count theirs: one
  // choice a record, and one more for each 0 chosen once the first input
  // has ended (one 0 between each two of the second input's last records,
  // then a 0 and a 1 that end the stream).
  const Dataset chosen =
      Dataset::ChooseFromDatasets(
          {Dataset::FromTFRecords({files_[0]}),
           Dataset::FromTFRecords({files_[1], files_[2], files_[3]})},
          Dataset::Range(0, 2).Repeat(), false)
          .Batch(16)
          .Parse(Spec());
  for (const IteratorOptions& o : StatsRuns()) {
    uint64_t batches = 0;
    std::map<std::string, uint64_t> elements;
    for (const auto& s : StatsAtTheEnd(chosen, o, &batches)) {
      elements[s.name] += s.elements;
    }
    EXPECT_EQ(elements["choose_from_datasets"], AllRecords()) << o.threads;
    EXPECT_EQ(elements["tfrecord"], AllRecords()) << o.threads;
    const uint64_t second = AllRecords() - RecordsInFile(0);
    EXPECT_EQ(elements["range"],
              AllRecords() + (second - RecordsInFile(0) - 1) + 1 + 2)
        << o.threads;
  }
  // Global shuffles in a mixture each count the records they read.
  const Dataset globals =
      Dataset::SampleFromDatasets(
          {Dataset::FromTFRecordsGlobalShuffle({files_[0]}, {}),
           Dataset::FromTFRecordsGlobalShuffle({files_[1], files_[2]}, {})},
          {.seed = 2})
          .Batch(16)
          .Parse(Spec());
  for (const IteratorOptions& o : StatsRuns()) {
    uint64_t batches = 0;
    std::vector<uint64_t> read;
    uint64_t drawn = 0;
    for (const auto& s : StatsAtTheEnd(globals, o, &batches)) {
      if (s.name == "global_shuffle") read.push_back(s.elements);
      if (s.name == "sample_from_datasets") drawn += s.elements;
    }
    std::sort(read.begin(), read.end());
    EXPECT_EQ(read,
              (std::vector<uint64_t>{
                  static_cast<uint64_t>(RecordsInFile(0)),
                  static_cast<uint64_t>(RecordsInFile(1) + RecordsInFile(2))}))
        << o.threads;
    EXPECT_EQ(drawn, AllRecords() - RecordsInFile(3)) << o.threads;
  }
}

// Take, Skip and Shard run fused: the stages' elements, order and
// origins, with counts inside the data and past it, over every kind of
// input.  (A Shard of at most as many shards as files is a source of its
// own: Dataset::Shard.)
TEST_F(BatchParseFusionTest, TakeSkipAndShardGiveTheElementsOfTheStages) {
  TFRecordOptions interleaved;
  interleaved.num_parallel_reads = 3;
  const Dataset ds = Dataset::FromTFRecords(files_);
  const std::vector<std::pair<std::string, std::function<Dataset()>>> cases = {
      {"take", [&] { return ds.Take(300); }},
      {"take all (-1) and past the end",
       [&] { return ds.Take(-1).Take(5000); }},
      {"skip, interleaved, then a shuffle",
       [&] {
         return Dataset::FromTFRecords(files_, interleaved)
             .Skip(100)
             .Shuffle(50, 1);
       }},
      {"a shuffle's first records, each epoch",
       [&] { return ds.Shuffle(60, 2).Take(250).Repeat(2); }},
      {"skip past a file's end, take into the next",
       [&] { return ds.Skip(170).Take(190).Repeat(2); }},
      {"more shards than files", [&] { return ds.Shard(5, 2); }},
      {"a shuffle's shard, each epoch",
       [&] { return ds.Shuffle(50, 1).Shard(3, 0).Repeat(2); }},
      {"a shard of a skip, interleaved",
       [&] {
         return Dataset::FromTFRecords(files_, interleaved).Skip(7).Shard(4, 3);
       }},
      {"a mixture of a take and a skip",
       [&] {
         return Dataset::SampleFromDatasets(
             {Dataset::FromTFRecords({files_[0], files_[1]}).Take(100),
              Dataset::FromTFRecords({files_[2], files_[3]}).Skip(50)},
             {.seed = 2});
       }},
  };
  for (const auto& [what, make] : cases) {
    for (int calls : {1, 3}) {
      ExpectSameAsUnfused(make().Batch(32).Parse(Spec(), Calls(calls)),
                          fmt::format("{}, {} calls", what, calls));
    }
  }
  // Nothing: Take(0), Skip(-1) (which reads every record), a skip past
  // the end.
  for (const Dataset& empty : {ds.Take(0), ds.Skip(-1), ds.Skip(1000)}) {
    const Dataset batched = empty.Batch(8).Parse(Spec(), Calls(2));
    EXPECT_TRUE(Collect(batched, Unfused()).empty());
    EXPECT_TRUE(Collect(batched, {.threads = 2}).empty());
  }
}

// A Take's, a Skip's and a Shard's saved states continue the same stream,
// among the records skipped and those taken.
TEST_F(BatchParseFusionTest, TakeSkipAndShardStatesContinueTheSameStream) {
  for (int calls : {1, kAutotune}) {
    SavedStatesContinue(Dataset::FromTFRecords(files_)
                            .Shuffle(40, 3)
                            .Skip(100)
                            .Shard(3, 1)
                            .Take(200)
                            .Repeat(2)
                            .Batch(24)
                            .Parse(Spec(), Calls(calls)));
  }
}

// Fused, a Take's, Skip's or Shard's restored count is checked as the
// stage checks its own: none below 0, none past the stage's count.
TEST_F(BatchParseFusionTest, TakeSkipAndShardRefuseCountsOutOfRange) {
  using testing::Forged, testing::StateString, testing::U64s;
  const Dataset ds = Dataset::FromTFRecords(files_)
                         .Skip(10)
                         .Shard(7, 2)
                         .Take(30)
                         .Batch(8)
                         .Parse(Spec(), Calls(1));
  Iterator it = ds.MakeIterator();
  Element e;
  ASSERT_TRUE(it.Next(&e));
  const std::string state = it.Save();
  // Eight records taken: the shard's at its input's 2, 9, ..., 51.
  const std::string take = StateString("take") + U64s({8});
  const std::string skip = StateString("skip") + U64s({10});
  const std::string shard = StateString("shard") + U64s({52});
  {
    Iterator b = ds.MakeIterator();
    b.Restore(Forged(state, take, take));
    ASSERT_TRUE(b.Next(&e));
  }
  testing::ExpectRefused(ds,
                         Forged(state, take, StateString("take") + U64s({31})),
                         "31 elements counted by Take(30)");
  testing::ExpectRefused(ds,
                         Forged(state, skip, StateString("skip") + U64s({11})),
                         "11 elements counted by Skip(10)");
  testing::ExpectRefused(
      ds,
      Forged(state, shard,
             StateString("shard") + U64s({static_cast<uint64_t>(-1)})),
      "-1 elements counted by Shard(7, 2)");
}

// A damaged record among those skipped, or those taken, or those a
// shard drops, fails where the stages meet it; the stream goes on past it.
TEST_F(BatchParseFusionTest, DamageUnderATakeSkipOrShardFailsAtItsPlace) {
  DamageRecord(files_[0], 40);
  DamageRecord(files_[1], 30);
  DamageRecord(files_[2], 11);
  for (int calls : {1, 2}) {
    ExpectErrorsWhereTheStagesHaveThem(
        Dataset::FromTFRecords(files_).Skip(60).Take(300).Batch(25).Parse(
            Spec(), Calls(calls)),
        3, fmt::format("calls {}", calls));
    ExpectErrorsWhereTheStagesHaveThem(
        Dataset::FromTFRecords(files_).Shard(6, 4).Batch(25).Parse(
            Spec(), Calls(calls)),
        3, fmt::format("shard, calls {}", calls));
  }
}

// A mixture's saved state continues the same stream, taken at any batch:
// across epochs, and halfway through three inputs, the first of which
// has ended there (its share of the draws gone to the other two).
TEST_F(BatchParseFusionTest, MixtureStatesContinueTheSameStream) {
  TFRecordOptions per_file;
  per_file.num_parallel_reads = 2;
  per_file.shuffle_buffer_per_file = 30;
  per_file.seed = 3;
  const Dataset a = Dataset::FromTFRecords({files_[0], files_[3]}, per_file);
  const Dataset b = Dataset::FromTFRecords({files_[1], files_[2]});
  for (int calls : {1, kAutotune}) {
    SavedStatesContinue(
        Dataset::SampleFromDatasets({a, b.Shuffle(60, 4)},
                                    {.weights = {2, 1}, .seed = 6})
            .Repeat(2)
            .Batch(24)
            .Parse(Spec(), Calls(calls)));
    // 150 records of weight 4 among 822: drawn out after ~230.
    SavedStatesContinue(
        Dataset::SampleFromDatasets(
            {Dataset::FromTFRecords({files_[0]}),
             Dataset::FromTFRecords({files_[1], files_[2]}),
             Dataset::FromTFRecords({files_[3]}).Shuffle(40, 2)},
            {.weights = {4, 1, 1}, .seed = 7})
            .Batch(24)
            .Parse(Spec(), Calls(calls)));
  }
}

// A ChooseFromDatasets' saved state continues the same stream, taken at
// any batch: its choices' iterator (a shuffle's buffer among its stages)
// and its inputs, across epochs and after an input has ended.
TEST_F(BatchParseFusionTest, ChoiceStatesContinueTheSameStream) {
  const Dataset a = Dataset::FromTFRecords({files_[0], files_[3]});
  const Dataset b =
      Dataset::FromTFRecords({files_[1], files_[2]}).Shuffle(60, 4);
  for (int calls : {1, kAutotune}) {
    SavedStatesContinue(
        Dataset::ChooseFromDatasets(
            {a, b}, Dataset::Range(0, 2).Repeat().Shuffle(20, 5), false)
            .Repeat(2)
            .Batch(24)
            .Parse(Spec(), Calls(calls)));
  }
}

// A choice that names no input fails where the stages' choice does (the
// choice used up), as a damaged record of an input does (its file ends
// there, its next one goes on), and the choices go on past both.
TEST_F(BatchParseFusionTest, BadChoicesAndDamagedRecordsFailAtTheirPlace) {
  DamageRecord(files_[1], 10);
  const Dataset choices = Dataset::Range(0, 2)
                              .Repeat(40)
                              .Concatenate(Dataset::Range(7, 8))
                              .Concatenate(Dataset::Range(0, 2).Repeat());
  for (int calls : {1, 2}) {
    ExpectErrorsWhereTheStagesHaveThem(
        Dataset::ChooseFromDatasets(
            {Dataset::FromTFRecords({files_[0]}),
             Dataset::FromTFRecords({files_[1], files_[2]})},
            choices)
            .Batch(25)
            .Parse(Spec(), Calls(calls)),
        2, fmt::format("calls {}", calls));
  }
}

// A damaged record of one input fails where the stages meet it (the
// draw that reached it used up), and the draws go on past it.
TEST_F(BatchParseFusionTest, AMixturesDamagedRecordFailsAtItsPlace) {
  // Met early, while the other input has records: the draws after the
  // error go on from the one after its draw.
  DamageRecord(files_[1], 60);
  for (int calls : {1, 2}) {
    ExpectErrorsWhereTheStagesHaveThem(
        Dataset::SampleFromDatasets(
            {Dataset::FromTFRecords({files_[1], files_[0]}).Shuffle(20, 1),
             Dataset::FromTFRecords({files_[2]})},
            {.seed = 3})
            .Batch(25)
            .Parse(Spec(), Calls(calls)),
        1, fmt::format("calls {}", calls));
  }
}

// The fused shuffle counts what the unfused one does: every record it
// draws, its buffer's fill, and its own time (not its input's, which is
// the planner's "batch").
TEST_F(BatchParseFusionTest, FusedShuffleCountsItsOwnStage) {
  constexpr int64_t kBuffer = 64;
  const Dataset ds = Dataset::FromTFRecords(files_)
                         .Shuffle(kBuffer, 3)
                         .Repeat(2)
                         .Batch(16)
                         .Parse(Spec());
  for (const IteratorOptions& o : StatsRuns()) {
    uint64_t batches = 0;
    std::map<std::string, StageStats> by_name;
    for (const auto& s : StatsAtTheEnd(ds, o, &batches)) by_name[s.name] = s;
    ASSERT_TRUE(by_name.contains("shuffle")) << o.threads;
    const StageStats& shuffle = by_name["shuffle"];
    EXPECT_EQ(shuffle.elements, 2 * AllRecords()) << o.threads;
    EXPECT_GT(shuffle.busy_seconds, 0) << o.threads;
    EXPECT_GE(shuffle.buffered, 0) << o.threads;
    EXPECT_LE(shuffle.buffered, kBuffer) << o.threads;
    EXPECT_EQ(by_name["batch"].elements, batches) << o.threads;
    EXPECT_GT(by_name["batch"].busy_seconds, 0) << o.threads;
  }
}

// A Parse's batch buffers go back to it when the batch's tensors go, and
// later batches are parsed into them (stages.h, ParsedBuffers).  Each
// batch streamed and dropped before the next is taken equals the same
// batch collected whole (batches of 50 records whose ragged and bytes
// values vary in length; the last is partial), a batch kept while later
// ones are parsed keeps its values, and a dropped batch's memory does
// take the next batch.
TEST_F(BatchParseFusionTest, BatchBuffersAreReusedOnlyOnceDropped) {
  ParseOptions calls;
  calls.num_parallel_calls = kAutotune;
  const Dataset ds =
      Dataset::FromTFRecords(files_).Shuffle(100, 7).Batch(50).Parse(Spec(),
                                                                     calls);
  for (const IteratorOptions& o :
       {Unfused(), IteratorOptions{.threads = 1}, IteratorOptions{.threads = 3},
        IteratorOptions{.threads = 3, .optimize = false}}) {
    SCOPED_TRACE(fmt::format("{} threads, fused {}", o.threads, o.optimize));
    const std::vector<Element> want = Collect(ds, o);
    ASSERT_EQ(want.size(), 17u);
    Iterator it = ds.MakeIterator(o);
    Element kept;  // batch 2, to the end
    Element e;
    size_t i = 0;
    while (true) {
      e = Element{};
      if (!it.Next(&e)) break;
      ASSERT_LT(i, want.size());
      EXPECT_EQ(e, want[i]) << "batch " << i;
      if (i == 2) kept = e;
      ++i;
    }
    EXPECT_EQ(i, want.size());
    EXPECT_EQ(kept, want[2]);
  }
  // The last batch (22 of the 822 records) is parsed into a full batch's
  // buffer: its storage is 50 rows' (malloc would give 22 rows'; so it
  // does when every batch is still held).
  const size_t full = 50 * 3 * sizeof(float), last = 22 * 3 * sizeof(float);
  for (const IteratorOptions& o : {Unfused(), IteratorOptions{.threads = 1}}) {
    SCOPED_TRACE(fmt::format("fused {}", o.optimize));
    EXPECT_EQ(Collect(ds, o).back()["x"].storage_bytes(), last);
    Iterator it = ds.MakeIterator(o);
    Element e, previous;
    while (true) {
      previous = Element{};
      previous = std::move(e);
      e = Element{};
      if (!it.Next(&e)) break;
    }
    ASSERT_EQ(previous["x"].num_rows(), 22);
    EXPECT_EQ(previous["x"].storage_bytes(), full);
  }
}

// IteratorOptions::output_memory over the fused stage: each batch is
// copied into the memory in its parse task (under a Prefetch too, which
// asks its input to), the same batches as without; the ragged "tokens"
// and the "blob" bytes of mixed lengths stay in the parser's buffers.
// Batches restored from a state are copied as well.
TEST_F(BatchParseFusionTest, OutputMemoryHoldsEveryBatch) {
  const Dataset parsed =
      Dataset::FromTFRecords(files_).Shuffle(60, 3).Batch(16).Parse(
          Spec(), Calls(kAutotune));
  for (const Dataset& ds : {parsed, parsed.Prefetch(2)}) {
    for (int threads : {1, 3}) {
      SCOPED_TRACE(fmt::format("{} threads", threads));
      const std::vector<Element> want = Collect(ds, {.threads = threads});
      ASSERT_EQ(want.size(), 52u);
      auto memory = std::make_shared<testing::RecordingMemory>();
      {
        Iterator it =
            ds.MakeIterator({.threads = threads, .output_memory = memory});
        Element e;
        for (size_t i = 0; i < 20; ++i) {
          ASSERT_TRUE(it.Next(&e));
          ASSERT_EQ(e, want[i]) << i;
          EXPECT_EQ(testing::OutsideMemory(e, *memory), "") << i;
          EXPECT_TRUE(memory->Holds(e["label"].raw_data(), 16 * 8)) << i;
          EXPECT_TRUE(memory->Holds(e["x"].raw_data(), 16 * 12)) << i;
          EXPECT_FALSE(memory->Holds(e["tokens"].raw_data(), 1)) << i;
        }
        const std::string state = it.Save();
        Iterator restored =
            ds.MakeIterator({.threads = threads, .output_memory = memory});
        restored.Restore(state);
        for (size_t i = 20; i < want.size(); ++i) {
          ASSERT_TRUE(restored.Next(&e));
          ASSERT_EQ(e, want[i]) << i;
          EXPECT_EQ(testing::OutsideMemory(e, *memory), "") << i;
          EXPECT_TRUE(memory->Holds(e["label"].raw_data(), 8)) << i;
        }
        EXPECT_FALSE(restored.Next(&e));
      }
      EXPECT_EQ(memory->live(), 0u);
      EXPECT_EQ(memory->bad_frees(), 0u);
    }
  }
  // The fused stage copies itself (so a Prefetch above it need not);
  // stages run one by one leave it to whatever is above.
  for (const IteratorOptions& o : {IteratorOptions{.threads = 1},
                                   IteratorOptions{.threads = 3}, Unfused()}) {
    IteratorContext ctx(o);
    const std::unique_ptr<IteratorBase> root = Dataset::FromTFRecords(files_)
                                                   .Batch(16)
                                                   .Parse(Spec(), Calls(1))
                                                   .base()
                                                   ->MakeIterator(&ctx, 0);
    EXPECT_EQ(root->DeliverIn(std::make_shared<testing::RecordingMemory>()),
              o.optimize);
  }
}

TEST_F(BatchParseFusionTest, CountsEveryRecordRead) {
  const Dataset ds = Dataset::FromTFRecords(files_).Repeat(2).Batch(64).Parse(
      Spec(), Calls(2));
  Iterator it = ds.MakeIterator({.threads = 2});
  Element e;
  uint64_t rows = 0;
  while (it.Next(&e)) rows += static_cast<uint64_t>(e["label"].num_rows());
  uint64_t read = 0, batches = 0;
  for (const auto& s : it.Stats()) {
    if (s.name == "tfrecord") read = s.elements;
    if (s.name == "parse") batches = s.elements;
  }
  EXPECT_EQ(rows, 2u * (150 + 187 + 224 + 261));
  EXPECT_EQ(read, rows);
  EXPECT_EQ(batches, (rows + 63) / 64);
}

// A fused stage an interleave's function makes counts its stages under
// the interleave (CounterNesting), wherever they count: the shuffle of
// each epoch after the first is made by the planner, on the consumer's
// thread or in a task of its own (SetPlanInTask(1)), and the readers and
// parse calls run in tasks.  No row of theirs is left at the top.
TEST_F(BatchParseFusionTest, AFusedStageInAnInterleaveCountsUnderIt) {
  struct ResetMode {
    ~ResetMode() { stages::SetPlanInTask(-1); }
  } reset;
  uint64_t records = 0;
  for (int f = 0; f < 4; ++f) records += 2 * RecordsInFile(f);
  for (int mode : {0, 1}) {
    SCOPED_TRACE(mode);
    stages::SetPlanInTask(mode);
    InterleaveOptions files;
    files.name = "files";
    files.num_parallel_calls = 2;
    const Dataset ds = Dataset::Range(0, 4).Interleave(
        [this](const Element& e) {
          const int64_t f = e["value"].scalar<int64_t>();
          return Dataset::FromTFRecords({files_[f]})
              .Shuffle(30, f)
              .Repeat(2)
              .Batch(8)
              .Parse(Spec(), Calls(2));
        },
        /*cycle_length=*/2, files);
    Iterator it = ds.MakeIterator({.threads = 4});
    Element e;
    uint64_t rows = 0, batches = 0;
    while (it.Next(&e)) {
      rows += static_cast<uint64_t>(e["label"].num_rows());
      ++batches;
    }
    EXPECT_EQ(rows, records);
    std::map<std::string, uint64_t> elements;
    for (const StageStats& s : it.Stats()) elements[s.name] = s.elements;
    const std::map<std::string, uint64_t> want = {
        {"range", 4},
        {"interleave:files", batches},
        {"interleave:files/tfrecord", records},
        {"interleave:files/shuffle", records},
        {"interleave:files/batch", batches},
        {"interleave:files/parse", batches}};
    EXPECT_EQ(elements, want);
  }
}

// A planner in a task of its own (SetPlanInTask(1)) plans while the
// consumer is away: the batches taken are planned again, up to
// kBatchesAhead (2) per parse call and no more.  Planned on the consumer's
// thread (the default, whatever the threads and cores), they wait for its
// next call.
TEST_F(BatchParseFusionTest, APlannerTaskPlansAheadWhileTheConsumerIsAway) {
  const Dataset ds =
      Dataset::FromTFRecords(files_).Shuffle(100, 2).Repeat().Batch(8).Parse(
          Spec(), Calls(4));
  constexpr uint64_t kAhead = 2 * 4 + 1;  // the batch due, and 2 a call
  constexpr uint64_t kTaken = 5;
  struct Case {
    int threads, cores, mode;  // mode: SetPlanInTask's
    bool task;
  };
  struct ResetMode {
    ~ResetMode() { stages::SetPlanInTask(-1); }
  } reset;
  for (const Case c :
       {Case{4, 16, -1, false}, Case{8, 4, -1, false}, Case{16, 16, -1, false},
        Case{4, 16, 1, true}, Case{8, 16, 0, false}, Case{8, 2, 1, true}}) {
    stages::SetFusedCores(c.cores);
    stages::SetPlanInTask(c.mode);
    Iterator it = ds.MakeIterator({.threads = c.threads});
    const auto planned = [&] {
      for (const auto& s : it.Stats()) {
        if (s.name == "batch") return s.elements;
      }
      return uint64_t{0};
    };
    Element e;
    for (uint64_t i = 0; i < kTaken; ++i) ASSERT_TRUE(it.Next(&e));
    // The planner task: the 5 taken and 9 ahead, planned while the
    // consumer is away; else 9 ahead when the fifth was due.
    const uint64_t want = c.task ? kTaken + kAhead : kTaken - 1 + kAhead;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (planned() < want && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    // And no more, however long it stays away.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(planned(), want)
        << c.threads << " threads, " << c.cores << " cores, mode " << c.mode;
  }
}

// Where the consumer's thread plans, it is busy most of the time: once as
// many workers as threads would take every core, the fused stage's tasks
// get one worker fewer, so that as many threads work as asked (4 here,
// the consumer's one of them).  With cores to spare, or the planner in a
// task of its own, a worker per thread.  With one parse call the
// consumer's thread plans and parses, and the tasks read ahead (the files
// read at once): one worker fewer too, the planner never in a task.
TEST_F(BatchParseFusionTest, TheConsumersThreadCountsAmongTheThreads) {
  TFRecordOptions all_at_once;
  all_at_once.num_parallel_reads = static_cast<int>(files_.size());
  struct Reset {
    ~Reset() { stages::SetPlanInTask(-1); }
  } reset;
  struct Case {
    int calls, cores, mode;  // mode: SetPlanInTask's
    int workers;             // of the fused stage: its tasks at once, at most
  };
  for (const Case c : {Case{4, 4, 0, 3}, Case{4, 2, 0, 3}, Case{4, 4, 1, 4},
                       Case{1, 4, 0, 3}, Case{1, 2, 0, 3}, Case{1, 4, 1, 3}}) {
    const Dataset ds = Dataset::FromTFRecords(files_, all_at_once)
                           .Shuffle(200, 3)
                           .Repeat(8)
                           .Batch(8)
                           .Parse(Spec(), Calls(c.calls));
    stages::SetFusedCores(c.cores);
    stages::SetPlanInTask(c.mode);
    const std::string what =
        fmt::format("{} calls, {} cores, mode {}", c.calls, c.cores, c.mode);
    for (int run = 0; run < 3; ++run) {
      stages::TakeFusedTasksAtOnceMost();
      // 8 epochs of the fixture's 822 records, in batches of 8.
      EXPECT_EQ(Collect(ds, {.threads = 4}).size(), 822u) << what;
      EXPECT_EQ(stages::LastFusedWorkers(), c.workers) << what;
      const int most = stages::TakeFusedTasksAtOnceMost();
      EXPECT_LE(most, c.workers) << what;
      EXPECT_GE(most, 1) << what;
    }
  }
}

// With one parse call the consumer's thread plans and parses.  Where files
// are read in parallel, reader tasks read them ahead, as the unfused
// source's reader threads do, and the elements are the same; read one at a
// time, or with stages::SetTFRecordReadAhead(false), the consumer's thread
// reads them in turn and no task runs.
TEST_F(BatchParseFusionTest,
       OneParseCallReadsAheadWhereFilesAreReadInParallel) {
  struct Again {
    ~Again() { stages::SetTFRecordReadAhead(true); }
  } again;
  // The most tasks at once over the runs of ExpectSameAsUnfused (1, 2, 4
  // and 8 threads).
  auto most_tasks = [&](int reads, bool ahead) {
    stages::SetTFRecordReadAhead(ahead);
    TFRecordOptions o;
    o.num_parallel_reads = reads;
    const Dataset ds =
        Dataset::FromTFRecords(files_, o).Repeat(2).Batch(8).Parse(Spec(),
                                                                   Calls(1));
    stages::TakeFusedTasksAtOnceMost();
    ExpectSameAsUnfused(ds,
                        fmt::format("{} reads, read ahead {}", reads, ahead));
    return stages::TakeFusedTasksAtOnceMost();
  };
  EXPECT_GE(most_tasks(2, true), 1);
  EXPECT_GE(most_tasks(4, true), 1);
  EXPECT_EQ(most_tasks(1, true), 0);
  EXPECT_EQ(most_tasks(2, false), 0);
  EXPECT_EQ(most_tasks(4, false), 0);
}

// Where the consumer's thread plans and waits for a reader task mid-chunk
// with no batch to parse, it reads another file's next chunk rather than
// sleep.  Two threads on two cores: one worker.  Through the I/O seam, the
// consumer's first read waits for the worker's first read, which waits
// for the planner to read a chunk that way (each wait at most 10 s, once).
// So the worker holds one file's chunk (the other's task finds the planner
// at it and ends), and the planner, alternating the files record by
// record, comes to wait for that chunk and reads the other file's next
// one.  The elements are those of the stages run one by one.
TEST_F(BatchParseFusionTest, APlannerWaitingForAReaderReadsAnotherFile) {
  std::vector<std::string> files;
  for (int f = 0; f < 2; ++f) {
    std::vector<std::string> recs;
    for (int i = 0; i < 1500; ++i) {
      records::ExampleBuilder b;
      b.AddInt64("label", f * 10000 + i);
      b.AddFloatList("x", std::vector<float>{1.0f, 2.0f, 3.0f});
      b.AddInt64List("tokens", std::vector<int64_t>{i});
      b.AddBytes("blob", std::string(1000, 'b'));
      recs.push_back(std::string(b.Serialize()));
    }
    files.push_back(dir_.File(fmt::format("wide-{}.tfrecord", f)));
    testing::WriteRecords(files.back(), recs, records::Compression::kNone);
  }
  class WorkerHeldUntilHelped : public records::IoFaultInjector {
   public:
    records::IoFault Before(records::IoOp op, std::string_view,
                            size_t) override {
      if (op != records::IoOp::kRead) return {};
      if (std::this_thread::get_id() == consumer_) {
        WaitOnce(&consumer_waited_, [this] { return worker_read_.load(); });
      } else {
        worker_read_ = true;
        WaitOnce(&worker_waited_,
                 [this] { return stages::PlannerHelpReads() > before_; });
      }
      return {};
    }

   private:
    static void WaitOnce(std::atomic<bool>* waited,
                         const std::function<bool()>& until) {
      if (waited->exchange(true)) return;
      const auto limit =
          std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!until() && std::chrono::steady_clock::now() < limit) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    const std::thread::id consumer_ = std::this_thread::get_id();
    const uint64_t before_ = stages::PlannerHelpReads();
    std::atomic<bool> worker_read_{false};
    std::atomic<bool> consumer_waited_{false};
    std::atomic<bool> worker_waited_{false};
  };
  TFRecordOptions both;
  both.num_parallel_reads = 2;
  const Dataset ds = Dataset::FromTFRecords(files, both)
                         .Repeat(4)
                         .Batch(64)
                         .Parse(Spec(), Calls(2));
  const auto want = Collect(ds, Unfused());
  stages::SetFusedCores(2);
  const uint64_t before = stages::PlannerHelpReads();
  std::vector<Element> got;
  {
    WorkerHeldUntilHelped held;
    records::ScopedIoFaults scope(&held);
    got = Collect(ds, {.threads = 2});
  }
  EXPECT_GT(stages::PlannerHelpReads(), before);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << i;
}

// Shuffle then Repeat: while an epoch's buffer drains (its input read to
// the end), the next epoch's buffer fills, a record for each one handed
// out, so that the next epoch does not begin by reading a whole buffer
// while the consumer waits.  One thread (the consumer reads): after the
// first epoch's rows, the second epoch's whole input (smaller than the
// buffer) has been read too, not yet the third's.
TEST_F(BatchParseFusionTest, ShuffleThenRepeatFillsTheNextEpochWhileDraining) {
  const uint64_t epoch = 150 + 187 + 224 + 261;
  const Dataset ds =
      Dataset::FromTFRecords(files_).Shuffle(1000, 4).Repeat(3).Batch(2).Parse(
          Spec(), Calls(1));
  Iterator it = ds.MakeIterator({.threads = 1});
  Element e;
  uint64_t rows = 0;
  while (rows < epoch && it.Next(&e)) {
    rows += static_cast<uint64_t>(e["label"].num_rows());
  }
  ASSERT_EQ(rows, epoch);
  uint64_t read = 0;
  for (const auto& s : it.Stats()) {
    if (s.name == "tfrecord") read = s.elements;
  }
  EXPECT_EQ(read, 2 * epoch);
  // What it delivers, its states and its errors are the stages' (also in
  // GivesTheElementsOfTheStagesRunOneByOne, SavedStatesContinue and
  // AMissingFileFailsWhenItsTurnComes): a state saved at every batch,
  // while the next epoch's buffer fills, continues the same stream.
  const Dataset whole =
      Dataset::FromTFRecords(files_).Shuffle(1000, 4).Repeat(2).Batch(50).Parse(
          Spec(), Calls(1));
  const auto all = Collect(whole, Unfused());
  for (size_t k = 0; k <= all.size(); ++k) {
    Iterator saver = whole.MakeIterator({.threads = 1});
    for (size_t i = 0; i < k; ++i) ASSERT_TRUE(saver.Next(&e));
    ExpectRestoredToContinue(whole, saver.Save(), all, k);
  }
}

// Where readers read ahead, a Repeat makes the next epoch's input as an
// epoch opens, and once an epoch was short (kShortEpochRecords) the next
// EpochsPrepared epochs' (as many as the threads, no more than the cores,
// from 2 to 8), so that a file read whole into an epoch's shuffle buffer
// is read epochs before its records are drawn, on as many workers as the
// cores keep busy.  Readers are made on the planner's thread, so their
// count is exact: one file an epoch, after the first batch two readers
// (epochs 0 and 1), in the second epoch 2 more than the epochs prepared
// (on 16 cores: at 2 threads 0 to 3, at 4 threads 0 to 5, at 16 threads 0
// to 9; on 2 cores at 16 threads 0 to 3), and one per epoch over the whole
// run, none past the count.  With one parse call nothing reads ahead: the
// next epoch's reader is made when its buffer starts filling, while the
// epoch before drains (RepeatEpochs::Handed).  An epoch of more records
// (four files) has one epoch's first file made ahead throughout.
TEST(BatchParseFusionEpochsTest,
     ARepeatOfShortEpochsStartsAsManyReadersAsThreadsAndCores) {
  testing::TempDir dir;
  std::vector<std::string> recs;
  for (int i = 0; i < 600; ++i) recs.push_back(MakeExample(0, i));
  const std::string file = dir.File("one.tfrecord");
  testing::WriteRecords(file, recs, records::Compression::kNone);
  // Four copies of the file an epoch: 2,400 records, not short.
  const std::vector<std::string> long_epoch(4, file);
  constexpr uint64_t kEpochs = 12;
  struct Case {
    int threads;
    int cores;
    uint64_t prepared;  // epochs made ahead once an epoch was short
  };
  struct ResetCores {
    ~ResetCores() { stages::SetFusedCores(0); }
  } reset;
  for (const Case c : {Case{1, 16, 1}, Case{2, 16, 2}, Case{4, 16, 4},
                       Case{16, 16, 8}, Case{16, 2, 2}}) {
    const int threads = c.threads;
    stages::SetFusedCores(c.cores);
    for (bool is_short : {true, false}) {
      SCOPED_TRACE(fmt::format("{} threads, {} cores, {} epochs", threads,
                               c.cores, is_short ? "short" : "long"));
      const std::vector<std::string> files =
          is_short ? std::vector<std::string>{file} : long_epoch;
      const uint64_t epoch = 600 * files.size();
      const Dataset ds = Dataset::FromTFRecords(files)
                             .Shuffle(1000, 3)
                             .Repeat(kEpochs)
                             .Batch(4)
                             .Parse(Spec(), Calls(threads));
      const uint64_t before = stages::FusedFileReadersMade();
      auto made = [&] { return stages::FusedFileReadersMade() - before; };
      Iterator it = ds.MakeIterator({.threads = threads});
      Element e;
      uint64_t rows = 0;
      auto next = [&] {
        if (!it.Next(&e)) return false;
        rows += static_cast<uint64_t>(e["label"].num_rows());
        return true;
      };
      ASSERT_TRUE(next());
      if (is_short) {
        EXPECT_EQ(made(), 2u);
        // Into the second epoch, the planner a few batches ahead.
        while (rows < epoch + 100) ASSERT_TRUE(next());
        EXPECT_EQ(made(), 2 + c.prepared);
      } else {
        // The buffer's first 1,000 records: copy 0 read, copy 1 open and
        // copy 2 opened ahead (the interleave's next file); with readers
        // reading ahead also the next epoch's first file.
        EXPECT_EQ(made(), threads == 1 ? 3u : 4u);
        // In the second epoch: the first's 4, the second's 3 the same
        // way, and with readers reading ahead the third epoch's first
        // file, not the fourth's.  At 16 threads the planner plans up to
        // 32 batches ahead, not 8: its buffer can have reached the
        // second's third copy, and then the fourth is opened ahead.  (How
        // far ahead is the planner task's, on 16 cores: at least 28
        // batches once it ran after the last take, fewer before.  Planned
        // on the consumer's thread, on 2 cores, it is 32.)
        while (rows < epoch + 100) ASSERT_TRUE(next());
        if (threads == 16 && c.cores == 2) {
          EXPECT_EQ(made(), 9u);
        } else if (threads == 16) {
          EXPECT_GE(made(), 8u);
          EXPECT_LE(made(), 9u);
        } else {
          EXPECT_EQ(made(), threads == 1 ? 7u : 8u);
        }
      }
      while (next()) {
      }
      EXPECT_EQ(rows, kEpochs * epoch);
      EXPECT_EQ(made(), kEpochs * files.size());
    }
  }
}

// A damaged record among the first of the next epoch's buffer is met
// while the epoch before drains: it fails where the stages fail, at the
// next epoch's start, in each epoch, and a state saved after it goes on.
TEST_F(BatchParseFusionTest, ADamagedRecordInTheNextEpochFailsAtItsPlace) {
  DamageRecord(files_[0], 10);
  for (int calls : {1, 2}) {
    const Dataset ds = Dataset::FromTFRecords(files_)
                           .Shuffle(300, 5)
                           .Repeat(3)
                           .Batch(40)
                           .Parse(Spec(), Calls(calls));
    ExpectErrorsWhereTheStagesHaveThem(ds, 3, fmt::format("{} calls", calls));
  }
}

// Saves after every k-th element, restores in a fresh iterator (another
// thread count), and checks the rest of the stream: interleaved and
// shuffled, and one file at a time straight into batches (which the
// planner takes in runs of records, across files and epochs).  Four
// epochs of 822 records (short): from the second on, the readers of the
// next epochs read ahead (EpochsPrepared), and a save stops them all.
TEST_F(BatchParseFusionTest, SavedStatesContinueTheSameStream) {
  TFRecordOptions interleaved;
  interleaved.num_parallel_reads = 2;
  interleaved.block_length = 3;
  TFRecordOptions one;
  one.block_length = 4;
  TFRecordOptions per_file;
  per_file.num_parallel_reads = 3;
  per_file.shuffle_buffer_per_file = 50;
  per_file.seed = 12;
  for (const Dataset& ds : {Dataset::FromTFRecords(files_, interleaved)
                                .Shuffle(120, 8)
                                .Repeat(4)
                                .Batch(24)
                                .Parse(Spec(), Calls(kAutotune)),
                            Dataset::FromTFRecords(files_, one)
                                .Repeat(2)
                                .Batch(70)
                                .Parse(Spec(), Calls(1)),
                            Dataset::FromTFRecords(files_, per_file)
                                .Repeat(3)
                                .Batch(24)
                                .Parse(Spec(), Calls(kAutotune)),
                            // One call, the files read ahead by tasks.
                            Dataset::FromTFRecords(files_, per_file)
                                .Repeat(2)
                                .Batch(24)
                                .Parse(Spec(), Calls(1)),
                            Dataset::FromTFRecords(files_, interleaved)
                                .Shuffle(120, 8)
                                .Repeat(2)
                                .Batch(24)
                                .Parse(Spec(), Calls(1))}) {
    SavedStatesContinue(ds);
  }
}

void BatchParseFusionTest::SavedStatesContinue(const Dataset& ds) {
  const auto all = Collect(ds, Unfused());
  // Planned on the consumer's thread (3 threads) and in a planner task
  // (8 threads on the fixture's 16 cores, when there are parse calls).
  for (int threads : {3, 8}) {
    for (size_t k : {size_t{0}, size_t{1}, size_t{7}, all.size() / 2,
                     all.size() - 1, all.size()}) {
      Iterator it = ds.MakeIterator({.threads = threads});
      Element e;
      for (size_t i = 0; i < k; ++i) ASSERT_TRUE(it.Next(&e));
      const std::string state = it.Save();
      // The iterator that saved goes on as if nothing happened.
      if (k < all.size()) {
        ASSERT_TRUE(it.Next(&e));
        EXPECT_EQ(e, all[k]) << "threads " << threads << " k " << k;
      }
      ExpectRestoredToContinue(ds, state, all, k);
    }
  }
}

// A record buffered for three buffer lengths is copied out of its reader's
// chunk (or, owning its bytes, moved out: a record across blocks) into the
// shuffle's own chunks, and its reader's chunk goes with its blocks once
// no record of it is buffered.  Over 4 KiB blocks (records within and
// across blocks, and a compressed file's), through a buffer of 50 that
// copies out ~5% of 6,576 records: the stages' elements, order and
// origins, and states saved among the copied records continue the stream.
TEST_F(BatchParseFusionTest, RecordsCopiedOutOfTheirChunksKeepTheStream) {
  TFRecordOptions small_blocks;
  small_blocks.io.block_bytes = 4096;
  const Dataset ds = Dataset::FromTFRecords(files_, small_blocks)
                         .Repeat(8)
                         .Shuffle(50, 3)
                         .Batch(16)
                         .Parse(Spec(), Calls(2));
  ExpectSameAsUnfused(ds, "copied out");
  SavedStatesContinue(ds);
}

// Sixteen files read at once: each file's reader reads smaller chunks
// (128 records or 256 KiB, where a file read alone takes 512 or 1 MiB),
// so every file here (~2.5 KB records) is read in several chunks, and
// states are saved between and inside the chunks of all sixteen files.
// (Losing a record at each chunk's end fails only this test.)
TEST(BatchParseFusionManyFilesTest, SmallChunksOfManyFilesGiveTheSameStream) {
  testing::TempDir dir;
  std::vector<std::string> files;
  for (int f = 0; f < 16; ++f) {
    std::vector<std::string> recs;
    for (int i = 0; i < 290 + 7 * f; ++i) recs.push_back(MakeExample(f, i));
    files.push_back(dir.File(fmt::format("part-{:02}.tfrecord", f)));
    testing::WriteRecords(files.back(), recs, records::Compression::kNone);
  }
  TFRecordOptions o;
  o.num_parallel_reads = 16;
  const Dataset plain =
      Dataset::FromTFRecords(files, o).Batch(40).Parse(Spec(), Calls(3));
  const Dataset shuffled =
      Dataset::FromTFRecords(files, o).Shuffle(300, 2).Batch(40).Parse(
          Spec(), Calls(kAutotune));
  // Each file shuffled by its reader tasks: a state holds the records they
  // drew ahead (chunks read and not planned yet) before each buffer.
  TFRecordOptions per_file = o;
  per_file.shuffle_buffer_per_file = 20;
  per_file.seed = 4;
  const Dataset shuffled_per_file = Dataset::FromTFRecords(files, per_file)
                                        .Batch(40)
                                        .Parse(Spec(), Calls(kAutotune));
  for (const Dataset* ds : {&plain, &shuffled, &shuffled_per_file}) {
    const auto all = Collect(*ds, Unfused());
    ASSERT_EQ(all.size(), (16 * 290 + 7 * 120 + 39) / 40);
    for (int threads : {1, 2, 4, 8}) {
      EXPECT_EQ(Collect(*ds, {.threads = threads}), all) << threads;
    }
    for (size_t k : {size_t{1}, size_t{3}, size_t{50}, all.size() - 2}) {
      Iterator it = ds->MakeIterator({.threads = 3});
      Element e;
      for (size_t i = 0; i < k; ++i) ASSERT_TRUE(it.Next(&e));
      ExpectRestoredToContinue(*ds, it.Save(), all, k);
    }
  }
}

TEST_F(BatchParseFusionTest, StatesOfAnotherPipelineOrRunAreRefused) {
  const Dataset fused =
      Dataset::FromTFRecords(files_).Shuffle(30, 1).Batch(8).Parse(Spec());
  Iterator a = fused.MakeIterator({.threads = 2});
  Element e;
  a.Next(&e);
  const std::string state = a.Save();
  // Stage by stage, the same pipeline saves another layout: refused with
  // the stage named, not misread.
  Iterator unfused = fused.MakeIterator(Unfused());
  try {
    unfused.Restore(state);
    FAIL() << "restored";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("batch_parse"), std::string::npos)
        << err.what();
  }
  // The buffered records' file changed since the save (other Examples).
  std::vector<std::string> other;
  for (int i = 0; i < 150; ++i) other.push_back(MakeExample(7, i));
  testing::WriteRecords(files_[0], other);
  Iterator b = fused.MakeIterator({.threads = 2});
  EXPECT_THROW(b.Restore(state), Error);
}

// A damaged record: the same error, at the same element, as the stages
// give, and the stream goes on after it as theirs does.
TEST_F(BatchParseFusionTest, ADamagedRecordFailsAtItsPlace) {
  DamageRecord(files_[1], 60);
  for (int shuffle : {0, 80}) {
    for (int calls : {1, 2}) {
      Dataset ds = Dataset::FromTFRecords(files_);
      if (shuffle > 0) ds = ds.Shuffle(shuffle, 2);
      ds = ds.Batch(25).Parse(Spec(), Calls(calls));
      ExpectErrorsWhereTheStagesHaveThem(
          ds, 1, fmt::format("shuffle {} calls {}", shuffle, calls));
    }
  }
  // Each file shuffled: the error after the records buffered before it,
  // read ahead by a reader task (2 calls, or 2 files at once) or not (one
  // call and one file at once); a state saved after the error goes on past
  // it, and one saved before meets it again.
  TFRecordOptions per_file;
  per_file.shuffle_buffer_per_file = 30;
  per_file.seed = 8;
  for (int reads : {1, 2}) {
    per_file.num_parallel_reads = reads;
    for (int calls : {1, 2}) {
      ExpectErrorsWhereTheStagesHaveThem(
          Dataset::FromTFRecords(files_, per_file)
              .Batch(25)
              .Parse(Spec(), Calls(calls)),
          1,
          fmt::format("a shuffle buffer per file, {} reads, {} calls", reads,
                      calls));
    }
  }
}

// Each file shuffled, a state saved before a damaged record, where a
// reader task has drawn the file's records up to the damage ahead of the
// planner (the chunk that ends in the error not planned yet): the restored
// stream meets the error at the same place (the state reads on from the
// damage), with every record before it.
TEST_F(BatchParseFusionTest, AShuffleBufferPerFileSavedBeforeDamageMeetsIt) {
  DamageRecord(files_[2], 150);
  TFRecordOptions per_file;
  per_file.num_parallel_reads = 2;
  per_file.shuffle_buffer_per_file = 30;
  per_file.seed = 8;
  const Dataset ds = Dataset::FromTFRecords(files_, per_file)
                         .Batch(25)
                         .Parse(Spec(), Calls(2));
  const auto want = Outcomes(ds, Unfused());
  for (size_t k = 0; !want[k].starts_with("error: "); ++k) {
    Iterator it = ds.MakeIterator({.threads = 2});
    Element e;
    for (size_t i = 0; i < k; ++i) ASSERT_TRUE(it.Next(&e));
    // The open files' chunks read (each file is one chunk here).
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    Iterator restored = ds.MakeIterator({.threads = 2});
    restored.Restore(it.Save());
    std::vector<std::string> got(want.begin(), want.begin() + k);
    AppendOutcomes(restored, &got);
    EXPECT_EQ(got, want) << "saved after " << k;
  }
}

TEST_F(BatchParseFusionTest, ABadExampleIsNamedByItsFileAndRecord) {
  records::ExampleBuilder b;
  b.AddFloatList("label", std::vector<float>{1.0f});  // int64 in the spec
  std::vector<std::string> recs;
  for (int i = 0; i < 40; ++i) recs.push_back(MakeExample(9, i));
  recs[29] = std::string(b.Serialize());
  const std::string bad = dir_.File("bad.tfrecord");
  testing::WriteRecords(bad, recs);
  const Dataset ds =
      Dataset::FromTFRecords({bad}).Shuffle(40, 3).Batch(8).Parse(Spec(),
                                                                  Calls(2));
  for (IteratorOptions o : {Unfused(), IteratorOptions{.threads = 2}}) {
    try {
      Collect(ds, o);
      FAIL() << "no parse error";
    } catch (const records::ParseError& e) {
      EXPECT_NE(std::string(e.what()).find(bad + ": record 29"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST_F(BatchParseFusionTest, AMissingFileFailsWhenItsTurnComes) {
  const Dataset ds = Dataset::FromTFRecords(files_).Batch(64).Parse(Spec());
  const Dataset repeated =
      Dataset::FromTFRecords(files_).Shuffle(30, 1).Repeat(3).Batch(64).Parse(
          Spec(), Calls(2));
  std::remove(files_[2].c_str());
  const auto want = Outcomes(ds, Unfused());
  int errors = 0;
  for (const auto& line : want) errors += line.starts_with("error: ");
  ASSERT_EQ(errors, 1);
  EXPECT_EQ(Outcomes(ds, {.threads = 2}), want);
  EXPECT_EQ(Outcomes(ds, {.threads = 1}), want);

  // Under Repeat, the next epoch's first file is opened while this epoch
  // is read (on 2 threads and more): a missing file still fails in each
  // epoch when its turn comes, and a state saved after the error goes on.
  std::remove(files_[0].c_str());
  const auto want_repeated = Outcomes(repeated, Unfused());
  errors = 0;
  for (const auto& line : want_repeated) errors += line.starts_with("error: ");
  ASSERT_EQ(errors, 6);  // two files, three epochs
  for (int threads : {1, 2, 3}) {
    EXPECT_EQ(Outcomes(repeated, {.threads = threads}), want_repeated)
        << threads;
    EXPECT_EQ(Outcomes(repeated, {.threads = threads}, true), want_repeated)
        << threads;
  }
}

// The global shuffle fused: planned by the consumer, read by the parse
// calls.  The same elements, order and origins as stage by stage, with
// shards, epochs, a shuffle above it and Repeat; the uncompressed files
// only (GZIP cannot be indexed).
TEST_F(BatchParseFusionTest, GlobalShuffleGivesTheElementsOfTheStages) {
  const std::vector<std::string> files(files_.begin(), files_.begin() + 3);
  auto global = [&](int64_t epochs, int64_t shards, int64_t index) {
    GlobalShuffleOptions o;
    o.seed = 17;
    o.num_epochs = epochs;
    o.num_shards = shards;
    o.shard_index = index;
    return Dataset::FromTFRecordsGlobalShuffle(files, o);
  };
  const std::vector<std::pair<std::string, std::function<Dataset()>>> cases = {
      {"global", [&] { return global(1, 1, 0).Batch(32); }},
      {"two epochs, drop remainder",
       [&] { return global(2, 1, 0).Batch(50, true); }},
      {"shard 1 of 3", [&] { return global(1, 3, 1).Batch(16); }},
      {"repeat", [&] { return global(1, 1, 0).Repeat(2).Batch(40); }},
      {"then a shuffle",
       [&] { return global(1, 1, 0).Shuffle(64, 5).Batch(20); }},
      {"a skip, a shard and a take of its records (dropped unread)",
       [&] {
         return global(2, 1, 0).Skip(20).Shard(3, 1).Take(150).Batch(16);
       }},
  };
  for (const auto& [what, make] : cases) {
    for (int calls : {1, 3, kAutotune}) {
      ExpectSameAsUnfused(make().Parse(Spec(), Calls(calls)),
                          fmt::format("{}, {} calls", what, calls));
    }
  }
}

TEST_F(BatchParseFusionTest, GlobalShuffleIsFusedOverUncompressedFilesOnly) {
  auto read_parallelism = [](const Dataset& ds) {
    Iterator it = ds.MakeIterator({.threads = 3});
    Element e;
    it.Next(&e);
    for (const auto& s : it.Stats()) {
      if (s.name == "global_shuffle") return s.parallelism;
    }
    return 0;
  };
  const std::vector<std::string> plain(files_.begin(), files_.begin() + 3);
  // Fused, the parse calls read.
  EXPECT_EQ(read_parallelism(
                Dataset::FromTFRecordsGlobalShuffle(plain).Batch(8).Parse(
                    Spec(), Calls(3))),
            3);
  // A ZSTD file is decoded by a reader that caches frames: stage by stage.
  std::vector<std::string> recs;
  for (int i = 0; i < 30; ++i) recs.push_back(MakeExample(5, i));
  std::vector<std::string> with_zstd = plain;
  with_zstd.push_back(dir_.File("z.tfrecord.zst"));
  testing::WriteRecords(with_zstd.back(), recs, records::Compression::kZstd);
  const Dataset zstd =
      Dataset::FromTFRecordsGlobalShuffle(with_zstd).Batch(8).Parse(Spec(),
                                                                    Calls(3));
  EXPECT_EQ(read_parallelism(zstd), 1);
  EXPECT_EQ(Collect(zstd, {.threads = 3}).size(),
            (150u + 187 + 224 + 30 + 7) / 8);
}

// Saved with unread records pending (a batch only partly planned) and
// restored at other thread counts: the rest of the stream, as planned.
TEST_F(BatchParseFusionTest, GlobalShuffleStatesContinueTheSameStream) {
  const std::vector<std::string> files(files_.begin(), files_.begin() + 3);
  GlobalShuffleOptions o;
  o.seed = 4;
  o.num_epochs = 2;
  const Dataset ds = Dataset::FromTFRecordsGlobalShuffle(files, o)
                         .Shuffle(30, 2)
                         .Batch(24)
                         .Parse(Spec(), Calls(kAutotune));
  const auto all = Collect(ds, Unfused());
  for (size_t k : {size_t{0}, size_t{5}, all.size() / 2, all.size()}) {
    Iterator it = ds.MakeIterator({.threads = 3});
    Element e;
    for (size_t i = 0; i < k; ++i) ASSERT_TRUE(it.Next(&e));
    const std::string state = it.Save();
    ExpectRestoredToContinue(ds, state, all, k);
  }
}

// Fused, the parse calls read the records, so a damaged one fails the
// batch it was planned into (as a bad Example does, and as tf.data's
// map_and_batch fails a batch), with the error the stage gives: file,
// offset, record.  The stream goes on with the next batch.
TEST_F(BatchParseFusionTest, GlobalShuffleDamagedRecordFailsItsBatch) {
  const std::vector<std::string> files(files_.begin(), files_.begin() + 3);
  // Indexed while sound, then damaged (as a disk would).
  for (const auto& f : files) {
    records::WriteIndex(records::IndexPathFor(f), records::BuildIndex(f));
  }
  const uint64_t offset = DamageRecord(files[1], 60);
  GlobalShuffleOptions o;
  o.seed = 3;
  const Dataset ds =
      Dataset::FromTFRecordsGlobalShuffle(files, o).Batch(25).Parse(Spec(),
                                                                    Calls(2));
  auto error_of = [](const std::vector<std::string>& outcomes) {
    for (const auto& line : outcomes) {
      if (line.starts_with("error: ")) return line;
    }
    return std::string();
  };
  const auto unfused = Outcomes(ds, Unfused());
  const std::string want = error_of(unfused);
  ASSERT_NE(want.find(fmt::format("{}: record 60 at byte offset {}", files[1],
                                  offset)),
            std::string::npos)
      << want;
  const size_t good = 150 + 187 + 224 - 1;
  for (int threads : {1, 2, 4}) {
    const auto got = Outcomes(ds, {.threads = threads});
    EXPECT_EQ(error_of(got), want) << threads;
    // Every batch but the failed one: (good + 1) records in batches of 25.
    EXPECT_EQ(got.size(), (good + 1 + 24) / 25) << threads;
  }
  EXPECT_EQ(unfused.size(), (good + 24) / 25 + 1);
}

// deterministic = false: the interleave may take whichever file has a
// record ready; every record still comes once, each file's in its order,
// and a state saved midway continues without a record lost or repeated.
TEST_F(BatchParseFusionTest, NondeterministicReadsLoseAndRepeatNothing) {
  for (int calls : {kAutotune, 1}) {
    SCOPED_TRACE(fmt::format("{} calls", calls));
    NondeterministicReadsLoseAndRepeatNothingWith(calls);
  }
}
void BatchParseFusionTest::NondeterministicReadsLoseAndRepeatNothingWith(
    int calls) {
  TFRecordOptions o;
  o.num_parallel_reads = 3;
  o.deterministic = false;
  const Dataset ds =
      Dataset::FromTFRecords(files_, o).Batch(16).Parse(Spec(), Calls(calls));
  auto labels_of = [](const Element& e, std::vector<int64_t>* out) {
    const Tensor& t = e["label"];
    for (int64_t i = 0; i < t.num_rows(); ++i) {
      out->push_back(t.data<int64_t>()[i]);
    }
  };
  auto expect_each_once_in_file_order = [&](const std::vector<int64_t>& got,
                                            const std::string& what) {
    std::vector<int64_t> want;
    for (int f = 0; f < 4; ++f) {
      for (int i = 0; i < RecordsInFile(f); ++i) want.push_back(f * 1000 + i);
    }
    std::vector<int64_t> sorted = got;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, want) << what;
    std::map<int64_t, int64_t> last;  // file -> last label seen
    for (int64_t label : got) {
      const int64_t file = label / 1000;
      if (last.count(file)) {
        EXPECT_LT(last[file], label) << what;
      }
      last[file] = label;
    }
  };
  for (int threads : {1, 4}) {
    std::vector<int64_t> got;
    for (const Element& e : Collect(ds, {.threads = threads})) {
      labels_of(e, &got);
    }
    expect_each_once_in_file_order(got, fmt::format("threads {}", threads));
  }
  for (int k : {3, 20}) {
    std::vector<int64_t> got;
    Iterator it = ds.MakeIterator({.threads = 4});
    Element e;
    for (int i = 0; i < k; ++i) {
      ASSERT_TRUE(it.Next(&e));
      labels_of(e, &got);
    }
    const std::string state = it.Save();
    Iterator restored = ds.MakeIterator({.threads = 2});
    restored.Restore(state);
    while (restored.Next(&e)) labels_of(e, &got);
    expect_each_once_in_file_order(got, fmt::format("restored after {}", k));
  }
}

// Each file shuffled and the interleave taking whichever file has a record
// read: each file's records come in its own shuffled order (which does
// not depend on the interleave), each once, also across a saved state.
TEST_F(BatchParseFusionTest, NondeterministicReadsOfFilesShuffledPerFile) {
  TFRecordOptions o;
  o.num_parallel_reads = 3;
  o.shuffle_buffer_per_file = 25;
  o.seed = 6;
  const auto by_file = [](const std::vector<Element>& batches) {
    std::map<int64_t, std::vector<int64_t>> out;  // file -> its labels
    for (const Element& e : batches) {
      const Tensor& t = e["label"];
      for (int64_t i = 0; i < t.num_rows(); ++i) {
        const int64_t label = t.data<int64_t>()[i];
        out[label / 1000].push_back(label);
      }
    }
    return out;
  };
  const auto want = by_file(Collect(
      Dataset::FromTFRecords(files_, o).Batch(16).Parse(Spec()), Unfused()));
  ASSERT_EQ(want.size(), 4u);
  o.deterministic = false;
  const Dataset ds = Dataset::FromTFRecords(files_, o).Batch(16).Parse(
      Spec(), Calls(kAutotune));
  for (int threads : {1, 4}) {
    EXPECT_EQ(by_file(Collect(ds, {.threads = threads})), want) << threads;
  }
  Iterator it = ds.MakeIterator({.threads = 4});
  std::vector<Element> got(5);
  for (Element& e : got) ASSERT_TRUE(it.Next(&e));
  Iterator restored = ds.MakeIterator({.threads = 2});
  restored.Restore(it.Save());
  for (Element e; restored.Next(&e);) got.push_back(std::move(e));
  EXPECT_EQ(by_file(got), want);
}

// (8 threads: the planner task too, planning or queued as the iterator
// goes.)
TEST_F(BatchParseFusionTest, DestroyingAnIteratorMidStreamStopsItsTasks) {
  const Dataset ds =
      Dataset::FromTFRecords(files_).Shuffle(200, 1).Repeat().Batch(16).Parse(
          Spec(), Calls(4));
  for (int threads : {4, 8}) {
    for (int i = 0; i < 20; ++i) {
      Iterator it = ds.MakeIterator({.threads = threads});
      Element e;
      for (int k = 0; k < i; ++k) ASSERT_TRUE(it.Next(&e));
    }
  }
}

// Files with an index (path.idx) are read by ranges of records, several
// at once, where fewer files are read at once than there are threads
// (FileReader in batch_parse_fusion.cc).  The index says only where ranges
// start; what is delivered must be what reading each file in one piece
// gives, whatever the index says.
class RangeReadTest : public BatchParseFusionTest {
 protected:
  // Files of a few MiB read by ranges (16 MiB and more otherwise).
  void SetUp() override {
    BatchParseFusionTest::SetUp();
    stages::SetMinRangedFileBytes(1);
  }
  void TearDown() override { stages::SetMinRangedFileBytes(0); }

  // Uncompressed files of `n` Examples (~2.5 KB each: ~4 MB, several of the
  // reader's ranges of 512 records or 1 MiB), each with its index.
  std::vector<std::string> IndexedFiles(int files, int n) {
    std::vector<std::string> out;
    for (int f = 0; f < files; ++f) {
      std::vector<std::string> recs;
      for (int i = 0; i < n + 11 * f; ++i) recs.push_back(MakeExample(f, i));
      out.push_back(dir_.File(fmt::format("indexed-{}.tfrecord", f)));
      testing::WriteRecords(out.back(), recs, records::Compression::kNone);
      Index(out.back());
    }
    return out;
  }
  static void Index(const std::string& path) {
    records::WriteIndex(records::IndexPathFor(path), records::BuildIndex(path));
  }
};

TEST_F(RangeReadTest, IndexedFilesAreReadByRangesAsInOnePiece) {
  const std::vector<std::string> files = IndexedFiles(2, 1500);
  TFRecordOptions two;
  two.num_parallel_reads = 2;  // ranges at 4 threads
  // Each file is at least 4 ranges (of 1 MiB), read at 2 and 4 threads
  // (one file at a time) or at 4 (two at once).
  const std::vector<std::tuple<std::string, Dataset, uint64_t>> cases = {
      {"batch", Dataset::FromTFRecords(files).Batch(64), 2 * 2 * 4},
      {"shuffle", Dataset::FromTFRecords(files).Shuffle(300, 2).Batch(50),
       2 * 2 * 4},
      {"repeat", Dataset::FromTFRecords(files).Repeat(2).Batch(100, true),
       2 * 2 * 2 * 4},
      {"two files at once",
       Dataset::FromTFRecords(files, two).Shuffle(100, 3).Batch(40), 2 * 4},
  };
  for (const auto& [what, ds, ranges] : cases) {
    const uint64_t before = stages::FusedRangesRead();
    ExpectSameAsUnfused(ds.Parse(Spec(), Calls(kAutotune)), what);
    EXPECT_GE(stages::FusedRangesRead() - before, ranges) << what;
  }
}

// Below 16 MiB a file is read in one piece, index or not: its reader and
// the next file's already read it ahead on two threads.
TEST_F(RangeReadTest, SmallFilesAreReadInOnePiece) {
  const std::vector<std::string> files = IndexedFiles(2, 1500);
  stages::SetMinRangedFileBytes(0);  // the default
  const Dataset ds =
      Dataset::FromTFRecords(files).Batch(64).Parse(Spec(), Calls(kAutotune));
  const uint64_t before = stages::FusedRangesRead();
  EXPECT_EQ(Collect(ds, {.threads = 4}), Collect(ds, Unfused()));
  EXPECT_EQ(stages::FusedRangesRead(), before);
}

// An index of other records of the same size (the file rewritten since)
// names starts that are not records: the first range does not end where
// the index puts the second, and the file is read in one piece.
TEST_F(RangeReadTest, AStaleIndexChangesNothing) {
  std::vector<std::string> recs;
  for (int i = 0; i < 1800; ++i) recs.push_back(MakeExample(3, i));
  const std::string path = dir_.File("stale.tfrecord");
  testing::WriteRecords(path, recs, records::Compression::kNone);
  Index(path);
  // Replaced by a program that leaves the index be (our writers remove
  // it).
  const auto rewrite = [&] {
    testing::WriteRecords(path + ".new", recs, records::Compression::kNone);
    std::filesystem::rename(path + ".new", path);
  };
  std::reverse(recs.begin(), recs.end());
  rewrite();
  for (const Dataset& ds :
       {Dataset::FromTFRecords({path}).Batch(64),
        Dataset::FromTFRecords({path}).Shuffle(200, 1).Repeat(2).Batch(64)}) {
    ExpectSameAsUnfused(ds.Parse(Spec(), Calls(kAutotune)), "reversed");
  }
  // Shorter records first: the first range's records end before the
  // index's second range starts (and more records after them keep the
  // index within the file).
  std::reverse(recs.begin(), recs.end());
  for (int i = 0; i < 900; ++i) {
    records::ExampleBuilder b;
    b.AddInt64("label", 5000 + i);
    b.AddFloatList("x", std::vector<float>{1.0f, 2.0f, 3.0f});
    b.AddBytes("blob", "short");
    recs[i] = std::string(b.Serialize());
  }
  for (int i = 0; i < 1300; ++i) recs.push_back(MakeExample(6, i));
  rewrite();
  ASSERT_GE(
      testing::ReadFileBytes(path).size(),
      records::ReadIndex(records::IndexPathFor(path)).entries.back().offset);
  ExpectSameAsUnfused(
      Dataset::FromTFRecords({path}).Batch(64).Parse(Spec(), Calls(2)),
      "shorter");
}

// Records appended since the index was made are read in one piece after
// the ranges, and an index that names no record where a restored state
// opens the file is not used.
TEST_F(RangeReadTest, RecordsPastTheIndexAreReadToo) {
  std::vector<std::string> recs;
  for (int i = 0; i < 1300; ++i) recs.push_back(MakeExample(4, i));
  const std::string path = dir_.File("grown.tfrecord");
  testing::WriteRecords(path, recs, records::Compression::kNone);
  Index(path);
  for (int i = 1300; i < 1777; ++i) recs.push_back(MakeExample(4, i));
  testing::WriteRecords(path, recs, records::Compression::kNone);
  const Dataset ds = Dataset::FromTFRecords({path}).Repeat(2).Batch(128).Parse(
      Spec(), Calls(2));
  ExpectSameAsUnfused(ds, "grown");
  EXPECT_EQ(Collect(ds, {.threads = 2}).size(), (2u * 1777 + 127) / 128);
}

// A damaged record is met where reading in one piece meets it: its range
// fails, and the file is read in one piece from that range's start.
TEST_F(RangeReadTest, ADamagedRecordFailsAtItsPlace) {
  const std::vector<std::string> files = IndexedFiles(2, 1500);
  DamageRecord(files[0], 700);  // in the second range
  DamageRecord(files[1], 1400);
  for (int shuffle : {0, 150}) {
    Dataset ds = Dataset::FromTFRecords(files);
    if (shuffle > 0) ds = ds.Shuffle(shuffle, 2);
    ds = ds.Batch(25).Parse(Spec(), Calls(kAutotune));
    const auto want = Outcomes(ds, Unfused());
    int errors = 0;
    for (const auto& line : want) errors += line.starts_with("error: ");
    ASSERT_EQ(errors, 2) << shuffle;
    for (int threads : {2, 4}) {
      EXPECT_EQ(Outcomes(ds, {.threads = threads}), want)
          << "shuffle " << shuffle << " threads " << threads;
      EXPECT_EQ(Outcomes(ds, {.threads = threads}, true),
                Outcomes(ds, Unfused(), true))
          << "shuffle " << shuffle << " threads " << threads;
    }
  }
}

// A state saved inside a range: restored, the file is read in one piece up
// to the next range's start and by ranges from there.
TEST_F(RangeReadTest, RestoredInsideARangeReadsByRangesAgain) {
  const std::vector<std::string> files = IndexedFiles(1, 3000);  // ~7 ranges
  const Dataset ds =
      Dataset::FromTFRecords(files).Batch(50).Parse(Spec(), Calls(kAutotune));
  const auto all = Collect(ds, Unfused());
  ASSERT_EQ(all.size(), 60u);
  for (size_t k : {size_t{9}, size_t{23}}) {
    Iterator it = ds.MakeIterator({.threads = 2});
    Element e;
    for (size_t i = 0; i < k; ++i) ASSERT_TRUE(it.Next(&e));
    const std::string state = it.Save();
    Iterator restored = ds.MakeIterator({.threads = 2});
    restored.Restore(state);
    const uint64_t before = stages::FusedRangesRead();
    for (size_t i = k; i < all.size(); ++i) {
      ASSERT_TRUE(restored.Next(&e)) << k << " " << i;
      ASSERT_EQ(e, all[i]) << k << " " << i;
    }
    EXPECT_FALSE(restored.Next(&e));
    EXPECT_GE(stages::FusedRangesRead() - before, 2u) << k;
  }
}

// An Example of `blob` bytes whose serialized size does not depend on `i`
// (below 1,000,000 records).
std::string FixedExample(int i, size_t blob) {
  records::ExampleBuilder b;
  b.AddInt64("label", 1000000 + i);  // a 3-byte varint for every i
  b.AddFloatList("x", std::vector<float>{1.0f, 2.0f, 3.0f});
  b.AddBytes("blob", std::string(blob, 'f'));
  return std::string(b.Serialize());
}

// Restored inside a range of a file whose index is stale in a way that
// still puts range starts on record boundaries (records of one size, the
// first record now twice as long): reading in one piece up to the next
// range's start lands elsewhere than the index says, and the file is read
// in one piece on (taking the range there would deliver a record twice).
TEST_F(RangeReadTest, RestoredInsideARangeOfAStaleIndex) {
  std::vector<std::string> recs;
  for (int i = 0; i < 2000; ++i) recs.push_back(FixedExample(i, 2000));
  const size_t frame = recs[0].size() + records::kFrameOverhead;
  const std::string path = dir_.File("shifted.tfrecord");
  testing::WriteRecords(path, recs, records::Compression::kNone);
  Index(path);
  size_t blob = 2000;
  while (FixedExample(0, blob).size() + records::kFrameOverhead < 2 * frame) {
    ++blob;
  }
  recs[0] = FixedExample(0, blob);
  ASSERT_EQ(recs[0].size() + records::kFrameOverhead, 2 * frame);
  testing::WriteRecords(path, recs, records::Compression::kNone);
  const Dataset ds =
      Dataset::FromTFRecords({path}).Batch(50).Parse(Spec(), Calls(kAutotune));
  const auto all = Collect(ds, Unfused());
  ASSERT_EQ(all.size(), 40u);
  Iterator it = ds.MakeIterator({.threads = 2});
  Element e;
  for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(it.Next(&e));
  ExpectRestoredToContinue(ds, it.Save(), all, 3);
}

// deterministic = false over files read by ranges: each record once, each
// file's in its order.
TEST_F(RangeReadTest, NondeterministicReadsLoseAndRepeatNothing) {
  const std::vector<std::string> files = IndexedFiles(2, 1500);
  TFRecordOptions o;
  o.num_parallel_reads = 2;
  o.deterministic = false;
  const Dataset ds = Dataset::FromTFRecords(files, o).Batch(32).Parse(
      Spec(), Calls(kAutotune));
  // (file, record) of every row, in the order delivered.
  auto rows = [](const std::vector<Element>& batches) {
    std::vector<std::pair<int, int64_t>> out;
    for (const Element& e : batches) {
      for (int64_t r = 0; r < e["label"].num_rows(); ++r) {
        const int f = static_cast<int>(e["x"].data<float>()[3 * r + 1] / 2);
        out.emplace_back(f, e["label"].data<int64_t>()[r] - 1000 * f);
      }
    }
    return out;
  };
  auto want = rows(Collect(ds, Unfused()));
  std::sort(want.begin(), want.end());
  const uint64_t before = stages::FusedRangesRead();
  const auto got = rows(Collect(ds, {.threads = 4}));
  EXPECT_GT(stages::FusedRangesRead(), before);
  std::map<int, int64_t> last;
  for (const auto& [f, i] : got) {
    if (last.count(f)) {
      EXPECT_EQ(i, last[f] + 1) << "file " << f;
    }
    last[f] = i;
  }
  auto sorted = got;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, want);
}

// States saved between and inside ranges (and while ranges ahead are
// being read) continue the same stream at 1 and 2 threads.
TEST_F(RangeReadTest, SavedStatesContinueTheSameStream) {
  const std::vector<std::string> files = IndexedFiles(2, 1500);
  SavedStatesContinue(Dataset::FromTFRecords(files).Repeat(2).Batch(90).Parse(
      Spec(), Calls(3)));
  SavedStatesContinue(
      Dataset::FromTFRecords(files).Shuffle(400, 5).Batch(64).Parse(
          Spec(), Calls(kAutotune)));
}

// One file of `n` Examples {label: i, blob: `blob` bytes of 'a' + i % 26}
// for the memory tests, its spec, and a frame's bytes.
struct LabelledBlobs {
  LabelledBlobs(testing::TempDir& dir, int n, size_t blob)
      : file(dir.File("big.tfrecord")),
        spec(records::FeatureSpec::FromJsonText(R"({"features": {
          "label": {"kind": "fixed", "dtype": "int64", "shape": []},
          "blob": {"kind": "fixed", "dtype": "bytes", "shape": []}}})")) {
    std::vector<std::string> recs;
    for (int i = 0; i < n; ++i) {
      records::ExampleBuilder b;
      b.AddInt64("label", i);
      b.AddBytes("blob", std::string(blob, static_cast<char>('a' + i % 26)));
      recs.push_back(std::string(b.Serialize()));
    }
    testing::WriteRecords(file, recs);
    frame_bytes = recs[0].size() + 16;
  }
  std::string file;
  records::FeatureSpec spec;
  uint64_t frame_bytes = 0;
};

// A shuffle buffer's records view the read blocks, which the chunks of
// views that the readers made hold; a record buffered for three buffer
// lengths is copied out and its ref moved to a chunk of the shuffle's own,
// so that a reader's chunk goes once none of its records is buffered.  So
// the blocks in use stay within a few buffers' worth of records however
// long the run: here 30 buffer lengths of ~1 KB records through a buffer
// of 2,000 (2 MB) came to at most 3.7 buffers' worth at one thread and 5.7
// at two (more read ahead), as many as when each view held its block; with
// the copies left in their chunks, each chunk stays until its last record
// is drawn: 8.1 and 10.0.
TEST(BatchParseFusionMemoryTest, ShuffledBlocksStayWithinAFewBuffersOfRecords) {
  testing::TempDir dir;
  const LabelledBlobs data(dir, 4000, 1000);
  const std::string& file = data.file;
  const records::FeatureSpec& spec = data.spec;
  constexpr int64_t kBuffer = 2000;
  const uint64_t buffer_bytes = kBuffer * data.frame_bytes;
  for (int threads : {1, 2}) {
    const Dataset ds = Dataset::FromTFRecords({file})
                           .Repeat(15)
                           .Shuffle(kBuffer, 7)
                           .Batch(100)
                           .Parse(spec, Calls(threads));
    const uint64_t before = BlockBytesInUse();
    uint64_t most = 0;
    int64_t rows = 0;
    std::set<int64_t> labels;
    Iterator it = ds.MakeIterator({.threads = threads});
    Element e;
    while (it.Next(&e)) {
      most = std::max(most, BlockBytesInUse() - before);
      rows += e["label"].num_rows();
      for (int64_t r = 0; r < e["label"].num_rows(); ++r) {
        const int64_t label = e["label"].data<int64_t>()[r];
        ASSERT_EQ(e["blob"].bytes(r),
                  std::string(1000, static_cast<char>('a' + label % 26)));
        labels.insert(label);
      }
    }
    EXPECT_EQ(rows, 15 * 4000) << threads;
    EXPECT_EQ(labels.size(), 4000u) << threads;
    EXPECT_LT(most, 7 * buffer_bytes)
        << "threads " << threads << ": "
        << static_cast<double>(most) / static_cast<double>(buffer_bytes)
        << " buffers' worth of blocks";
  }
}

// Skipped records go as they are read: a Skip over most of a file, or a
// Shard of a twentieth of it, holds a few chunks of its blocks at a time
// (those of the records kept in the batches in flight), not every record
// it dropped (19 MB of them here).
TEST(BatchParseFusionMemoryTest, SkippedRecordsDoNotHoldTheirBlocks) {
  testing::TempDir dir;
  const LabelledBlobs data(dir, 20000, 1000);
  const Dataset source = Dataset::FromTFRecords({data.file});
  for (int threads : {1, 2}) {
    for (int shard : {0, 1}) {
      const Dataset ds = (shard == 1 ? source.Shard(20, 3) : source.Skip(19000))
                             .Batch(10)
                             .Parse(data.spec, Calls(threads));
      const uint64_t before = BlockBytesInUse();
      uint64_t most = 0;
      int64_t rows = 0;
      Iterator it = ds.MakeIterator({.threads = threads});
      Element e;
      while (it.Next(&e)) {
        most = std::max(most, BlockBytesInUse() - before);
        EXPECT_EQ(e["label"].data<int64_t>()[0],
                  shard == 1 ? 3 + 20 * rows : 19000 + rows);
        rows += e["label"].num_rows();
      }
      EXPECT_EQ(rows, 1000) << threads << " shard " << shard;
      EXPECT_LT(most, 4000 * data.frame_bytes)
          << "threads " << threads << " shard " << shard << ": blocks of "
          << static_cast<double>(most) / static_cast<double>(data.frame_bytes)
          << " records";
    }
  }
}

// Each file shuffled in its reader: a view holds its read block, and a
// record buffered for three buffer lengths is copied out of its block, so
// the blocks in use stay within a few buffers' worth over a file of 40
// (short records, ~430 to a 128 KiB block: a block waits for the last of
// them), fused and stage by stage: 3.7 buffers' worth stage by stage and
// 6.3 fused (read ahead and in flight too); without the copies, 8.2 and
// 10.4.
TEST(BatchParseFusionMemoryTest, BlocksOfAShuffleBufferPerFileGoWhenDrawn) {
  testing::TempDir dir;
  const LabelledBlobs data(dir, 40000, 300);
  const std::string& file = data.file;
  const records::FeatureSpec& spec = data.spec;
  constexpr int64_t kBuffer = 1000;
  const uint64_t buffer_bytes = kBuffer * data.frame_bytes;
  TFRecordOptions o;
  o.shuffle_buffer_per_file = kBuffer;
  o.seed = 3;
  const Dataset ds =
      Dataset::FromTFRecords({file}, o).Batch(100).Parse(spec, Calls(2));
  for (IteratorOptions io : {Unfused(), IteratorOptions{.threads = 1},
                             IteratorOptions{.threads = 2}}) {
    const uint64_t before = BlockBytesInUse();
    uint64_t most = 0;
    std::set<int64_t> labels;
    Iterator it = ds.MakeIterator(io);
    Element e;
    while (it.Next(&e)) {
      most = std::max(most, BlockBytesInUse() - before);
      for (int64_t r = 0; r < e["label"].num_rows(); ++r) {
        const int64_t label = e["label"].data<int64_t>()[r];
        ASSERT_EQ(e["blob"].bytes(r),
                  std::string(300, static_cast<char>('a' + label % 26)));
        labels.insert(label);
      }
    }
    EXPECT_EQ(labels.size(), 40000u);
    EXPECT_LT(most, 8 * buffer_bytes)
        << "threads " << io.threads << ": "
        << static_cast<double>(most) / static_cast<double>(buffer_bytes)
        << " buffers' worth of blocks";
  }
}

// Every batch in flight gives its buffers back for a later batch to be
// parsed into: with 16 parse calls a fused stage has 33 batches planned
// ahead, and when only 4 batches' buffers could wait for reuse, about half
// of them were freed as they came back (each an allocation again for a
// later batch; 2,865-3,316 of 6,250 here, and 4,211-4,394 stage by stage).
// The hold is the iterator's: a second iterator after the first reuses as
// well, and so does a Parse run stage by stage (a parallel Map, 64 batches
// buffered); once no iterator is left, batches kept longer are freed.
// None at all is freed while an iterator runs: a batch parsed when more
// tasks than ever before parse at once has a new shell, and that shell is
// shaped for the spec to take buffers given back (unshaped, its buffers
// were new, and 5-40 were freed later in 5 of 8 runs under ASan).
TEST(BatchParseFusionMemoryTest, BatchBuffersInFlightAreReusedNotFreed) {
  testing::TempDir dir;
  const std::string file = dir.File("examples.tfrecord");
  std::vector<std::string> recs;
  for (int i = 0; i < 2000; ++i) recs.push_back(MakeExample(0, i));
  testing::WriteRecords(file, recs);
  const Dataset ds = Dataset::FromTFRecords({file}).Repeat(10).Batch(16).Parse(
      Spec(), Calls(16));
  // A batch's buffers: label, x, the tokens' values and row lengths, blob.
  constexpr uint64_t kBuffers = 5;
  // Two fused passes, then the stage by stage path (a parallel Map).
  for (int pass = 0; pass < 3; ++pass) {
    Iterator it = ds.MakeIterator({.threads = 16, .optimize = pass < 2});
    Element e;
    int64_t batches = 0;
    const uint64_t before = stages::ParsedBuffersFreed();
    while (it.Next(&e)) {
      ++batches;
      const int64_t rows = e["label"].num_rows();
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t label = e["label"].data<int64_t>()[r];
        ASSERT_EQ(e["x"].data<float>()[3 * r], static_cast<float>(label));
      }
    }
    const uint64_t freed = stages::ParsedBuffersFreed() - before;
    EXPECT_EQ(batches, 10 * 2000 / 16);
    // The consumer holds one batch, which the hold counts.
    EXPECT_EQ(freed, 0u) << "pass " << pass << ": " << freed << " of "
                         << kBuffers * batches << " batch buffers freed";
  }
  // With no iterator left holding, only a few batches' buffers wait for
  // reuse: batches kept past their iterator are freed as they go.
  std::vector<Element> kept = Collect(ds, {.threads = 16});
  ASSERT_EQ(kept.size(), 10u * 2000 / 16);
  const uint64_t before = stages::ParsedBuffersFreed();
  kept.clear();
  EXPECT_GT(stages::ParsedBuffersFreed() - before, kBuffers * (1250 - 10));
}

// A batch is parsed into the buffers its own thread filled last, where
// some wait for reuse: their lines may still be in that thread's cache,
// where another thread's are in that thread's (the newest buffer given
// back is another thread's here, so plain last-in-first-out would lend it).
TEST(BatchParseFusionMemoryTest, AThreadParsesIntoTheBuffersItFilledLast) {
  std::shared_ptr<const stages::ParseInfo> info =
      stages::MakeParseInfo(Spec(), {});
  std::vector<std::string> recs;
  for (int i = 0; i < 8; ++i) recs.push_back(MakeExample(0, i));
  const std::vector<std::string_view> serialized(recs.begin(), recs.end());
  const auto parse = [&] {
    Element e;
    stages::ParseRecords(*info, serialized, /*batched=*/true, &e);
    return e;
  };
  const auto x = [](const Element& e) { return e["x"].data<float>(); };
  Element mine = parse();
  Element theirs;
  std::thread([&] { theirs = parse(); }).join();
  const float* mine_x = x(mine);
  const float* theirs_x = x(theirs);
  ASSERT_NE(mine_x, theirs_x);
  mine = Element{};
  theirs = Element{};  // the newest given back
  const Element again = parse();
  EXPECT_EQ(x(again), mine_x);
  EXPECT_EQ(again["label"].data<int64_t>()[5], 5);
  // A thread that filled none takes the newest.
  Element other;
  std::thread([&] { other = parse(); }).join();
  EXPECT_EQ(x(other), theirs_x);
}

}  // namespace
}  // namespace recflow::pipeline
