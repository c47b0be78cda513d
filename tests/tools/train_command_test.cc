// `recflow train` on real files: converts a CSV, trains, resumes on rerun,
// survives SIGKILL, and refuses bad arguments clearly.  And the demo's
// training targets (label slow: minutes).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>

#include "recflow_runner.h"
#include "test_util.h"

namespace recflow::tools {
namespace {

using testing::Recflow;
using testing::Result;
using testing::TempDir;

// Two numeric features; label 1 when x + 2y > 0.5 (linearly separable).
void WriteDataset(const TempDir& dir) {
  uint64_t state = 1;
  for (const char* name : {"train", "eval"}) {
    std::string csv = "x,y,label\n";
    const int rows = std::string(name) == "train" ? 2000 : 500;
    for (int i = 0; i < rows; ++i) {
      state = state * 6364136223846793005ULL + 1;
      const double x = double(state >> 40) / double(1 << 24) * 2 - 1;
      state = state * 6364136223846793005ULL + 1;
      const double y = double(state >> 40) / double(1 << 24) * 2 - 1;
      csv += fmt::format("{:.5f},{:.5f},{}\n", x, y, x + 2 * y > 0.5 ? 1 : 0);
    }
    testing::WriteFileBytes(dir.File(std::string(name) + ".csv"), csv);
    const Result r = Recflow(
        dir, fmt::format("convert csv {} -o {} -n 2",
                         dir.File(std::string(name) + ".csv"), dir.File(name)));
    ASSERT_EQ(r.code, 0) << r.err;
  }
  testing::WriteFileBytes(dir.File("spec.json"), R"({"features": {
      "x": {"kind": "fixed", "dtype": "float", "shape": []},
      "y": {"kind": "fixed", "dtype": "float", "shape": []},
      "label": {"kind": "fixed", "dtype": "int64", "shape": []}}})");
}

std::string TrainArgs(const TempDir& dir, const std::string& model, int steps) {
  return fmt::format(
      "train --model {} --spec {} --train {} --eval {} --model-dir {} "
      "--classes 2 --batch 32 --steps {} --eval-every 100 "
      "--learning-rate 0.05 --hidden 8 --save-checkpoints-steps 20 --json",
      model, dir.File("spec.json"), dir.File("train-*.tfrecord"),
      dir.File("eval-*.tfrecord"), dir.File("model-" + model), steps);
}

TEST(TrainCommandTest, TrainsEvaluatesAndResumesOnRerun) {
  TempDir dir;
  WriteDataset(dir);
  for (const std::string model : {"linear", "dnn"}) {
    SCOPED_TRACE(model);
    const Result first = Recflow(dir, TrainArgs(dir, model, 200));
    ASSERT_EQ(first.code, 0) << first.err;
    auto j = first.Json();
    EXPECT_EQ(j["global_step"], 200);
    EXPECT_EQ(j["start_step"], 0);
    EXPECT_GT(j["eval"]["accuracy"].get<double>(), 0.93);
    EXPECT_GT(j["eval"]["auc"].get<double>(), 0.97);
    EXPECT_TRUE(j["eval"].contains("precision"));
    EXPECT_TRUE(std::filesystem::exists(
        dir.File("model-" + model + "/model.ckpt-200")));
    EXPECT_EQ(j["cuda_graph_launches"], 0);
    // --cuda-graphs is for a GPU: the CPU trains as without it.
    const Result again =
        Recflow(dir, TrainArgs(dir, model, 260) + " --cuda-graphs");
    ASSERT_EQ(again.code, 0) << again.err;
    j = again.Json();
    EXPECT_EQ(j["start_step"], 200);
    EXPECT_EQ(j["global_step"], 260);
    EXPECT_EQ(j["cuda_graph_launches"], 0);
  }
}

TEST(TrainCommandTest, SigkilledTrainingResumesFromItsLastCheckpoint) {
  TempDir dir;
  WriteDataset(dir);
  const std::string cmd =
      fmt::format("exec {} {} > {} 2>&1", RECFLOW_BINARY,
                  TrainArgs(dir, "dnn", 1'000'000), dir.File("killed.log"));
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), nullptr);
    _exit(127);
  }
  const std::string state = dir.File("model-dnn/checkpoint");
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  auto saved_60 = [&] {
    return std::filesystem::exists(state) &&
           testing::ReadFileBytes(state).find("model.ckpt-60\"") !=
               std::string::npos;
  };
  while (std::chrono::steady_clock::now() < deadline && !saved_60()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status))
      << testing::ReadFileBytes(dir.File("killed.log"));
  const std::string text = testing::ReadFileBytes(state);
  const size_t at = text.find("model.ckpt-") + 11;
  const int saved = std::stoi(text.substr(at));
  ASSERT_GE(saved, 60);
  // No temporary or partial checkpoint under a final name: every file the
  // state names reads back.
  const Result resumed = Recflow(dir, TrainArgs(dir, "dnn", saved + 40));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  const auto j = resumed.Json();
  EXPECT_EQ(j["start_step"], saved);
  EXPECT_EQ(j["global_step"], saved + 40);
  EXPECT_GT(j["eval"]["accuracy"].get<double>(), 0.9);
}

TEST(TrainCommandTest, SigtermCheckpointsAndExitsCleanly) {
  TempDir dir;
  WriteDataset(dir);
  const std::string cmd = fmt::format("exec {} {} > {} 2> {}", RECFLOW_BINARY,
                                      TrainArgs(dir, "dnn", 1'000'000),
                                      dir.File("out.json"), dir.File("err"));
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), nullptr);
    _exit(127);
  }
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline &&
         !std::filesystem::exists(dir.File("model-dnn/checkpoint"))) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << testing::ReadFileBytes(dir.File("err"));
  Result r{0, testing::ReadFileBytes(dir.File("out.json")), ""};
  const auto j = r.Json();
  EXPECT_TRUE(j["preempted"].get<bool>());
  const int64_t step = j["global_step"];
  EXPECT_TRUE(std::filesystem::exists(
      dir.File(fmt::format("model-dnn/model.ckpt-{}", step))));
}

TEST(TrainCommandTest, BadArgumentsAreRefusedClearly) {
  TempDir dir;
  WriteDataset(dir);
  Result r = Recflow(dir, TrainArgs(dir, "cnn", 10));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--model cnn needs an image"), std::string::npos)
      << r.err;
  r = Recflow(dir, TrainArgs(dir, "dnn", 10) + " --label nothing");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("no FixedLen scalar feature nothing"), std::string::npos)
      << r.err;
  // --features naming what the spec lacks (a typo), or the label.
  r = Recflow(dir, TrainArgs(dir, "dnn", 10) + " --features x,yy");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "recflow: --features names yy, which the spec does not have (it "
            "has label, x, y)\n");
  r = Recflow(dir, TrainArgs(dir, "dnn", 10) + " --features x,label");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "recflow: --features names label, the label: a model does not take "
            "its label as a feature\n");
  // Specs the canned models cannot take, each refused before training.
  const auto refused = [&](const std::string& spec, int steps = 10) {
    testing::WriteFileBytes(dir.File("bad.json"), spec);
    std::string args = TrainArgs(dir, "dnn", steps);
    args.replace(args.find(dir.File("spec.json")), dir.File("spec.json").size(),
                 dir.File("bad.json"));
    const Result bad = Recflow(dir, args);
    EXPECT_EQ(bad.code, 2) << spec;
    return bad.err;
  };
  EXPECT_EQ(refused(R"({"features": {"x": {"kind": "var", "dtype": "float"},
                        "label": {"dtype": "int64"}}})"),
            "recflow: feature x is VarLen; the canned models take FixedLen "
            "features (leave it out with --features)\n");
  EXPECT_EQ(refused(R"({"features": {"label": {"dtype": "int64"}}})"),
            "recflow: no features to train on: the spec holds only the label "
            "label\n");
  EXPECT_EQ(refused(R"({"features": {"x": {"dtype": "float"},
                        "b": {"dtype": "bytes", "shape": [2]},
                        "label": {"dtype": "int64"}}})"),
            "recflow: feature b: bytes features are taken as one raw image "
            "each; this one has shape [2]\n");
  EXPECT_EQ(refused(R"({"features": {"x": {"dtype": "float"},
                        "label": {"dtype": "int64"}}})",
                    /*steps=*/0),
            "--steps: expected a positive number, not 0\nRun with --help for "
            "more information.\n");
}

// --model-dir's missing folders are made; one that cannot be made is one
// line naming it.
TEST(TrainCommandTest, ModelDirFoldersAreCreated) {
  TempDir dir;
  WriteDataset(dir);
  std::string args = TrainArgs(dir, "linear", 5);
  const std::string nested = dir.File("runs/2026/linear");
  args.replace(args.find(dir.File("model-linear")),
               dir.File("model-linear").size(), nested);
  Result r = Recflow(dir, args);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(std::filesystem::exists(nested + "/checkpoint"));
  // What it wrote for TensorBoard, read back by `recflow summary`.
  r = Recflow(dir, "summary --json " + nested);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto runs = r.Json()["runs"];
  ASSERT_EQ(runs.size(), 2u) << r.out;
  EXPECT_EQ(runs[0]["run"], ".");
  EXPECT_GE(runs[0]["tags"]["loss"]["points"].get<int>(), 1);
  EXPECT_EQ(runs[1]["run"], "eval");
  EXPECT_EQ(runs[1]["tags"]["accuracy"]["last_step"], 5);
  testing::WriteFileBytes(dir.File("plain"), "");
  args.replace(args.find(nested), nested.size(), dir.File("plain/run"));
  r = Recflow(dir, args);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(dir.File("plain/run")), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

// The issue's targets, on 2 cores: the DNN >= 88% and the CNN >= 90% on
// Fashion-MNIST's test set, each within 5 minutes of training.  Minutes:
// label slow (ctest -L slow).
TEST(TrainCommandSlowTest, DemoMeetsTheFashionMnistTargets) {
  if (!std::filesystem::exists(
          "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  }
  for (const auto& [model, target] :
       {std::pair<std::string, double>{"dnn", 0.88}, {"cnn", 0.90}}) {
    TempDir dir;
    const Result r = Recflow(
        dir, fmt::format("demo --json --records 1000 --model {} --workdir {}",
                         model, dir.File("demo")));
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = r.Json();
    EXPECT_GE(j["test_accuracy"].get<double>(), target) << model;
    EXPECT_LE(j["train_seconds"].get<double>(), 300) << model;
    fmt::print(
        "{}: test accuracy {:.4f}, {:.1f} s of training, {:.0f} "
        "examples/s\n",
        model, j["test_accuracy"].get<double>(),
        j["train_seconds"].get<double>(), j["examples_per_s"].get<double>());
  }
}

}  // namespace
}  // namespace recflow::tools
