// The recflow command as a user runs it: exit codes, stdout/stderr, files.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "recflow_runner.h"
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

TEST(CliTest, UsageErrorsExitTwo) {
  TempDir dir;
  EXPECT_EQ(Recflow(dir, "").code, 2);
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
  EXPECT_EQ(Recflow(dir, "reshard --shards 2 --compression gzip --index -o " +
                             dir.File("x") + " " + dir.File("a.tfrecord"))
                .code,
            2);
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
  const Result r = Recflow(dir, "reshard --shards 2 -o " + dir.File("out/s") +
                                    " " + dir.File("good.tfrecord") + " " +
                                    dir.File("bad.tfrecord"));
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(std::filesystem::is_empty(dir.File("out")));
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

TEST(CliTest, DemoRunsEndToEnd) {
  TempDir dir;
  const Result r =
      Recflow(dir, "demo --json --records 2000 --train-steps 300 --workdir " +
                       dir.File("demo"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = r.Json();
  EXPECT_EQ(j["records"], 2000);
  EXPECT_EQ(j["salvaged_records"], 1998);
  EXPECT_EQ(j["problems_found"], 2);
  EXPECT_TRUE(std::filesystem::exists(
      dir.File("demo/shards/sample-00007-of-00008.tfrecord.zst.idx")));
  if (std::filesystem::exists(
          "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")) {
    const auto& f = j["fashion_mnist"];
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
}

}  // namespace
}  // namespace recflow::tools
