// The recflow command as a user runs it: exit codes, stdout/stderr, files.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <zstd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>

#include "recflow_runner.h"
#include "records/example_builder.h"
#include "records/index.h"
#include "records/tfrecord_reader.h"
#include "records/tfrecord_writer.h"
#include "test_util.h"

namespace recflow::tools {
namespace {

using records::Compression;
using testing::TempDir;

using testing::Recflow;
using testing::Result;

// Visible (not hidden) files in `dir`, sorted.
std::vector<std::string> Visible(const TempDir& dir) {
  std::vector<std::string> names;
  for (const auto& n : dir.List()) {
    if (n[0] != '.') names.push_back(n);
  }
  return names;
}

TEST(CliTest, HelpForEveryCommand) {
  TempDir dir;
  for (const char* cmd : {"", "count", "verify", "reshard", "index", "demo"}) {
    const Result r = Recflow(dir, std::string(cmd) + " --help");
    EXPECT_EQ(r.code, 0) << cmd;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << cmd;
  }
  EXPECT_NE(Recflow(dir, "reshard --help").out.find("TensorFlow cannot read"),
            std::string::npos);
}

// No arguments lists the commands, as --help does; an unknown command or
// option is named with the closest known one, or the list when none is
// close.
TEST(CliTest, CommandsAreDiscoverable) {
  TempDir dir;
  const Result bare = Recflow(dir, "");
  EXPECT_EQ(bare.code, 0);
  EXPECT_EQ(bare.out, Recflow(dir, "--help").out);
  for (const char* cmd : {"convert", "inspect", "bench", "train", "demo"}) {
    EXPECT_NE(bare.out.find(std::string("\n  ") + cmd), std::string::npos)
        << cmd << " missing from:\n"
        << bare.out;
  }
  EXPECT_NE(bare.out.find("train on it"), std::string::npos) << bare.out;

  Result r = Recflow(dir, "cuont x");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "recflow: unknown command 'cuont'; did you mean 'count'?\n");
  EXPECT_EQ(Recflow(dir, "conv").err,
            "recflow: unknown command 'conv'; did you mean 'convert'?\n");
  r = Recflow(dir, "nosuch");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "recflow: unknown command 'nosuch' (the commands: cat, inspect, "
            "convert, count, verify, reshard, index, bench, train, summary, "
            "demo)\n");
  // A mistyped option is named before the required one it hides.
  r = Recflow(dir, "reshard --shardz 2 -o out x.tfrecord");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "recflow reshard: unknown option '--shardz'; did you mean "
            "'--shards'?\n");
  r = Recflow(dir, "count --frobnicate=1 x.tfrecord");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "recflow count: unknown option '--frobnicate' (see `recflow "
            "count --help`)\n");
}

// Outputs whose folders do not exist yet get them, for every command that
// writes records or indexes; a folder that cannot be made is one line.
TEST(CliTest, OutputFoldersAreCreated) {
  TempDir dir;
  testing::WriteFileBytes(dir.File("p.csv"), "a,b\n1,2\n3,4\n");
  Result r = Recflow(dir, "convert csv " + dir.File("p.csv") + " --output " +
                              dir.File("c/d/p"));
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string shard = dir.File("c/d/p-00000-of-00001.tfrecord");
  ASSERT_TRUE(std::filesystem::exists(shard));
  r = Recflow(dir, "reshard -n 2 -o " + dir.File("r/s/q") + " " + shard);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(
      std::filesystem::exists(dir.File("r/s/q-00001-of-00002.tfrecord")));
  r = Recflow(
      dir, "verify --salvage " + dir.File("v/w/saved.tfrecord") + " " + shard);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(testing::ReadFileBytes(dir.File("v/w/saved.tfrecord")),
            testing::ReadFileBytes(shard));
  r = Recflow(dir, "index -o " + dir.File("i/j/p.idx") + " " + shard);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(std::filesystem::exists(dir.File("i/j/p.idx")));

  testing::WriteFileBytes(dir.File("plain"), "");
  r = Recflow(dir, "convert csv " + dir.File("p.csv") + " --output " +
                       dir.File("plain/x/p"));
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(dir.File("plain/x/p-00000-of-00001.tfrecord")),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir.File("plain/x")));
}

// --compression-level: gzip's and zstd's ranges; higher levels write
// smaller shards with the same records; a level with no codec, or out of
// range, is refused naming the range.
TEST(CliTest, CompressionLevels) {
  TempDir dir;
  std::string csv = "id,text\n";
  for (int i = 0; i < 3000; ++i) {
    csv += fmt::format("{},record {} says {} {}\n", i, i, i % 13, i * 7 % 100);
  }
  testing::WriteFileBytes(dir.File("in.csv"), csv);
  for (const auto& [codec, low, high, suffix] :
       {std::tuple{"gzip", 1, 9, ".gz"}, std::tuple{"zstd", 1, 19, ".zst"}}) {
    uint64_t sizes[2];
    for (int i : {0, 1}) {
      const std::string out = dir.File(fmt::format("{}{}", codec, i));
      const Result r = Recflow(
          dir, fmt::format("convert csv {} -o {} --compression {} "
                           "--compression-level {}",
                           dir.File("in.csv"), out, codec, i ? high : low));
      ASSERT_EQ(r.code, 0) << r.err;
      const std::string shard = out + "-00000-of-00001.tfrecord" + suffix;
      sizes[i] = std::filesystem::file_size(shard);
      EXPECT_EQ(testing::ReadRecords(shard).size(), 3000u);
    }
    EXPECT_LT(sizes[1], sizes[0]) << codec;
    // reshard takes it too (--level is its older name).
    const Result r = Recflow(
        dir, fmt::format("reshard -n 2 --compression {} --compression-level {} "
                         "-o {} {}",
                         codec, high, dir.File(std::string("r") + codec),
                         dir.File(fmt::format("{}1-00000-of-00001.tfrecord{}",
                                              codec, suffix))));
    ASSERT_EQ(r.code, 0) << r.err;
  }
  Result r = Recflow(dir, "convert csv " + dir.File("in.csv") + " -o " +
                              dir.File("x") + " --compression-level 3");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "recflow: --compression-level needs --compression zlib, gzip or "
            "zstd\n");
  r = Recflow(dir, "convert csv " + dir.File("in.csv") + " -o " +
                       dir.File("x") +
                       " --compression gzip "
                       "--compression-level 10");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "recflow: --compression-level 10: gzip takes 1 to 9\n");
  r = Recflow(dir, "reshard -n 1 -o " + dir.File("y") +
                       " --compression zstd --compression-level 20 " +
                       dir.File("gzip1-00000-of-00001.tfrecord.gz"));
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "recflow: --compression-level 20: zstd takes 1 to 19\n");
}

// The README's command list and `recflow --help` stay in step: every
// command is in both, and every option the README shows for a command is
// one that command has.
TEST(CliTest, ReadmeCommandListMatchesHelp) {
  TempDir dir;
  const std::string readme = testing::ReadFileBytes(RECFLOW_README);
  const size_t section = readme.find("## The command line");
  ASSERT_NE(section, std::string::npos);
  const size_t begin = readme.find("```\n", section) + 4;
  const std::string block =
      readme.substr(begin, readme.find("```", begin) - begin);
  // Command -> the options the README shows for it.
  std::map<std::string, std::set<std::string>> readme_options;
  std::string command;
  std::istringstream lines(block);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("recflow ", 0) == 0) {
      command = line.substr(8, line.find(' ', 8) - 8);
      readme_options[command];
    }
    ASSERT_FALSE(command.empty()) << line;
    for (size_t p = line.find("--"); p != std::string::npos;
         p = line.find("--", p + 2)) {
      const size_t end =
          line.find_first_not_of("abcdefghijklmnopqrstuvwxyz-", p + 2);
      readme_options[command].insert(line.substr(p, end - p));
    }
  }
  const std::string help = Recflow(dir, "--help").out;
  std::set<std::string> help_commands;
  std::istringstream help_lines(help.substr(help.find("Subcommands:")));
  for (std::string line; std::getline(help_lines, line);) {
    if (line.rfind("  ", 0) == 0 && line.size() > 2 && line[2] != ' ') {
      help_commands.insert(line.substr(2, line.find(' ', 2) - 2));
    }
  }
  std::set<std::string> readme_commands;
  for (const auto& [c, options] : readme_options) readme_commands.insert(c);
  EXPECT_EQ(readme_commands, help_commands) << help;
  for (const auto& [c, options] : readme_options) {
    const std::string command_help = Recflow(dir, c + " --help").out;
    for (const auto& o : options) {
      // The option, whole: "--index" is not found in "--index-x".
      bool found = false;
      for (size_t p = command_help.find(o); p != std::string::npos && !found;
           p = command_help.find(o, p + 1)) {
        const size_t end = p + o.size();
        found =
            end == command_help.size() ||
            (std::isalnum(static_cast<unsigned char>(command_help[end])) == 0 &&
             command_help[end] != '-');
      }
      EXPECT_TRUE(found) << "README shows " << o << " for recflow " << c;
    }
  }
}

TEST(CliTest, UsageErrorsExitTwo) {
  TempDir dir;
  EXPECT_EQ(Recflow(dir, "frobnicate").code, 2);
  EXPECT_EQ(Recflow(dir, "count").code, 2);
  const Result missing = Recflow(dir, "count " + dir.File("missing.tfrecord"));
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.err.find("missing.tfrecord: no such file"),
            std::string::npos);
  testing::WriteRecords(dir.File("a.tfrecord"), {"x"});
  EXPECT_EQ(
      Recflow(dir, "count --compression lz4 " + dir.File("a.tfrecord")).code,
      2);
}

// Counts, sizes and rates out of range are refused by name before anything
// runs, instead of being read as "none" (a zero or negative batch or
// shuffle), as "all cores" (negative threads) or trained with (a negative
// learning rate, a negative dropout that switched dropout off).
TEST(CliTest, OutOfRangeNumbersAreRefusedByName) {
  TempDir dir;
  testing::WriteRecords(dir.File("a.tfrecord"), {"x"});
  const std::string a = dir.File("a.tfrecord");
  const std::string train =
      "train --train " + a + " --eval " + a + " --spec " + a + " ";
  const std::pair<std::string, std::string> cases[] = {
      {"bench " + a + " --batch 0",
       "--batch: expected a positive number, not 0"},
      {"bench " + a + " --shuffle -1",
       "--shuffle: expected a positive number, not -1"},
      {"bench " + a + " --prefetch -2",
       "--prefetch: expected -1 (autotune), 0 or more, not -2"},
      {"bench " + a + " --duration 0",
       "--duration: expected a positive number, not 0"},
      {"bench " + a + " --repeat 0",
       "recflow: --repeat 0: expected a number of epochs, or -1 (forever) "
       "with --duration"},
      {"bench " + a + " --repeat -3",
       "recflow: --repeat -3: expected a number of epochs, or -1 (forever) "
       "with --duration"},
      {"bench " + a + " --repeat -1",
       "recflow: --repeat -1 (forever) needs --duration SECONDS"},
      {"count --threads -1 " + a, "--threads: expected zero or more, not -1"},
      {"cat -n -1 " + a, "--limit: expected zero or more, not -1"},
      {"inspect -n -5 " + a, "--limit: expected zero or more, not -5"},
      {"convert csv x.csv -o out --threads -3",
       "--threads: expected zero or more, not -3"},
      {"demo --train-steps 0",
       "--train-steps: expected a positive number, not 0"},
      {train + "--learning-rate -0.1",
       "--learning-rate: expected a positive number, not -0.1"},
      {train + "--dropout -0.5",
       "--dropout: expected a fraction in [0, 1), not -0.5"},
      {train + "--dropout 1",
       "--dropout: expected a fraction in [0, 1), not 1"},
      {train + "--batch 0", "--batch: expected a positive number, not 0"},
      {train + "--shuffle 0", "--shuffle: expected a positive number, not 0"},
      {train + "--threads -1", "--threads: expected zero or more, not -1"},
      {train + "--save-checkpoints-steps 0",
       "--save-checkpoints-steps: expected a positive number, not 0"},
  };
  for (const auto& [args, message] : cases) {
    const Result r = Recflow(dir, args);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_EQ(r.err.substr(0, r.err.find('\n')), message) << args;
  }
}

TEST(CliTest, CountJsonHasTotalsAndPerFile) {
  TempDir dir;
  testing::WriteRecords(dir.File("a.tfrecord"), {"one", "two", "three"});
  testing::WriteRecords(dir.File("b.tfrecord.gz"), {"four", "five"},
                        Compression::kGzip);
  const Result r = Recflow(dir, "count --json " + dir.File("a.tfrecord") + " " +
                                    dir.File("b.tfrecord.gz"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = r.Json();
  EXPECT_EQ(j["records"], 5);
  EXPECT_EQ(j["bytes"],
            std::filesystem::file_size(dir.File("a.tfrecord")) +
                std::filesystem::file_size(dir.File("b.tfrecord.gz")));
  EXPECT_EQ(j["payload_bytes"], 3 + 3 + 5 + 4 + 4);
  ASSERT_EQ(j["files"].size(), 2u);
  EXPECT_EQ(j["files"][1]["records"], 2);
  EXPECT_EQ(j["files"][1]["compression"], "gzip");
}

TEST(CliTest, DirectoriesExpandToTheirRecordFiles) {
  TempDir dir;
  std::filesystem::create_directory(dir.File("data"));
  testing::WriteRecords(dir.File("data/train-00001-of-00002.tfrecord"), {"b"});
  testing::WriteRecords(dir.File("data/train-00000-of-00002.tfrecord"),
                        {"a", "a"});
  testing::WriteFileBytes(dir.File("data/train-00000-of-00002.tfrecord.idx"),
                          "0 17\n");
  testing::WriteFileBytes(dir.File("data/labels.txt"), "cat\ndog\n");
  const auto j = Recflow(dir, "count --json " + dir.File("data")).Json();
  EXPECT_EQ(j["records"], 3);
  ASSERT_EQ(j["files"].size(), 2u);
  EXPECT_EQ(j["files"][0]["path"],
            dir.File("data/train-00000-of-00002.tfrecord"));
  std::filesystem::create_directory(dir.File("empty"));
  EXPECT_EQ(Recflow(dir, "count " + dir.File("empty")).code, 2);
}

TEST(CliTest, CountAndVerifyFailOnDamage) {
  TempDir dir;
  testing::WriteRecords(dir.File("f.tfrecord"),
                        {"aaaa", "bbbb", "cccc", "dddd"});
  EXPECT_EQ(Recflow(dir, "verify " + dir.File("f.tfrecord")).code, 0);
  std::string bytes = testing::ReadFileBytes(dir.File("f.tfrecord"));
  bytes[20 + 14] ^= 1;  // payload of record 1
  bytes[60 + 3] ^= 1;   // length of record 3
  testing::WriteFileBytes(dir.File("f.tfrecord"), bytes);

  const Result count = Recflow(dir, "count " + dir.File("f.tfrecord"));
  EXPECT_EQ(count.code, 1);
  EXPECT_NE(count.err.find("record 1 at byte offset 20: data CRC mismatch"),
            std::string::npos)
      << count.err;

  const Result verify = Recflow(dir, "verify " + dir.File("f.tfrecord"));
  EXPECT_EQ(verify.code, 1);
  EXPECT_NE(verify.err.find(dir.File("f.tfrecord") +
                            ": record 1 at byte offset 20: data CRC mismatch"),
            std::string::npos)
      << verify.err;
  EXPECT_NE(verify.err.find("at byte offset 60: length CRC mismatch"),
            std::string::npos)
      << verify.err;
  EXPECT_NE(verify.out.find("DAMAGED"), std::string::npos);
}

// An index beside a file is checked with it: the one DALI, the range
// reader and the global shuffle would trust.  A stale one is a problem
// (exit 1) that names the index and what differs; the records stay OK.
TEST(CliTest, VerifyChecksTheIndexBesideAFile) {
  TempDir dir;
  const std::string f = dir.File("f.tfrecord"), idx = f + ".idx";
  testing::WriteRecords(f, {"aaaa", "bbbb", "cccc"});  // 20 bytes each
  ASSERT_EQ(Recflow(dir, "index " + f).code, 0);
  Result r = Recflow(dir, "verify --json " + f);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.Json()["files"][0]["index"], "ok");
  const auto stale = [&](const std::string& want) {
    const Result v = Recflow(dir, "verify " + f);
    EXPECT_EQ(v.code, 1);
    EXPECT_EQ(v.err, want + "\n");
    EXPECT_EQ(v.out.rfind("BAD IDX", 0), 0u) << v.out;
  };
  // An entry moved by a byte.
  testing::WriteFileBytes(idx, "0 20\n21 19\n40 20\n");
  stale(idx +
        ": stale index: record 1 is 20 bytes at byte 20 of the file, "
        "the index says 19 bytes at byte 21");
  // The file grew after it was indexed.
  testing::WriteFileBytes(idx, "0 20\n20 20\n");
  stale(idx + ": stale index: 2 records, the file has 3");
  // Not an index.
  testing::WriteFileBytes(idx, "zero twenty\n");
  stale(idx + ":1: expected 'offset size' (two unsigned integers)");
  // A zstd file's index from another zstd file.
  const std::string z = dir.File("z.tfrecord.zst");
  testing::WriteRecords(z, {"a", "b"}, records::Compression::kZstd);
  testing::WriteRecords(dir.File("other.zst"), {"bb", "a"},
                        records::Compression::kZstd);
  ASSERT_EQ(
      Recflow(dir, "index " + dir.File("other.zst") + " -o " + z + ".idx").code,
      0);
  r = Recflow(dir, "verify " + z);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, z + ".idx: stale index: record 0 is 17 bytes at byte 0 of "
                       "the zstd frame at file byte 0 (41 bytes); the index "
                       "says 18 bytes at byte 0 of the frame at 0 (44 "
                       "bytes)\n");
  // Many frames, checked as they are decoded (the file is read once): the
  // file's own index, then one whose frames differ from the 3rd on.
  std::vector<std::string> many, changed;
  for (int i = 0; i < 60; ++i) many.push_back(std::string(10 + i % 7, 'x'));
  changed = many;
  changed[40] += "y";
  const std::string m = dir.File("m.tfrecord.zst");
  const records::WriterOptions small_frames{
      .compression = records::Compression::kZstd, .zstd_frame_bytes = 200};
  testing::WriteRecords(dir.File("changed.zst"), changed, small_frames);
  testing::WriteRecords(m, many, small_frames);
  ASSERT_EQ(
      Recflow(dir, "index " + dir.File("changed.zst") + " -o " + m + ".idx")
          .code,
      0);
  r = Recflow(dir, "verify " + m);
  EXPECT_EQ(r.code, 1);
  // Record 40's frame starts at record 35: its compressed size differs.
  EXPECT_EQ(r.err.rfind(m + ".idx: stale index: record 35 is 26 bytes at "
                            "byte 0 of the zstd frame at file byte ",
                        0),
            0u)
      << r.err;
  ASSERT_EQ(Recflow(dir, "index " + m).code, 0);
  r = Recflow(dir, "verify --json " + m);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.Json()["files"][0]["index"], "ok");
  // An uncompressed file's index beside a zstd file: named as that, not
  // as a record at the wrong offset.
  testing::WriteFileBytes(m + ".idx", "0 26\n");
  r = Recflow(dir, "verify " + m);
  EXPECT_EQ(r.err, m + ".idx: an index of a none file beside a zstd one\n");
  // A record split across two zstd frames (written by another tool): no
  // index can reach it, whatever the index says.
  const std::string plain = dir.File("two.tfrecord");
  testing::WriteRecords(plain, {"first record", "second record"});
  const std::string bytes = testing::ReadFileBytes(plain);
  const auto frame = [](std::string_view part) {
    std::string out(ZSTD_compressBound(part.size()), '\0');
    out.resize(
        ZSTD_compress(out.data(), out.size(), part.data(), part.size(), 3));
    return out;
  };
  const std::string a = frame(std::string_view(bytes).substr(0, 10));
  const std::string b = frame(std::string_view(bytes).substr(10));
  const std::string split = dir.File("split.tfrecord.zst");
  testing::WriteFileBytes(split, a + b);
  testing::WriteFileBytes(
      split + ".idx",
      fmt::format("{}\n0 {} 0 28\n0 {} 28 29\n", records::kZstdIndexHeader,
                  a.size(), a.size()));
  r = Recflow(dir, "verify " + split);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, split +
                       ".idx: record 0 spans two zstd frames, so no index can "
                       "reach it (`recflow reshard --compression zstd` "
                       "rewrites the file with whole records in each frame)\n");
  // A gzip file cannot have one.
  const std::string g = dir.File("g.tfrecord.gz");
  testing::WriteRecords(g, {"a"}, records::Compression::kGzip);
  testing::WriteFileBytes(g + ".idx", "0 17\n");
  r = Recflow(dir, "verify " + g);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, g + ".idx: an index beside a gzip file, which cannot have "
                       "one\n");
}

TEST(CliTest, VerifySalvageWritesEveryReadableRecord) {
  TempDir dir;
  testing::WriteRecords(dir.File("f.tfrecord"),
                        {"aaaa", "bbbb", "cccc", "dddd"});
  std::string bytes = testing::ReadFileBytes(dir.File("f.tfrecord"));
  bytes[40 + 13] ^= 1;  // payload of record 2
  testing::WriteFileBytes(dir.File("f.tfrecord"), bytes);
  const Result r =
      Recflow(dir, "verify --json --salvage " + dir.File("saved.tfrecord.zst") +
                       " " + dir.File("f.tfrecord"));
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.Json()["problems"], 1);
  records::TFRecordReader probe(dir.File("saved.tfrecord.zst"));
  EXPECT_EQ(probe.compression(), Compression::kZstd);
  EXPECT_EQ(testing::ReadRecords(dir.File("saved.tfrecord.zst")),
            (std::vector<std::string>{"aaaa", "bbbb", "dddd"}));
  // Salvaging into the damaged file itself would replace it.
  const Result onto =
      Recflow(dir, "verify --salvage " + dir.path().string() +
                       "/./f.tfrecord " + dir.File("f.tfrecord"));
  EXPECT_EQ(onto.code, 2);
  EXPECT_EQ(onto.err, "recflow: --salvage " + dir.path().string() +
                          "/./f.tfrecord is " + dir.File("f.tfrecord") +
                          ", one of the files being verified: write the "
                          "salvaged records elsewhere\n");
  EXPECT_EQ(testing::ReadFileBytes(dir.File("f.tfrecord")), bytes);
  // A file verified twice, salvaged elsewhere, is no such case (it was
  // refused as "--salvage OUT is f.tfrecord").
  const Result twice =
      Recflow(dir, "verify --salvage " + dir.File("s2") + " " +
                       dir.File("f.tfrecord") + " " + dir.File("f.tfrecord"));
  EXPECT_EQ(twice.code, 1) << twice.err;
  EXPECT_EQ(testing::ReadRecords(dir.File("s2")),
            (std::vector<std::string>{"aaaa", "bbbb", "dddd", "aaaa", "bbbb",
                                      "dddd"}));
}

TEST(CliTest, ReshardKeepsOrderBalancesAndIndexes) {
  TempDir dir;
  std::vector<std::string> all;
  for (int i = 0; i < 103; ++i) all.push_back("record-" + std::to_string(i));
  testing::WriteRecords(
      dir.File("a.tfrecord"),
      std::vector<std::string>(all.begin(), all.begin() + 50));
  testing::WriteRecords(dir.File("b.tfrecord.gz"),
                        std::vector<std::string>(all.begin() + 50, all.end()),
                        Compression::kGzip);
  for (const char* compression : {"none", "zstd", "gzip", "zlib"}) {
    std::filesystem::remove_all(dir.File("out"));
    std::filesystem::create_directory(dir.File("out"));
    const bool indexable = std::string(compression) == "none" ||
                           std::string(compression) == "zstd";
    const Result r = Recflow(
        dir, std::string("reshard --json --shards 4 --compression ") +
                 compression + (indexable ? " --index" : "") + " --output " +
                 dir.File("out/part") + " " + dir.File("a.tfrecord") + " " +
                 dir.File("b.tfrecord.gz"));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.Json()["records"], 103);
    EXPECT_TRUE(r.Json()["warnings"].empty()) << r.err;
    const std::string suffix = std::string(compression) == "none"   ? ""
                               : std::string(compression) == "zstd" ? ".zst"
                               : std::string(compression) == "gzip" ? ".gz"
                                                                    : ".zz";
    std::vector<std::string> back;
    std::vector<size_t> sizes;
    for (int s = 0; s < 4; ++s) {
      const std::string shard = dir.File("out/part-0000" + std::to_string(s) +
                                         "-of-00004.tfrecord" + suffix);
      const auto records = testing::ReadRecords(shard);
      sizes.push_back(records.size());
      back.insert(back.end(), records.begin(), records.end());
      if (indexable) {
        records::IndexedReader ir(shard, records::ReadIndex(shard + ".idx"));
        ASSERT_EQ(ir.size(), records.size());
        if (!records.empty()) {
          EXPECT_EQ(ir.Read(ir.size() - 1), records.back());
        }
      }
    }
    EXPECT_EQ(back, all) << compression;
    EXPECT_EQ(sizes, (std::vector<size_t>{25, 26, 26, 26})) << compression;
  }
  // Over the last run's 4 ZLIB shards: they are named, as shards a glob
  // would read with the new ones.
  const std::string out = dir.File("out/part");
  const Result over = Recflow(
      dir, "reshard --shards 2 -o " + out + " " + dir.File("a.tfrecord"));
  ASSERT_EQ(over.code, 0) << over.err;
  EXPECT_EQ(over.err,
            fmt::format("recflow: warning: 4 other shard files of the prefix "
                        "{0} (an earlier run's?): {0}-00000-of-00004.tfrecord."
                        "zz, {0}-00001-of-00004.tfrecord.zz, "
                        "{0}-00002-of-00004.tfrecord.zz and 1 more; a glob "
                        "{0}-* reads them too (remove them, or write to "
                        "another prefix)\n",
                        out));
  EXPECT_EQ(Recflow(dir, "reshard --shards 2 --compression gzip --index -o " +
                             dir.File("x") + " " + dir.File("a.tfrecord"))
                .code,
            2);
  // A file named twice (here by a glob and by a path of its own) would be
  // copied twice.
  const Result twice = Recflow(dir, "reshard --shards 1 -o " + dir.File("y") +
                                        " " + dir.File("*.tfrecord") + " " +
                                        dir.path().string() + "/./a.tfrecord");
  EXPECT_EQ(twice.code, 2);
  EXPECT_EQ(twice.err, "recflow: " + dir.path().string() +
                           "/./a.tfrecord is named twice (also as " +
                           dir.File("a.tfrecord") +
                           "): reshard would copy its records twice\n");
  EXPECT_FALSE(std::filesystem::exists(dir.File("y-00000-of-00001.tfrecord")));
}

// --shuffle: every record once, in a seeded uniform order, balanced as
// ever; the same seed gives the same shards.
TEST(CliTest, ReshardShuffledWritesEveryRecordOnceInTheSeedsOrder) {
  TempDir dir;
  std::vector<std::string> all;
  for (int i = 0; i < 1000; ++i) all.push_back("record-" + std::to_string(i));
  testing::WriteRecords(
      dir.File("a.tfrecord"),
      std::vector<std::string>(all.begin(), all.begin() + 600));
  testing::WriteRecords(dir.File("b.tfrecord.zst"),
                        std::vector<std::string>(all.begin() + 600, all.end()),
                        Compression::kZstd);
  const auto reshard = [&](const std::string& out, const std::string& seed) {
    std::filesystem::create_directory(dir.File(out));
    const Result r = Recflow(
        dir, "reshard --json --shards 3 --index --shuffle " + seed + " -o " +
                 dir.File(out + "/p") + " " + dir.File("a.tfrecord") + " " +
                 dir.File("b.tfrecord.zst"));
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.Json()["records"], 1000);
    std::vector<std::string> back;
    for (int s = 0; s < 3; ++s) {
      const std::string shard =
          dir.File(out + "/p-0000" + std::to_string(s) + "-of-00003.tfrecord");
      const auto records = testing::ReadRecords(shard);
      EXPECT_EQ(records.size(), s == 0 ? 333u : s == 1 ? 333u : 334u);
      EXPECT_EQ(records::ReadIndex(shard + ".idx").entries.size(),
                records.size());
      back.insert(back.end(), records.begin(), records.end());
    }
    return back;
  };
  const auto first = reshard("s1", "7");
  EXPECT_NE(first, all);
  EXPECT_EQ(reshard("s2", "7"), first);
  EXPECT_NE(reshard("s3", "8"), first);
  // Records from each file are spread over the whole output.
  size_t from_a_in_last_third = 0;
  for (size_t i = 667; i < first.size(); ++i) {
    from_a_in_last_third += std::stoi(first[i].substr(7)) < 600;
  }
  EXPECT_GT(from_a_in_last_third, 150u);
  auto sorted = first;
  std::sort(sorted.begin(), sorted.end());
  auto want = all;
  std::sort(want.begin(), want.end());
  EXPECT_EQ(sorted, want);
  // Reading flags have no meaning for reads by index.
  const Result flags = Recflow(
      dir, "reshard --shards 2 --shuffle 1 --input-compression none -o " +
               dir.File("z") + " " + dir.File("a.tfrecord"));
  EXPECT_EQ(flags.code, 2);
  EXPECT_NE(flags.err.find("--input-compression and --max-record-bytes do not "
                           "apply to it"),
            std::string::npos)
      << flags.err;
  // A gzip input cannot be read by index: refused, nothing written.
  testing::WriteRecords(dir.File("c.tfrecord.gz"), {"x"}, Compression::kGzip);
  std::filesystem::create_directory(dir.File("g"));
  const Result gzip =
      Recflow(dir, "reshard --shards 2 --shuffle 1 -o " + dir.File("g/p") +
                       " " + dir.File("c.tfrecord.gz"));
  EXPECT_NE(gzip.code, 0);
  EXPECT_NE(gzip.err.find("a gzip stream cannot be indexed"), std::string::npos)
      << gzip.err;
  EXPECT_TRUE(std::filesystem::is_empty(dir.File("g")));
}

// A damaged input makes reshard fail without leaving any shard behind.
TEST(CliTest, FailedReshardLeavesNoShards) {
  TempDir dir;
  testing::WriteRecords(dir.File("good.tfrecord"), {"a", "b", "c"});
  testing::WriteRecords(dir.File("bad.tfrecord"), {"d", "e"});
  std::string bytes = testing::ReadFileBytes(dir.File("bad.tfrecord"));
  bytes[17 + 12] ^= 1;
  testing::WriteFileBytes(dir.File("bad.tfrecord"), bytes);
  std::filesystem::create_directory(dir.File("out"));
  for (const std::string shuffle : {"", "--shuffle 3 "}) {
    const Result r = Recflow(
        dir, "reshard --shards 2 " + shuffle + "-o " + dir.File("out/s") + " " +
                 dir.File("good.tfrecord") + " " + dir.File("bad.tfrecord"));
    EXPECT_EQ(r.code, 1) << shuffle;
    EXPECT_NE(r.err.find("bad.tfrecord"), std::string::npos) << r.err;
    EXPECT_TRUE(std::filesystem::is_empty(dir.File("out"))) << shuffle;
  }
}

TEST(CliTest, PipesAreReadWhereOneReadDoesAndRefusedElsewhere) {
  TempDir dir;
  std::vector<std::string> examples;
  for (const char* word : {"abc", "de", "fgh"}) {
    records::ExampleBuilder b;
    b.AddBytes("word", word);
    examples.emplace_back(b.Serialize());
  }
  testing::WriteRecords(dir.File("f.tfrecord"), examples);
  const std::string file = dir.File("f.tfrecord");
  // Reading once, in order: count, verify and cat take a pipe, and count
  // gives the bytes it read (a pipe has no size to look up).
  for (const std::string command : {"count --json", "verify", "cat"}) {
    const std::string out = dir.File(".piped");
    const std::string cmd = "cat " + file + " | " + RECFLOW_BINARY + " " +
                            command + " /dev/stdin > " + out + " 2>&1";
    const int status = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << command << ": " << testing::ReadFileBytes(out);
    const std::string printed = testing::ReadFileBytes(out);
    if (command == "count --json") {
      const auto j = nlohmann::json::parse(printed);
      EXPECT_EQ(j["records"], 3);
      EXPECT_EQ(j["bytes"], std::filesystem::file_size(file));
    } else {
      EXPECT_NE(printed.find(command == "verify" ? "3 records" : "\"fgh\""),
                std::string::npos)
          << command << ": " << printed;
    }
  }
  // Reading twice, at offsets or on every epoch: refused up front, exit 2,
  // nothing written.  (Recflow() gives the command /dev/null as stdin: a
  // device, as a pipe is not a regular file.)
  std::filesystem::create_directory(dir.File("out"));
  for (const std::string& command : std::vector<std::string>{
           "index -o " + dir.File("out/x.idx"),
           "reshard --shards 2 -o " + dir.File("out/s"),
           "convert jsonl -o " + dir.File("out/c"), "bench --repeat 2"}) {
    const Result r = Recflow(dir, command + " /dev/stdin");
    EXPECT_EQ(r.code, 2) << command << ": " << r.err;
    EXPECT_NE(r.err.find("/dev/stdin: not a regular file (a pipe, socket or "
                         "device): "),
              std::string::npos)
        << command << ": " << r.err;
    EXPECT_TRUE(std::filesystem::is_empty(dir.File("out"))) << command;
  }
}

TEST(CliTest, OutputLostToAFullDiskIsAnError) {
  // stdout on /dev/full: what cat printed (and what any command left in
  // stdout's buffer at exit) was lost while the exit code said success.
  TempDir dir;
  std::vector<std::string> examples;
  for (int i = 0; i < 2000; ++i) {
    records::ExampleBuilder b;
    b.AddInt64("i", i);
    examples.emplace_back(b.Serialize());
  }
  testing::WriteRecords(dir.File("f.tfrecord"), examples);
  for (const std::string& args : std::vector<std::string>{
           "cat " + dir.File("f.tfrecord"),
           "count --json " + dir.File("f.tfrecord"),
           "inspect " + dir.File("f.tfrecord"), "--help"}) {
    const std::string err = dir.File(".err");
    const int status = std::system(
        (std::string(RECFLOW_BINARY) + " " + args + " > /dev/full 2> " + err)
            .c_str());
    ASSERT_TRUE(WIFEXITED(status)) << args;
    EXPECT_EQ(WEXITSTATUS(status), 2) << args;
    EXPECT_EQ(testing::ReadFileBytes(err),
              "recflow: standard output: cannot write: No space left on "
              "device\n")
        << args;
  }
}

TEST(CliTest, AnOutputPrefixThatNamesNoShardIsAUsageError) {
  TempDir dir;
  testing::WriteRecords(dir.File("f.tfrecord"), {"a", "b"});
  testing::WriteFileBytes(dir.File("in.csv"), "x\n1\n");
  std::filesystem::create_directory(dir.File("out"));
  for (const std::string& command :
       std::vector<std::string>{"reshard --shards 2 " + dir.File("f.tfrecord"),
                                "convert csv " + dir.File("in.csv")}) {
    Result r = Recflow(dir, command + " -o " + dir.File("out/"));
    EXPECT_EQ(r.code, 2) << command;
    EXPECT_NE(r.err.find("--output '" + dir.File("out/") +
                         "' ends in a folder: name the shards too"),
              std::string::npos)
        << r.err;
    r = Recflow(dir, command + " -o ''");
    EXPECT_EQ(r.code, 2) << command;
    EXPECT_NE(r.err.find("--output is empty: give a prefix"), std::string::npos)
        << r.err;
    EXPECT_TRUE(std::filesystem::is_empty(dir.File("out"))) << command;
  }
}

TEST(CliTest, IndexWritesDaliIndexBesideTheFile) {
  TempDir dir;
  testing::WriteRecords(dir.File("f.tfrecord"), {"abc", "de"});
  const Result r = Recflow(dir, "index " + dir.File("f.tfrecord"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(testing::ReadFileBytes(dir.File("f.tfrecord.idx")),
            "0 19\n19 18\n");
  ASSERT_EQ(Recflow(dir, "index -o " + dir.File("other.idx") + " " +
                             dir.File("f.tfrecord"))
                .code,
            0);
  EXPECT_EQ(testing::ReadFileBytes(dir.File("other.idx")), "0 19\n19 18\n");
  testing::WriteRecords(dir.File("g.tfrecord.gz"), {"x"}, Compression::kGzip);
  const Result gz = Recflow(dir, "index " + dir.File("g.tfrecord.gz"));
  EXPECT_EQ(gz.code, 2);
  EXPECT_NE(gz.err.find("cannot be indexed"), std::string::npos);
  EXPECT_EQ(Visible(dir),
            (std::vector<std::string>{"f.tfrecord", "f.tfrecord.idx",
                                      "g.tfrecord.gz", "other.idx"}));
}

// The demo, with Fashion-MNIST from a --data folder (a copy of Debian's
// package's files, two of them uncompressed) when the package is there.
TEST(CliTest, DemoRunsEndToEnd) {
  TempDir dir;
  const std::string debian = "/usr/share/datasets/fashion-mnist";
  const bool have_fashion =
      std::filesystem::exists(debian + "/train-images-idx3-ubyte.gz");
  std::filesystem::create_directory(dir.File("fm"));
  if (have_fashion) {
    for (const char* name :
         {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"}) {
      std::filesystem::copy_file(debian + "/" + name,
                                 dir.File(std::string("fm/") + name));
    }
    for (const char* name :
         {"t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
      ASSERT_EQ(std::system(("gzip -dc " + debian + "/" + name + ".gz > " +
                             dir.File(std::string("fm/") + name))
                                .c_str()),
                0);
    }
  }
  const Result r = Recflow(
      dir, "demo --json --records 2000 --train-steps 300 --workdir " +
               dir.File("demo") +
               (have_fashion ? " --data " + dir.File("fm") : std::string()));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = r.Json();
  EXPECT_EQ(j["records"], 2000);
  EXPECT_EQ(j["salvaged_records"], 1998);
  EXPECT_EQ(j["problems_found"], 2);
  EXPECT_TRUE(std::filesystem::exists(
      dir.File("demo/shards/sample-00007-of-00008.tfrecord.zst.idx")));
  if (!have_fashion) {
    EXPECT_EQ(j["fashion_mnist_missing"].size(), 4u);
    return;
  }
  const auto& f = j["fashion_mnist"];
  EXPECT_EQ(f["data"], dir.File("fm"));
  EXPECT_EQ(f["records"], 60000);
  // The restored iterator continued with the same batches.
  EXPECT_GT(f["restored_batches_expected"].get<int>(), 0);
  EXPECT_EQ(f["restored_batches_identical"], f["restored_batches_expected"]);
  EXPECT_EQ(f["global_shuffle_records"], 60000);
  // 300 steps of the DNN: well on its way (the full run is the slow
  // test in train_command_test.cc).
  EXPECT_GT(j["test_accuracy"].get<double>(), 0.8);
  EXPECT_EQ(j["global_step"], 300);
  EXPECT_GT(j["examples_per_s"].get<double>(), 0);
  const std::string model_dir = j["model_dir"];
  EXPECT_TRUE(std::filesystem::exists(model_dir + "/model.ckpt-300"));
  EXPECT_TRUE(std::filesystem::exists(model_dir + "/eval"));
}

// A --data folder without the four files is refused before any work,
// naming what is missing and how to get it.
TEST(CliTest, DemoEmptiesOnlyAFolderOfItsOwn) {
  // The demo empties its work folder first: `--workdir .` deleted
  // everything in the current folder.  A folder holding other files, or a
  // file, is refused; an earlier demo's folder (its marker, or only the
  // demo's names) is emptied.
  TempDir dir;
  std::filesystem::create_directory(dir.File("mine"));
  testing::WriteFileBytes(dir.File("mine/thesis.tex"), "precious");
  testing::WriteFileBytes(dir.File("mine/shards"), "a demo name");
  Result r = Recflow(
      dir, "demo --records 100 --train-steps 1 --workdir " + dir.File("mine"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--workdir " + dir.File("mine") +
                       ": holds files the demo did not write (thesis.tex); "),
            std::string::npos)
      << r.err;
  EXPECT_EQ(testing::ReadFileBytes(dir.File("mine/thesis.tex")), "precious");
  testing::WriteFileBytes(dir.File("a-file"), "precious");
  r = Recflow(dir, "demo --workdir " + dir.File("a-file"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("a file, not a folder"), std::string::npos) << r.err;
  EXPECT_EQ(testing::ReadFileBytes(dir.File("a-file")), "precious");
  // A folder from a demo before the marker: only the demo's names.
  std::filesystem::create_directories(dir.File("old/model-cnn"));
  testing::WriteFileBytes(dir.File("old/model-cnn/checkpoint"), "old");
  testing::WriteFileBytes(dir.File("old/sample.tfrecord.zst"), "old");
  for (int run = 0; run < 2; ++run) {  // then its own, marked folder
    r = Recflow(dir, "demo --json --records 100 --train-steps 1 --workdir " +
                         dir.File("old"));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(std::filesystem::exists(dir.File("old/.recflow-demo")));
    EXPECT_FALSE(std::filesystem::exists(dir.File("old/model-cnn")));
  }
}

TEST(CliTest, DemoDataFolderMustHoldFashionMnist) {
  TempDir dir;
  std::filesystem::create_directory(dir.File("fm"));
  testing::WriteFileBytes(dir.File("fm/train-images-idx3-ubyte"), "");
  Result r = Recflow(
      dir, "demo --data " + dir.File("fm") + " --workdir " + dir.File("demo"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(
      r.err.find(dir.File("fm") + ": missing train-labels-idx1-ubyte[.gz], "
                                  "t10k-images-idx3-ubyte[.gz], "
                                  "t10k-labels-idx1-ubyte[.gz]"),
      std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("apt-get install dataset-fashion-mnist"),
            std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir.File("demo")));
  r = Recflow(dir, "demo --data " + dir.File("nowhere"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("nowhere: no such folder"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace recflow::tools
