// convert/convert.cc: the sharded job: order and balance across shards,
// indexes, progress, skipping bad rows, and all shards or none.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "convert/sources.h"
#include "convert_test_util.h"
#include "records/example_builder.h"
#include "records/index.h"
#include "records/io_faults.h"

namespace recflow::convert {
namespace {

using testing::Get;
using testing::ShardExamples;

std::string Csv(int rows, int bad_row = -1) {
  std::string csv = "id,v\n";
  for (int i = 0; i < rows; ++i) {
    csv += i == bad_row
               ? std::to_string(i) + "\n"
               : std::to_string(i) + "," + std::to_string(i * 2) + "\n";
  }
  return csv;
}

TEST(ConvertJobTest, ShardsHoldEveryRowInOrderWithTheirIndexes) {
  testing::TempDir dir;
  testing::WriteFileBytes(dir.File("in.csv"), Csv(2000));
  ConvertJob job;
  job.format = "csv";
  job.inputs.files = {dir.File("in.csv")};
  job.output = dir.File("out/part");
  std::filesystem::create_directories(dir.File("out"));
  job.shards = 3;
  job.writer.build_index = true;
  ConvertProgress last;
  uint64_t calls = 0;
  job.progress = [&](const ConvertProgress& p) {
    EXPECT_GT(p.records, last.records);
    EXPECT_GT(p.bytes_read, last.bytes_read);
    EXPECT_LE(p.bytes_read, p.total_bytes);
    last = p;
    ++calls;
  };
  const ConvertSummary s = Convert(job);
  EXPECT_EQ(s.records, 2000u);
  EXPECT_EQ(last.records, 2000u);
  // The last chunk was read to the end of the input.
  EXPECT_EQ(last.total_bytes, Csv(2000).size());
  EXPECT_EQ(last.bytes_read, last.total_bytes);
  EXPECT_GT(calls, 1u);
  ASSERT_EQ(s.shards.size(), 3u);
  EXPECT_EQ(s.shards[1].path, dir.File("out/part-00001-of-00003.tfrecord"));
  uint64_t records = 0, bytes = 0;
  for (const auto& shard : s.shards) {
    // Chunks of 256 rows go round-robin: shards within one chunk.
    EXPECT_NEAR(static_cast<double>(shard.records), 2000.0 / 3, 256);
    EXPECT_EQ(
        records::ReadIndex(records::IndexPathFor(shard.path)).entries.size(),
        shard.records);
    records += shard.records;
    bytes += shard.bytes;
  }
  EXPECT_EQ(records, 2000u);
  EXPECT_EQ(bytes, s.bytes);
  // Within a shard, input order; chunk j in shard j mod 3.
  const auto ex = ShardExamples(s);
  int64_t prev = -1;
  for (size_t i = 0; i < s.shards[0].records; ++i) {
    const int64_t id = Get(ex[i], "id")->int64_list().value(0);
    EXPECT_GT(id, prev);
    prev = id;
    EXPECT_EQ(id / 256 % 3, 0) << id;
  }
}

// A source whose reading is slow, and that counts any look at its progress
// while it is reading a row: the job reads on while it hands earlier
// chunks to the writers, so a look from there would race the reading.
class SlowSource final : public ExampleSource {
 public:
  // `looks_while_reading` outlives the source, which the job owns.
  SlowSource(uint64_t rows, std::atomic<int>* looks_while_reading)
      : rows_(rows), looks_while_reading_(looks_while_reading) {}
  bool NextRow(Row* row) override {
    reading_ = true;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    const bool more = done_ < rows_;
    if (more) {
      row->fields = {std::to_string(done_)};
      ++done_;
    }
    reading_ = false;
    return more;
  }
  // As slow, on the building threads: while one builds a chunk, another
  // reads the next.
  void Build(const Row& row, records::ExampleBuilder* b) const override {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    b->AddInt64("id", std::stoll(row.fields[0]));
  }
  uint64_t bytes_read() const override {
    if (reading_) ++*looks_while_reading_;
    return done_ * 10;
  }
  uint64_t total_bytes() const override { return rows_ * 10; }

 private:
  const uint64_t rows_;
  std::atomic<int>* const looks_while_reading_;
  std::atomic<bool> reading_{false};
  std::atomic<uint64_t> done_{0};
};

TEST(ConvertJobTest, ProgressIsTakenWhereTheSourceIsRead) {
  testing::TempDir dir;
  ConvertJob job;
  job.output = dir.File("part");
  job.shards = 2;
  std::vector<ConvertProgress> reports;
  job.progress = [&](const ConvertProgress& p) { reports.push_back(p); };
  std::atomic<int> looks_while_reading{0};
  const ConvertSummary s = ConvertSource(
      job, std::make_unique<SlowSource>(3000, &looks_while_reading));
  EXPECT_EQ(s.records, 3000u);
  EXPECT_EQ(looks_while_reading, 0);
  // A report per chunk of 256 rows, each of the rows read by then.
  ASSERT_EQ(reports.size(), 12u);
  for (size_t i = 0; i < reports.size(); ++i) {
    const uint64_t rows = std::min<uint64_t>(3000, (i + 1) * 256);
    EXPECT_EQ(reports[i].records, rows);
    EXPECT_EQ(reports[i].bytes_read, rows * 10) << i;
    EXPECT_EQ(reports[i].total_bytes, 30000u);
  }
}

// ZSTD shards compressed a frame per thread: the same files, with their
// indexes, whatever the number of compression threads (0: the cores the
// writer threads leave).
// The summary's seconds are the whole conversion's, the source's opening
// included: for JSON Lines (and CSV) that is a pass over every row to type
// the keys, near half the time, which a rate computed without it doubled.
// Only a function call lies between the clocks read here and in Convert().
TEST(ConvertJobTest, SecondsCountTheTypingPass) {
  testing::TempDir dir;
  std::string jsonl;
  for (int i = 0; i < 30000; ++i) {
    jsonl += fmt::format("{{\"id\": {}, \"v\": [{}, 2.5], \"s\": \"r{}\"}}\n",
                         i, i, i);
  }
  testing::WriteFileBytes(dir.File("in.jsonl"), jsonl);
  ConvertJob job;
  job.format = "jsonl";
  job.inputs.files = {dir.File("in.jsonl")};
  job.output = dir.File("part");
  const auto start = std::chrono::steady_clock::now();
  const ConvertSummary s = Convert(job);
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  EXPECT_EQ(s.records, 30000u);
  EXPECT_LE(s.seconds, wall);
  EXPECT_GE(s.seconds, 0.95 * wall) << wall;
}

// CSV and JSON Lines read every row to type the columns before converting
// any: that pass is reported first (typing), every 4096 rows, its bytes
// counted across files, then the conversion's reports count from 0.
TEST(ConvertJobTest, TheTypingPassIsReportedFirst) {
  testing::TempDir dir;
  const std::string a = Csv(5000), b = Csv(4000);
  testing::WriteFileBytes(dir.File("a.csv"), a);
  testing::WriteFileBytes(dir.File("b.csv"), b);
  std::string jsonl;
  for (int i = 0; i < 9000; ++i) jsonl += fmt::format("{{\"id\": {}}}\n", i);
  testing::WriteFileBytes(dir.File("c.jsonl"), jsonl);
  for (const std::string format : {"csv", "jsonl"}) {
    SCOPED_TRACE(format);
    ConvertJob job;
    job.format = format;
    job.inputs.files =
        format == "csv"
            ? std::vector<std::string>{dir.File("a.csv"), dir.File("b.csv")}
            : std::vector<std::string>{dir.File("c.jsonl")};
    job.output = dir.File(format);
    std::vector<ConvertProgress> reports;
    job.progress = [&](const ConvertProgress& p) { reports.push_back(p); };
    EXPECT_EQ(Convert(job).records, 9000u);
    const uint64_t total = format == "csv" ? a.size() + b.size() : jsonl.size();
    ASSERT_GE(reports.size(), 3u);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_TRUE(reports[i].typing) << i;
      EXPECT_EQ(reports[i].records, 4096 * (i + 1)) << i;
      EXPECT_EQ(reports[i].total_bytes, total);
    }
    // A reader reads ahead of its rows, but not past the end.
    EXPECT_LT(reports[0].bytes_read, reports[1].bytes_read);
    EXPECT_LE(reports[1].bytes_read, total);
    // 8192 rows are past a.csv's 5000: its bytes are counted in.
    if (format == "csv") {
      EXPECT_GT(reports[1].bytes_read, a.size());
    }
    EXPECT_FALSE(reports[2].typing);
    EXPECT_EQ(reports[2].records, 256u);
    EXPECT_FALSE(reports.back().typing);
    EXPECT_EQ(reports.back().records, 9000u);
  }
}

// A typing report that throws (Python's Ctrl-C does) ends the typing
// pass there, its exception leaving OpenSource as thrown, with no further
// report; JSON Lines types its lines on every core meanwhile.
TEST(ConvertJobTest, AnExceptionFromATypingReportEndsThePass) {
  testing::TempDir dir;
  testing::WriteFileBytes(dir.File("a.csv"), Csv(50000));
  std::string jsonl;
  for (int i = 0; i < 50000; ++i) jsonl += fmt::format("{{\"id\": {}}}\n", i);
  testing::WriteFileBytes(dir.File("a.jsonl"), jsonl);
  struct Stop {
    uint64_t rows;
  };
  for (const std::string format : {"csv", "jsonl"}) {
    SCOPED_TRACE(format);
    int reports = 0;
    try {
      OpenSource(format, {.files = {dir.File("a." + format)}},
                 [&](const ConvertProgress& p) {
                   if (++reports == 3) throw Stop{p.records};
                 });
      ADD_FAILURE() << "the pass ran to its end";
    } catch (const Stop& stop) {
      EXPECT_EQ(stop.rows, 3u * 4096);
    }
    EXPECT_EQ(reports, 3);
  }
}

// Chunks of rows are reused once handed to the writers, their rows read
// into again: over many chunks' worth of rows that differ (cells long and
// short, present and empty, a row of too few fields now and then, two
// files), every Example holds its own row's values and nothing of the row
// read into its place before, and every bad row is the one skipped, named
// at its own file and line.
TEST(ConvertJobTest, ReusedRowsCarryNothingOver) {
  testing::TempDir dir;
  std::mt19937_64 rng(3);
  constexpr int kRows = 12000;  // per file: many rings of 16 chunks of 256
  struct Want {
    std::string a;  // "" : absent
    int64_t n;
  };
  std::vector<Want> want;
  std::vector<std::string> files, bad;
  for (int f = 0; f < 2; ++f) {
    files.push_back(dir.File(fmt::format("in{}.csv", f)));
    std::string csv = "a,n\n";
    for (int i = 0; i < kRows; ++i) {
      if (rng() % 97 == 0) {
        csv += "short\n";  // one field: a bad row
        bad.push_back(fmt::format("{}:{}:", files.back(), i + 2));
        continue;
      }
      std::string a;
      if (rng() % 3 != 0) a = std::string(rng() % 40, 'x') + std::to_string(i);
      const int64_t n = static_cast<int64_t>(rng() % 1000);
      csv += fmt::format("{},{}\n", a, n);
      want.push_back({a, n});
    }
    testing::WriteFileBytes(files.back(), csv);
  }
  ConvertJob job;
  job.format = "csv";
  job.inputs.files = files;
  job.output = dir.File("part");
  job.shards = 1;
  job.skip_bad = true;
  const ConvertSummary s = Convert(job);
  EXPECT_EQ(s.records, want.size());
  EXPECT_EQ(s.skipped, bad.size());
  EXPECT_EQ(s.first_skipped.rfind(bad[0], 0), 0u) << s.first_skipped;
  const auto ex = ShardExamples(s);
  ASSERT_EQ(ex.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const auto* a = Get(ex[i], "a");
    ASSERT_EQ(a == nullptr, want[i].a.empty()) << i;
    if (a != nullptr) {
      ASSERT_EQ(a->bytes_list().value(0), want[i].a) << i;
    }
    ASSERT_EQ(Get(ex[i], "n")->int64_list().value(0), want[i].n) << i;
  }
  // Unskipped, the first bad row stops the job, named where it is.
  job.skip_bad = false;
  try {
    Convert(job);
    ADD_FAILURE() << "a bad row was converted";
  } catch (const ConvertError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(bad[0], 0), 0u) << e.what();
  }
}

TEST(ConvertJobTest, ZstdShardsDoNotDependOnCompressionThreads) {
  testing::TempDir dir;
  testing::WriteFileBytes(dir.File("in.csv"), Csv(20000));
  std::vector<std::string> first;
  for (int threads : {1, 3, 0}) {
    ConvertJob job;
    job.format = "csv";
    job.inputs.files = {dir.File("in.csv")};
    job.output = dir.File("t" + std::to_string(threads) + "/part");
    job.shards = 2;
    job.writer.compression = records::Compression::kZstd;
    job.writer.zstd_frame_bytes = 16 << 10;  // many frames per shard
    job.writer.build_index = true;
    job.compression_threads = threads;
    const ConvertSummary s = Convert(job);
    ASSERT_EQ(s.records, 20000u);
    std::vector<std::string> files;
    for (const auto& shard : s.shards) {
      files.push_back(testing::ReadFileBytes(shard.path));
      files.push_back(
          testing::ReadFileBytes(records::IndexPathFor(shard.path)));
    }
    if (first.empty()) {
      first = files;
    } else {
      EXPECT_TRUE(files == first) << "compression_threads " << threads;
    }
  }
}

TEST(ConvertJobTest, ABadRowLeavesNoShardUnlessSkipped) {
  testing::TempDir dir;
  testing::WriteFileBytes(dir.File("in.csv"), Csv(1000, 700));
  ConvertJob job;
  job.format = "csv";
  job.inputs.files = {dir.File("in.csv")};
  job.output = dir.File("part");
  job.shards = 2;
  EXPECT_EQ(testing::ConvertErrorOf([&] { Convert(job); }),
            dir.File("in.csv") + ":702: 1 fields, the header has 2");
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().filename().string(), "in.csv");  // nothing else
  }
  job.skip_bad = true;
  const ConvertSummary s = Convert(job);
  EXPECT_EQ(s.records, 999u);
  EXPECT_EQ(s.skipped, 1u);
  EXPECT_EQ(s.first_skipped,
            dir.File("in.csv") + ":702: 1 fields, the header has 2");
  EXPECT_EQ(ShardExamples(s).size(), 999u);
}

// in.csv (id,s; its row 2 on line 3) and in.jsonl (key s; line 2): three
// rows, the second's s `big`.
void WriteRowsWithALongSecond(const testing::TempDir& dir,
                              const std::string& big) {
  testing::WriteFileBytes(dir.File("in.csv"),
                          "id,s\n1,a\n2," + big + "\n3,b\n");
  testing::WriteFileBytes(
      dir.File("in.jsonl"),
      "{\"s\": \"a\"}\n{\"s\": \"" + big + "\"}\n{\"s\": \"b\"}\n");
}

// A row whose record would be longer than max_record_bytes (by default 2
// GiB: protobuf's limit, and the readers') is a bad row naming the row,
// in every format: an error, or skipped with skip_bad; never written.
TEST(ConvertJobTest, ARecordPastMaxRecordBytesIsABadRowInEveryFormat) {
  testing::TempDir dir;
  const std::string big(600, 'x');
  WriteRowsWithALongSecond(dir, big);
  // Arrays and IDX images: every row is as long (3 rows).
  testing::WriteFileBytes(
      dir.File("x.npy"),
      testing::NpyBytes("<f4", "(3, 200)", std::string(3 * 200 * 4, '\0')));
  testing::WriteFileBytes(dir.File("images"),
                          testing::Be32(0x803) + testing::Be32(3) +
                              testing::Be32(20) + testing::Be32(30) +
                              std::string(3 * 600, '\1'));
  testing::WriteFileBytes(
      dir.File("labels"),
      testing::Be32(0x801) + testing::Be32(3) + std::string(3, '\2'));
  std::filesystem::create_directories(dir.File("imgs/a"));
  testing::WriteFileBytes(dir.File("imgs/a/1.png"), testing::TinyPng());
  testing::WriteFileBytes(dir.File("imgs/a/2.png"), testing::TinyPng() + big);
  testing::WriteFileBytes(dir.File("imgs/a/3.jpg"), testing::TinyJpeg());
  struct Case {
    std::string format;
    ConvertInputs inputs;
    std::string where;  // the long row
    uint64_t good;      // rows under the limit
  };
  const std::vector<Case> cases = {
      {"csv", {.files = {dir.File("in.csv")}}, dir.File("in.csv") + ":3", 2},
      {"jsonl",
       {.files = {dir.File("in.jsonl")}},
       dir.File("in.jsonl") + ":2",
       2},
      {"npy", {.files = {dir.File("x.npy")}}, dir.File("x.npy") + ": row 0", 0},
      {"idx",
       {.images = dir.File("images"), .labels = dir.File("labels")},
       dir.File("images") + ": image 0",
       0},
      {"images", {.files = {dir.File("imgs")}}, dir.File("imgs/a/2.png"), 2},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.format);
    ConvertJob job;
    job.format = c.format;
    job.inputs = c.inputs;
    job.output = dir.File("out");
    EXPECT_EQ(Convert(job).records, 3u);  // under the default
    job.max_record_bytes = 500;
    const std::string error = testing::ConvertErrorOf([&] { Convert(job); });
    EXPECT_EQ(error.rfind(c.where + ": its record is ", 0), 0u) << error;
    EXPECT_NE(error.find(" bytes, more than the 500 a record may have "
                         "(protobuf parses no tf.train.Example of 2 GiB or "
                         "more, and readers refuse longer records)"),
              std::string::npos)
        << error;
    job.skip_bad = true;
    const ConvertSummary s = Convert(job);
    EXPECT_EQ(s.records, c.good);
    EXPECT_EQ(s.skipped, 3 - c.good);
    EXPECT_EQ(s.first_skipped, error);
    for (const auto& ex : ShardExamples(s)) {
      EXPECT_LE(ex.ByteSizeLong(), 500u);
    }
  }
}

// A CSV or JSON Lines row longer than max_row_bytes (a quote never closed,
// a file without line ends) ends the conversion where it is found, even
// with skip_bad: nothing is written, and the file is read no further than
// the limit.  A row exactly at it is converted.
TEST(ConvertJobTest, ARowPastMaxRowBytesEndsTheConversion) {
  testing::TempDir dir;
  const std::string big(600, 'x');
  // "2,xxx...": 602 bytes of cells and delimiter; the JSON line 609.
  WriteRowsWithALongSecond(dir, big);
  // A JSON document of one line: an array, said to be one.
  testing::WriteFileBytes(dir.File("doc.jsonl"), "[{\"s\": \"" + big + "\"}]");
  struct Case {
    std::string file, format;
    uint64_t exact;     // the long row's length
    uint64_t records;   // converted at exact (skip_bad)
    std::string error;  // at exact - 1, after "FILE"
  };
  const std::vector<Case> cases = {
      {"in.csv", "csv", 602, 3,
       ":3: the row is longer than 601 bytes (its cells and delimiters), the "
       "most a row may hold (max_row_bytes): is the file CSV, with its line "
       "ends?"},
      {"in.jsonl", "jsonl", 609, 3,
       ":2: the line is longer than 608 bytes, the most a row may hold "
       "(max_row_bytes)"},
      {"doc.jsonl", "jsonl", 611, 0,
       ":1: the line is longer than 610 bytes, the most a row may hold "
       "(max_row_bytes) (the file looks like a JSON document, not JSON "
       "Lines, which holds one object per line: `jq -c '.[]' FILE` writes an "
       "array's objects so)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.file);
    ConvertJob job;
    job.format = c.format;
    job.inputs.files = {dir.File(c.file)};
    job.output = dir.File("out");
    job.skip_bad = true;
    job.inputs.max_row_bytes = c.exact;
    EXPECT_EQ(Convert(job).records, c.records);
    job.inputs.max_row_bytes = c.exact - 1;
    job.output = dir.File("failed");
    // CSV's is the reader's records::CsvError, JSON Lines' a ConvertError.
    try {
      Convert(job);
      ADD_FAILURE() << "converted";
    } catch (const std::exception& e) {
      EXPECT_EQ(e.what(), dir.File(c.file) + c.error);
    }
    EXPECT_FALSE(std::filesystem::exists(ShardName(job.output, 0, 1, "")));
  }
}

// A shard whose writes fail (the disk fills) fails the whole job with the
// system's error and the file's name, and leaves no shard at all, nor a
// temporary file: the shards are committed together or not at all.
TEST(ConvertJobTest, AFailedShardWriteLeavesNoShards) {
  testing::TempDir dir;
  // 200,000 rows: each shard writes more than its 1 MiB of staging, so
  // that a later write fails after an earlier one went to the disk.
  testing::WriteFileBytes(dir.File("in.csv"), Csv(200000));
  ConvertJob job;
  job.format = "csv";
  job.inputs.files = {dir.File("in.csv")};
  job.output = dir.File("part");
  job.shards = 4;
  job.threads = 2;
  for (const uint64_t every : {1, 2}) {  // its first write, or its second
    records::NthCallFaults full(records::IoOp::kWrite, every, ENOSPC, 1,
                                "part-00002-of-00004");
    std::string error;
    {
      records::ScopedIoFaults faults(&full);
      try {
        Convert(job);
      } catch (const recflow::Error& e) {
        error = e.what();
      }
    }
    EXPECT_GT(full.faults(), 0u);
    EXPECT_NE(error.find("part-00002-of-00004"), std::string::npos) << error;
    EXPECT_NE(error.find(std::strerror(ENOSPC)), std::string::npos) << error;
    for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
      EXPECT_EQ(e.path().filename().string(), "in.csv");  // nothing else
    }
  }
  EXPECT_EQ(Convert(job).records, 200000u);  // and then it can
}

TEST(ConvertJobTest, UnknownFormatsAndMissingInputsAreConvertErrors) {
  ConvertJob job;
  job.format = "parquet";
  job.output = "/nonexistent/x";
  EXPECT_EQ(testing::ConvertErrorOf([&] { Convert(job); }),
            "unknown format 'parquet': expected csv, jsonl, npy, npz, idx or "
            "images");
  job.format = "csv";
  EXPECT_EQ(testing::ConvertErrorOf([&] { Convert(job); }),
            "csv: no INPUT files given");
  EXPECT_EQ(ShardName("p", 3, 8, ".zst"), "p-00003-of-00008.tfrecord.zst");
}

TEST(ConvertJobTest, APrefixThatNamesNoShardIsRefused) {
  // "out/" or "" named the shards "out/-00000-of-00002.tfrecord": a name a
  // shell takes for an option.
  testing::TempDir dir;
  testing::WriteFileBytes(dir.File("in.csv"), Csv(4));
  ConvertJob job;
  job.format = "csv";
  job.inputs.files = {dir.File("in.csv")};
  job.shards = 2;
  job.output = dir.File("out") + "/";
  EXPECT_EQ(testing::ConvertErrorOf([&] { Convert(job); }),
            "output '" + job.output +
                "' ends in a folder: name the shards too (" + job.output +
                "NAME writes " + job.output + "NAME-00000-of-00002.tfrecord)");
  job.output = "";
  EXPECT_EQ(testing::ConvertErrorOf([&] { Convert(job); }),
            "output is empty: give a prefix (NAME writes "
            "NAME-00000-of-00002.tfrecord)");
  EXPECT_EQ(dir.List(), std::vector<std::string>{"in.csv"});
  job.output = dir.File("out/part");
  EXPECT_EQ(Convert(job).records, 4u);
}

// Shards of the prefix by another count or compression (an earlier
// run's) would be read with the new ones by a glob PREFIX-*: the summary
// warns, naming them.  The run's own names, indexes, other prefixes and
// other files are not counted.
TEST(ConvertJobTest, ShardsOfAnEarlierRunAreNamedInAWarning) {
  testing::TempDir dir;
  testing::WriteFileBytes(dir.File("in.csv"), Csv(6));
  ConvertJob job;
  job.format = "csv";
  job.inputs.files = {dir.File("in.csv")};
  job.output = dir.File("part");
  job.shards = 2;
  job.writer.build_index = true;
  EXPECT_TRUE(Convert(job).warnings.empty());
  EXPECT_TRUE(Convert(job).warnings.empty());  // the same names again
  for (const char* other :
       {"partx-00000-of-00001.tfrecord", "part-00000-of-00001.tfrecord.txt",
        "part-a-00000-of-00001.tfrecord", "part-00000-of-00002.tfrecord.bz2",
        "part-123456789012345678901-of-00001.tfrecord"}) {
    testing::WriteFileBytes(dir.File(other), "");
  }
  EXPECT_TRUE(Convert(job).warnings.empty());
  job.shards = 1;
  const std::vector<std::string> warnings = Convert(job).warnings;
  const std::string prefix = dir.File("part");
  EXPECT_EQ(warnings, std::vector<std::string>{fmt::format(
                          "2 other shard files of the prefix {0} (an earlier "
                          "run's?): {0}-00000-of-00002.tfrecord, "
                          "{0}-00001-of-00002.tfrecord; a glob {0}-* reads "
                          "them too (remove them, or write to another prefix)",
                          prefix)});
  job.writer.compression = records::Compression::kZstd;
  job.shards = 2;
  job.writer.build_index = false;
  const std::vector<std::string> more = Convert(job).warnings;
  ASSERT_EQ(more.size(), 1u);
  EXPECT_EQ(more[0].rfind(fmt::format("3 other shard files of the prefix {0} "
                                      "(an earlier run's?): "
                                      "{0}-00000-of-00001.tfrecord, "
                                      "{0}-00000-of-00002.tfrecord, "
                                      "{0}-00001-of-00002.tfrecord; ",
                                      prefix),
                          0),
            0u)
      << more[0];
  // A prefix without a folder names the files as it does.
  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir.path());
  job.output = "part";
  job.inputs.files = {"in.csv"};
  const std::vector<std::string> here = Convert(job).warnings;
  std::filesystem::current_path(cwd);
  ASSERT_EQ(here.size(), 1u);
  EXPECT_NE(here[0].find("of the prefix part (an earlier run's?): "
                         "part-00000-of-00001.tfrecord, "),
            std::string::npos)
      << here[0];
}

TEST(ConvertJobTest, APipeIsRefusedBeforeAnyShardIsWritten) {
  // CSV and JSON Lines are read twice (inference, then conversion): from a
  // pipe the second read got nothing, and "converted 0 records" was a
  // success.  Every format refuses a pipe up front, naming it.
  testing::TempDir dir;
  const std::string fifo = dir.File("rows");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const char* format : {"csv", "jsonl", "npy", "npz", "idx"}) {
    ConvertJob job;
    job.format = format;
    if (job.format == "idx") {
      job.inputs.images = fifo;
      job.inputs.labels = fifo;
    } else {
      job.inputs.files = {fifo};
    }
    job.output = dir.File("out/x");
    try {
      Convert(job);
      ADD_FAILURE() << format << ": a pipe was accepted";
    } catch (const records::IoError& e) {
      EXPECT_EQ(std::string(e.what()),
                fifo +
                    ": not a regular file (a pipe, socket or device): "
                    "convert reads its inputs more than once or at offsets; "
                    "write it to a file first")
          << format;
    }
    EXPECT_FALSE(std::filesystem::exists(dir.File("out"))) << format;
  }
}

}  // namespace
}  // namespace recflow::convert
