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
    // Step graphs are for a GPU (on there by default): the CPU trains as
    // without them, and takes either flag.
    const Result again = Recflow(
        dir, TrainArgs(dir, model, 260) +
                 (model == "dnn" ? " --cuda-graphs" : " --no-cuda-graphs"));
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

// `--model cnn` takes its image's shape from the records' height and
// width (6x8, as `convert idx` writes them), from a square byte count, or
// from --image-shape; the default suite had no CPU run of it.
TEST(TrainCommandTest, CnnTakesItsImageShapeFromTheRecords) {
  TempDir dir;
  uint64_t state = 7;
  const auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return state >> 33;
  };
  for (const char* name : {"train", "eval"}) {
    const int n = std::string(name) == "train" ? 400 : 100;
    std::string images = testing::Be32(0x803) + testing::Be32(n) +
                         testing::Be32(6) + testing::Be32(8);
    std::string labels = testing::Be32(0x801) + testing::Be32(n);
    for (int i = 0; i < n; ++i) {
      const int label = static_cast<int>(next() % 2);  // a row or a column
      const int at = static_cast<int>(next() % 6);
      for (int y = 0; y < 6; ++y) {
        for (int x = 0; x < 8; ++x) {
          const bool bar = label == 0 ? y == at : x == at;
          images.push_back(static_cast<char>(bar ? 250 : next() % 60));
        }
      }
      labels.push_back(static_cast<char>(label));
    }
    testing::WriteFileBytes(dir.File(std::string(name) + "-images"), images);
    testing::WriteFileBytes(dir.File(std::string(name) + "-labels"), labels);
    const Result r =
        Recflow(dir, fmt::format("convert idx --images {} --labels {} -o {}",
                                 dir.File(std::string(name) + "-images"),
                                 dir.File(std::string(name) + "-labels"),
                                 dir.File(name)));
    ASSERT_EQ(r.code, 0) << r.err;
  }
  testing::WriteFileBytes(dir.File("spec.json"), R"({"features": {
      "image": {"kind": "fixed", "dtype": "bytes", "shape": []},
      "height": {"kind": "fixed", "dtype": "int64", "shape": []},
      "width": {"kind": "fixed", "dtype": "int64", "shape": []},
      "label": {"kind": "fixed", "dtype": "int64", "shape": []}}})");
  const auto train = [&](int steps, const std::string& more) {
    return Recflow(
        dir, fmt::format("train --model cnn --spec {} --train {} --eval {} "
                         "--classes 2 --batch 32 --steps {} --eval-every {} "
                         "--learning-rate 0.003 --hidden 16 --json{}",
                         dir.File("spec.json"), dir.File("train-*.tfrecord"),
                         dir.File("eval-*.tfrecord"), steps, steps, more));
  };
  Result r = train(60, " --model-dir " + dir.File("m1"));
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = r.Json();
  // height and width are the image's metadata, not features of their own.
  EXPECT_EQ(j["columns"], " image: image 6x8x1 scaled to [0, 1]");
  EXPECT_GT(j["eval"]["accuracy"].get<double>(), 0.9);
  // Told otherwise, it trains on that shape.
  r = train(2, " --model-dir " + dir.File("m2") + " --image-shape 8,6,1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.Json()["columns"], " image: image 8x6x1 scaled to [0, 1]");
  r = train(2, " --model-dir " + dir.File("m3") + " --image-shape 8,6");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "recflow: --image-shape takes HEIGHT,WIDTH,CHANNELS\n");

  // Without height and width: a square byte count is a one-channel image,
  // any other needs --image-shape.
  testing::WriteFileBytes(
      dir.File("sq.csv"),
      "img,label\nabcdefghijklmnop,0\nqrstuvwxyzABCDEF,1\n");
  testing::WriteFileBytes(dir.File("odd.csv"),
                          "img,label\n" + std::string(24, 'a') + ",0\n" +
                              std::string(24, 'b') + ",1\n");
  for (const char* name : {"sq", "odd"}) {
    ASSERT_EQ(Recflow(dir, fmt::format("convert csv {} -o {}",
                                       dir.File(std::string(name) + ".csv"),
                                       dir.File(name)))
                  .code,
              0);
  }
  testing::WriteFileBytes(dir.File("img.json"), R"({"features": {
      "img": {"kind": "fixed", "dtype": "bytes", "shape": []},
      "label": {"kind": "fixed", "dtype": "int64", "shape": []}}})");
  const auto small = [&](const char* data, const std::string& more) {
    return Recflow(
        dir,
        fmt::format("train --model cnn --spec {} --train {} --eval {} "
                    "--classes 2 --batch 2 --steps 2 --eval-every 2 "
                    "--model-dir {} --json{}",
                    dir.File("img.json"),
                    dir.File(std::string(data) + "-*.tfrecord"),
                    dir.File(std::string(data) + "-*.tfrecord"),
                    dir.File(fmt::format("m-{}{}", data, more.size())), more));
  };
  r = small("sq", "");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.Json()["columns"], " img: image 4x4x1 scaled to [0, 1]");
  r = small("odd", "");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "recflow: feature img holds 24 bytes per example, not a square "
            "image, and the records have no height/width features: give "
            "--image-shape H,W,C (a bytes feature is read as a raw image; "
            "leave text out with --features)\n");
  r = small("odd", " --image-shape 4,6,1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.Json()["columns"], " img: image 4x6x1 scaled to [0, 1]");
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
  // A label that cannot be a class id; --classes below 2 (TrainArgs
  // gives --classes 2).
  EXPECT_EQ(refused(R"({"features": {"x": {"dtype": "float"},
                        "label": {"dtype": "bytes"}}})"),
            "recflow: --label label is bytes in the spec; a classifier of 2 "
            "classes takes int64 class ids in [0, 2) or float 0/1 (make it "
            "int64 in the spec)\n");
  testing::WriteFileBytes(dir.File("float.json"), R"({"features": {
      "x": {"dtype": "float"}, "label": {"dtype": "float"}}})");
  std::string args = TrainArgs(dir, "dnn", 10);
  args.replace(args.find(dir.File("spec.json")), dir.File("spec.json").size(),
               dir.File("float.json"));
  args.replace(args.find("--classes 2"), 11, "");
  r = Recflow(dir, args + " --classes 3");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "recflow: --label label is float32 in the spec; a classifier of 3 "
            "classes takes int64 class ids in [0, 3) (make it int64 in the "
            "spec)\n");
  r = Recflow(dir, args + " --classes 1");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "recflow: --classes 1: a classifier has at least 2 classes\n");
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
