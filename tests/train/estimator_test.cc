// The Estimator end to end on a small synthetic problem: training,
// evaluation, checkpoints and resumption (also after SIGKILL), the hook
// contract, and the files TensorBoard reads.
#include "train/estimator.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "estimator_test_util.h"
#include "pipeline/pipeline_test_util.h"
#include "records/tfrecord_reader.h"
#include "test_util.h"
#include "train/basic_session_run_hooks.h"
#include "train/canned.h"
#include "train/event.pb.h"
#include "train/forwarding_backend.h"
#include "train/layers.h"
#include "train_test_util.h"

namespace recflow::train {
namespace {

namespace fs = std::filesystem;
using pipeline::Dataset;
using pipeline::Element;
using namespace estimator_testing;

std::vector<tensorflow::Event> ReadEvents(const std::string& dir) {
  std::vector<tensorflow::Event> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) != 0)
      continue;
    records::TFRecordReader reader(entry.path().string());
    std::string_view record;
    while (reader.ReadRecord(&record)) {
      tensorflow::Event e;
      EXPECT_TRUE(
          e.ParseFromArray(record.data(), static_cast<int>(record.size())));
      out.push_back(e);
    }
  }
  return out;
}

TEST(EstimatorTest, TrainsEvaluatesAndWritesCheckpointsAndEventFiles) {
  testing::TempDir dir;
  Estimator est(Classifier(), Config(dir.path().string()), Quiet());
  EXPECT_EQ(est.Train(TrainInput(), {}, std::nullopt, 120), 120);
  const auto metrics = est.Evaluate(EvalInput());
  EXPECT_GT(metrics.at("accuracy"), 0.95);
  EXPECT_LT(metrics.at("loss"), 0.3);
  EXPECT_EQ(metrics.at("global_step"), 120);

  // Checkpoints every 10 steps, the last 5 kept, and TF's state file.
  EXPECT_EQ(est.latest_checkpoint(), dir.File("model.ckpt-120"));
  const std::string state = testing::ReadFileBytes(dir.File("checkpoint"));
  EXPECT_EQ(state.find("model_checkpoint_path: \"model.ckpt-120\"\n"), 0u)
      << state;
  EXPECT_NE(state.find("all_model_checkpoint_paths: \"model.ckpt-80\""),
            std::string::npos);
  EXPECT_FALSE(fs::exists(dir.File("model.ckpt-70")));
  const TensorMap ckpt = ReadCheckpoint(dir.File("model.ckpt-120"));
  EXPECT_EQ(ckpt.at("global_step").scalar<int64_t>(), 120);
  EXPECT_EQ(ckpt.at("dense/kernel").shape(), (Shape{2, 16}));
  EXPECT_EQ(ckpt.at("dense_1/bias/Adam/m").shape(), (Shape{3}));
  EXPECT_TRUE(ckpt.count(kIteratorStateKey));

  // Training events: file_version first, loss every 10 steps.
  const auto events = ReadEvents(dir.path().string());
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  std::vector<int64_t> loss_steps;
  for (const auto& e : events) {
    for (const auto& v : e.summary().value()) {
      if (v.tag() == "loss") loss_steps.push_back(e.step());
    }
  }
  ASSERT_GE(loss_steps.size(), 11u);
  EXPECT_EQ(loss_steps[0], 1);
  EXPECT_EQ(loss_steps[1], 11);
  // Evaluation events under eval/, at the checkpoint's step.
  bool accuracy = false;
  for (const auto& e : ReadEvents(dir.File("eval"))) {
    for (const auto& v : e.summary().value()) {
      if (v.tag() == "accuracy") {
        accuracy = true;
        EXPECT_EQ(e.step(), 120);
        EXPECT_NEAR(v.simple_value(), metrics.at("accuracy"), 1e-6);
      }
    }
  }
  EXPECT_TRUE(accuracy);

  // Predict streams the classes of the restored model.
  int64_t predicted = 0, right = 0;
  const Element eval = Clusters(300, 2);
  est.Predict(EvalInput(), [&](const std::map<std::string, Tensor>& p) {
    for (int64_t c : p.at("classes").values<int64_t>()) {
      right += c == eval["label"].values<int64_t>()[predicted++];
    }
    return true;
  });
  EXPECT_EQ(predicted, 300);
  EXPECT_NEAR(double(right) / 300, metrics.at("accuracy"), 1e-9);
}

TEST(EstimatorTest, ResumingContinuesTheStepsAndTheInputStream) {
  testing::TempDir a, b;
  Recorder whole, first, second;
  Estimator(Classifier(16, &whole), Config(a.path().string()), Quiet())
      .Train(TrainInput(), {}, std::nullopt, 30);
  Estimator(Classifier(16, &first), Config(b.path().string()), Quiet())
      .Train(TrainInput(), {}, std::nullopt, 17);
  Estimator resumed(Classifier(16, &second), Config(b.path().string()),
                    Quiet());
  EXPECT_EQ(resumed.Train(TrainInput(), {}, std::nullopt, 30), 30);
  ASSERT_EQ(first.ids.size(), 17u);
  ASSERT_EQ(second.ids.size(), 13u);
  for (size_t i = 0; i < 30; ++i) {
    const auto& got = i < 17 ? first.ids[i] : second.ids[i - 17];
    EXPECT_EQ(got, whole.ids[i]) << "step " << i + 1;
    // The same bits: same seed, same thread count, same numbers (the CPU
    // backend's results do not depend on where the heap puts a buffer).
    const float loss = i < 17 ? first.losses[i] : second.losses[i - 17];
    EXPECT_EQ(loss, whole.losses[i]) << "step " << i + 1;
  }
  // steps adds to the global step; max_steps already reached does nothing.
  EXPECT_EQ(resumed.Train(TrainInput(), {}, 5), 35);
  EXPECT_EQ(resumed.Train(TrainInput(), {}, std::nullopt, 20), 35);
  EXPECT_EQ(second.ids.size(), 18u);
}

// Records the calls the Estimator makes, and stops at a step.
class RecordingHook : public SessionRunHook {
 public:
  RecordingHook(std::vector<std::string>* log, std::string name,
                int64_t stop_at = -1)
      : log_(log), name_(std::move(name)), stop_at_(stop_at) {}
  void begin() override { log_->push_back(name_ + ".begin"); }
  void after_create_session(TrainingSession& s) override {
    log_->push_back(
        fmt::format("{}.after_create_session@{}", name_, s.global_step()));
  }
  SessionRunArgs before_run(RunContext&) override {
    log_->push_back(name_ + ".before_run");
    return {{"global_step", "loss", "first_id"}};
  }
  void after_run(RunContext& ctx, const SessionRunValues& v) override {
    const auto step = static_cast<int64_t>(v.scalar("global_step"));
    log_->push_back(fmt::format("{}.after_run@{}", name_, step));
    EXPECT_EQ(v.results.count("loss"), 1u);
    EXPECT_EQ(v.results.at("first_id").dtype(), DType::kInt64);
    // 600 examples in batches of 32: the last of an epoch holds 24.
    EXPECT_TRUE(v.batch_size == 32 || v.batch_size == 24) << v.batch_size;
    if (step == stop_at_) ctx.request_stop();
  }
  void end(TrainingSession& s) override {
    log_->push_back(fmt::format("{}.end@{}", name_, s.global_step()));
  }
  void on_exception(const std::exception&) override {
    log_->push_back(name_ + ".on_exception");
  }

 private:
  std::vector<std::string>* log_;
  std::string name_;
  int64_t stop_at_;
};

TEST(EstimatorTest, HooksFollowTensorFlowsContract) {
  testing::TempDir dir;
  std::vector<std::string> log;
  Estimator est(Classifier(), Config(dir.path().string()), Quiet());
  Hooks hooks = {std::make_shared<RecordingHook>(&log, "a", 2),
                 std::make_shared<RecordingHook>(&log, "b")};
  EXPECT_EQ(est.Train(TrainInput(), hooks), 2);
  const std::vector<std::string> want = {"a.begin",
                                         "b.begin",
                                         "a.after_create_session@0",
                                         "b.after_create_session@0",
                                         "a.before_run",
                                         "b.before_run",
                                         "a.after_run@1",
                                         "b.after_run@1",
                                         "a.before_run",
                                         "b.before_run",
                                         "a.after_run@2",
                                         "b.after_run@2",
                                         "a.end@2",
                                         "b.end@2"};
  EXPECT_EQ(log, want);
  // The end-of-training checkpoint was written at the stop.
  EXPECT_EQ(est.latest_checkpoint(), dir.File("model.ckpt-2"));

  // The end of the input ends training and calls end().
  log.clear();
  testing::TempDir dir2;
  Estimator finite(Classifier(), Config(dir2.path().string()), Quiet());
  EXPECT_EQ(
      finite.Train(TrainInput(1), {std::make_shared<RecordingHook>(&log, "h")}),
      19);  // ceil(600 / 32)
  EXPECT_EQ(log.back(), "h.end@19");
}

TEST(EstimatorTest, ExceptionsReachHooksAndNanLossesFail) {
  testing::TempDir dir;
  std::vector<std::string> log;
  Estimator est(Classifier(16, nullptr, /*nan_loss=*/true),
                Config(dir.path().string()), Quiet());
  try {
    est.Train(TrainInput(), {std::make_shared<RecordingHook>(&log, "h")});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Model diverged with loss = nan"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(log.back(), "h.on_exception");
}

TEST(EstimatorTest, DamagedLatestCheckpointFallsBackToThePreviousOne) {
  testing::TempDir dir;
  RunConfig config = Config(dir.path().string());
  config.keep_checkpoint_max = 2;
  Estimator(Classifier(), config, Quiet())
      .Train(TrainInput(), {}, std::nullopt, 20);
  EXPECT_FALSE(fs::exists(dir.File("model.ckpt-10")) &&
               fs::exists(dir.File("model.ckpt-20")) &&
               fs::exists(dir.File("model.ckpt-1")));
  // Flip a byte in the middle of the newest checkpoint.
  std::string bytes = testing::ReadFileBytes(dir.File("model.ckpt-20"));
  bytes[bytes.size() / 2] ^= 0x40;
  testing::WriteFileBytes(dir.File("model.ckpt-20"), bytes);
  std::vector<std::string> warnings;
  EstimatorOptions options;
  options.log = [&](std::string_view line) { warnings.emplace_back(line); };
  Estimator est(Classifier(), config, options);
  EXPECT_EQ(est.Evaluate(EvalInput()).at("global_step"), 10);
  bool warned = false;
  for (const auto& w : warnings) {
    warned |= w.find("WARNING: skipping checkpoint") != std::string::npos &&
              w.find("model.ckpt-20") != std::string::npos &&
              w.find("CRC") != std::string::npos;
  }
  EXPECT_TRUE(warned);
}

TEST(EstimatorTest, ACheckpointOfAnotherModelIsRefusedClearly) {
  testing::TempDir dir;
  Estimator(Classifier(16), Config(dir.path().string()), Quiet())
      .Train(TrainInput(), {}, std::nullopt, 3);
  Estimator other(Classifier(8), Config(dir.path().string()), Quiet());
  try {
    other.Train(TrainInput(), {}, 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dense/kernel as float32 [2, 16]"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("[2, 8]"), std::string::npos);
  }
}

// A checkpoint's input position saved from one input_fn cannot continue
// another (here: batches of 16 instead of 32); training goes on from that
// input's start and says so, as TensorFlow's Estimator always starts.
TEST(EstimatorTest, AnInputPositionForAnotherInputRestartsItWithAWarning) {
  testing::TempDir dir;
  Estimator(Classifier(16), Config(dir.path().string()), Quiet())
      .Train(TrainInput(), {}, std::nullopt, 10);
  std::vector<std::string> log;
  EstimatorOptions o;
  o.log = [&](std::string_view line) { log.emplace_back(line); };
  Recorder rec, fresh;
  const InputFn sixteen = [] {
    return Dataset::FromTensorSlices(Clusters(600, 1))
        .Shuffle(200, 5)
        .Batch(16);
  };
  Estimator resumed(Classifier(16, &rec), Config(dir.path().string()), o);
  EXPECT_EQ(resumed.Train(sixteen, {}, std::nullopt, 13), 13);
  const auto warning = std::find_if(log.begin(), log.end(), [](auto& line) {
    return line.find(
               "WARNING: the checkpoint's input position does not fit "
               "this input_fn (") == 0;
  });
  ASSERT_NE(warning, log.end());
  EXPECT_NE(warning->find("reading the input from its start"),
            std::string::npos);
  testing::TempDir other;
  Estimator(Classifier(16, &fresh), Config(other.path().string()), Quiet())
      .Train(sixteen, {}, std::nullopt, 3);
  ASSERT_EQ(rec.ids.size(), 3u);
  EXPECT_EQ(rec.ids, fresh.ids);  // the new input, from its first batch
}

// Misuses of the Estimator and its hooks are errors that say what is
// wrong, never a crash or a silent default.
TEST(EstimatorTest, MisuseIsRefusedByName) {
  testing::TempDir dir;
  const std::string model_dir = dir.path().string();
  const auto error = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  Estimator est(Classifier(16), Config(model_dir), Quiet());
  EXPECT_EQ(error([&] { est.Train(TrainInput(), {}, 5, 10); }),
            "Train: give steps or max_steps, not both");
  EXPECT_EQ(error([&] { est.Train(TrainInput(), {}, 0); }),
            "Train: steps and max_steps must be positive");
  EXPECT_EQ(
      error([&] { est.TrainAndEvaluate(TrainInput(), EvalInput(), 5, 0); }),
      "TrainAndEvaluate: eval_every_steps must be positive");
  EXPECT_EQ(
      error(
          [&] { est.Predict(EvalInput(), [](const auto&) { return true; }); }),
      "predict: no checkpoint in " + model_dir + "; train the model first");
  const InputFn unlabelled = [] {
    return Dataset::FromTensorSlices(Clusters(64, 1))
        .Map([](Element e) {
          Element out;
          out.Set("x", e["x"]);
          out.Set("id", e["id"]);
          return out;
        })
        .Batch(32);
  };
  EXPECT_EQ(error([&] { est.Train(unlabelled, {}, 1); }),
            "train: the input has no label \"label\" (it has: x id)");

  // A hook that fetches what the model does not provide, or reads what it
  // did not fetch.
  struct Fetching : SessionRunHook {
    std::string fetch, read;
    SessionRunArgs before_run(RunContext&) override { return {{fetch}}; }
    void after_run(RunContext&, const SessionRunValues& v) override {
      v.scalar(read);
    }
  };
  auto hook = std::make_shared<Fetching>();
  hook->fetch = "nope";
  hook->read = "nope";
  EXPECT_EQ(error([&] { est.Train(TrainInput(), {hook}, 1); }),
            "a hook fetches \"nope\", which the model_fn does not provide "
            "(loss, global_step, its predictions and tensors)");
  hook->fetch = "loss";
  hook->read = "global_step";
  EXPECT_EQ(error([&] { est.Train(TrainInput(), {hook}, 1); }),
            "hook asked for \"global_step\", which was not fetched");

  // A model_fn without a loss or a train_op in training, or without
  // predictions in prediction.
  const auto broken = [](bool loss, bool train_op) {
    return [=](const Features& f, const Tensor* labels, Mode mode,
               ModelContext& ctx) {
      EstimatorSpec spec = Classifier(4)(
          f, mode == Mode::kPredict ? nullptr : labels, mode, ctx);
      if (!loss) spec.loss = Var();
      if (!train_op) spec.train_op = nullptr;
      spec.predictions.clear();
      return spec;
    };
  };
  testing::TempDir a, b;
  Estimator no_loss(broken(false, true), Config(a.path().string()), Quiet());
  EXPECT_EQ(error([&] { no_loss.Train(TrainInput(), {}, 1); }),
            "model_fn returned no loss in train mode");
  EXPECT_EQ(error([&] { no_loss.Evaluate(EvalInput()); }),
            "model_fn returned no loss in eval mode");
  Estimator no_op(broken(true, false), Config(b.path().string()), Quiet());
  EXPECT_EQ(error([&] { no_op.Train(TrainInput(), {}, 1); }),
            "model_fn returned no train_op in train mode");
  Estimator(Classifier(4), Config(b.path().string()), Quiet())
      .Train(TrainInput(), {}, 1);
  EXPECT_EQ(error([&] {
              no_op.Predict(EvalInput(), [](const auto&) { return true; });
            }),
            "model_fn returned no predictions in infer mode");

  // Evaluating before any checkpoint works on fresh variables, and says so.
  testing::TempDir c;
  std::vector<std::string> log;
  EstimatorOptions o;
  o.log = [&](std::string_view line) { log.emplace_back(line); };
  Estimator fresh(Classifier(16), Config(c.path().string()), o);
  EXPECT_EQ(fresh.Evaluate(EvalInput()).count("accuracy"), 1u);
  EXPECT_NE(
      std::find(log.begin(), log.end(),
                "WARNING: evaluating without a checkpoint in " +
                    c.path().string() + ": the model is freshly initialised"),
      log.end());
}

// An error of a model_fn's train op names the batch by the global step
// it was to train; an error of a subclass (CudaUnavailable, which the
// CLI tells apart by type) passes as it is.
TEST(EstimatorTest, AStepsErrorNamesItsGlobalStep) {
  const auto failing_at = [](int64_t step, bool unavailable) {
    return [=](const Features& f, const Tensor* labels, Mode mode,
               ModelContext& ctx) {
      EstimatorSpec spec = Classifier(4)(f, labels, mode, ctx);
      const std::function<void()> op = spec.train_op;
      const int64_t* global_step = ctx.mutable_global_step();
      spec.train_op = [=] {
        if (*global_step + 1 == step) {
          if (unavailable) throw CudaUnavailable("no GPU");
          throw Error("the op failed");
        }
        op();
      };
      return spec;
    };
  };
  testing::TempDir a, b;
  Estimator failing(failing_at(3, false), Config(a.path().string()), Quiet());
  try {
    failing.Train(TrainInput(), {}, 5);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "the batch of global step 3: the op failed");
  }
  Estimator no_gpu(failing_at(2, true), Config(b.path().string()), Quiet());
  EXPECT_THROW(
      {
        try {
          no_gpu.Train(TrainInput(), {}, 5);
        } catch (const CudaUnavailable& e) {
          EXPECT_STREQ(e.what(), "no GPU");
          throw;
        }
      },
      CudaUnavailable);
}

// Run by SurvivesSigkill in a child process; skipped otherwise.  Trains
// forever, checkpointing every 7 steps, and appends each step's first id
// to a log file.
TEST(EstimatorTest, SigkillChild) {
  const char* dir = std::getenv("RECFLOW_SIGKILL_TEST_DIR");
  if (dir == nullptr) GTEST_SKIP() << "runs in a child of SurvivesSigkill";
  RunConfig config = Config(std::string(dir) + "/model");
  config.save_checkpoints_steps = 7;
  Estimator est(Classifier(), config, Quiet());
  est.Train(TrainInput(), {}, std::nullopt, 1'000'000);
}

TEST(EstimatorTest,
     SurvivesSigkillAndContinuesTheInputWhereTheCheckpointLeftIt) {
  testing::TempDir dir;
  const std::string model = dir.File("model");
  // Only async-signal-safe calls between fork and exec.
  setenv("RECFLOW_SIGKILL_TEST_DIR", dir.path().c_str(), 1);
  const pid_t pid = fork();
  if (pid == 0) {
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    dup2(null, 2);
    execl("/proc/self/exe", "estimator_test",
          "--gtest_filter=EstimatorTest.SigkillChild", nullptr);
    _exit(127);
  }
  unsetenv("RECFLOW_SIGKILL_TEST_DIR");
  ASSERT_GE(pid, 0);
  // Kill it at a point that depends on timing: once a checkpoint past step
  // 20 exists, plus a few milliseconds into whatever it does next.
  CheckpointManager watch(model, 5);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    const auto latest = watch.Latest();
    if (latest && CheckpointStep(*latest) >= 21) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(3));
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the child ended on its own: " << status;

  // The killed run's newest checkpoint is intact; resume from it.
  const auto latest = watch.Latest();
  ASSERT_TRUE(latest);
  const int64_t at = CheckpointStep(*latest);
  ASSERT_GE(at, 21);
  ASSERT_EQ(ReadCheckpoint(*latest).at("global_step").scalar<int64_t>(), at);
  Recorder resumed, reference;
  RunConfig config = Config(model);
  config.save_checkpoints_steps = 7;
  Estimator(Classifier(16, &resumed), config, Quiet())
      .Train(TrainInput(), {}, std::nullopt, at + 10);
  testing::TempDir fresh;
  Estimator(Classifier(16, &reference), Config(fresh.path().string()), Quiet())
      .Train(TrainInput(), {}, std::nullopt, at + 10);
  ASSERT_EQ(resumed.ids.size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(resumed.ids[i], reference.ids[static_cast<size_t>(at) + i])
        << "step " << at + 1 + static_cast<int64_t>(i);
    EXPECT_EQ(resumed.losses[i], reference.losses[static_cast<size_t>(at) + i])
        << "step " << at + 1 + static_cast<int64_t>(i);
  }
}

// TF 1.x baked from_tensor_slices arrays into the GraphDef and failed past
// 2 GiB.  Here the array is a view the input streams from: a 2.25 GiB
// array trains, and the checkpoint holds the model only.  Label slow (it
// allocates and fills 2.25 GiB).
TEST(EstimatorSlowTest, TrainsOnAnArrayLargerThan2GiBWithSmallCheckpoints) {
  testing::TempDir dir;
  constexpr int64_t kRows = int64_t{9} << 20, kCols = 64;  // 2.25 GiB floats
  auto x =
      std::make_shared<std::vector<float>>(static_cast<size_t>(kRows * kCols));
  auto labels =
      std::make_shared<std::vector<int64_t>>(static_cast<size_t>(kRows));
  for (int64_t r = 0; r < kRows; ++r) {
    const float v = static_cast<float>(r % 3);
    std::fill_n(x->data() + r * kCols, kCols, v);
    (*labels)[static_cast<size_t>(r)] = r % 3;
  }
  Element arrays;
  arrays.Set("x",
             Tensor::View(DType::kFloat32, Shape{kRows, kCols}, x->data(), x));
  arrays.Set("label",
             Tensor::View(DType::kInt64, Shape{kRows}, labels->data(), labels));
  ASSERT_GT(arrays.byte_size(), size_t{2} << 30);
  auto model = [](const Features& f, const Tensor* l, Mode mode,
                  ModelContext& ctx) {
    Var logits =
        layers::Dense(ctx, ops::Constant(ctx.backend(), f["x"]), {.units = 3});
    EstimatorSpec spec;
    spec.loss = ops::SparseSoftmaxCrossEntropy(ctx.backend(), logits, *l);
    if (mode == Mode::kTrain) {
      spec.train_op = std::make_shared<SGD>(0.1f)->Minimize(ctx, spec.loss);
    }
    return spec;
  };
  Estimator est(model, Config(dir.path().string()), Quiet());
  est.Train(
      [&] {
        return Dataset::FromTensorSlices(arrays).Shuffle(10000, 1).Batch(256);
      },
      {}, std::nullopt, 50);
  const auto size = fs::file_size(dir.File("model.ckpt-50"));
  // The 64x3 kernel, bias and step, and the iterator's position, which
  // holds the 10,000 buffered slices of the shuffle (3.5 MB): bounded by
  // the shuffle buffer, not by the 2.25 GiB array.
  EXPECT_LT(size, uint64_t{4} << 20) << size;
  std::printf("checkpoint: %llu bytes\n",
              static_cast<unsigned long long>(size));
}

// Under MPI, "cuda" is the GPU of the rank's local index (one GPU per
// rank on a host); "cuda:N" stays GPU N.  Where there is no GPU 1 the
// backend's one-line error names the GPU asked for.
TEST(EstimatorTest, CudaIsTheGpuOfTheRanksLocalIndex) {
  recflow::testing::TempDir dir;
  for (const auto& [device, gpu] :
       std::vector<std::pair<std::string, std::string>>{{"cuda", "cuda:1"},
                                                        {"cuda:0", "cuda:0"}}) {
    SCOPED_TRACE(device);
    RunConfig config = Config(dir.path().string());
    config.device = device;
    EstimatorOptions options = Quiet();
    options.collective = std::make_shared<testing::FakeWorld>(2, 1);
    try {
      Estimator est(Classifier(), config, options);
      EXPECT_NE(est.backend().name().find(gpu), std::string::npos)
          << est.backend().name();
    } catch (const CudaUnavailable& e) {
      EXPECT_NE(std::string(e.what()).find(gpu), std::string::npos) << e.what();
    }
  }
}

// Fetches `names` after every step and keeps the last values.
class FetchHook : public SessionRunHook {
 public:
  explicit FetchHook(std::vector<std::string> names)
      : names_(std::move(names)) {}
  SessionRunArgs before_run(RunContext&) override { return {names_}; }
  void after_run(RunContext&, const SessionRunValues& v) override {
    last = v.results;
  }
  std::map<std::string, Tensor> last;

 private:
  std::vector<std::string> names_;
};

// In training the multi-class head computes its probabilities and classes
// only for a hook that fetches them (as a session runs only fetched ops);
// fetched, they are there and right.
TEST(EstimatorTest, TrainingComputesOnlyThePredictionsAHookFetches) {
  const ModelFn dnn =
      DNNClassifierFn({.hidden_units = {8},
                       .columns = {NumericColumn("x", Shape{2})},
                       .n_classes = 3});
  std::vector<std::vector<std::string>> seen;  // per training step
  const ModelFn fn = [&](const Features& f, const Tensor* labels, Mode mode,
                         ModelContext& ctx) {
    EstimatorSpec spec = dnn(f, labels, mode, ctx);
    if (mode == Mode::kTrain) {
      std::vector<std::string> names;
      for (const auto& [name, t] : spec.predictions) names.push_back(name);
      seen.push_back(names);
    }
    return spec;
  };
  recflow::testing::TempDir dir;
  Estimator quiet(fn, Config((dir.path() / "a").string()), Quiet());
  quiet.Train(TrainInput(), {}, std::nullopt, 3);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen.back(), std::vector<std::string>{"logits"});

  seen.clear();
  auto hook = std::make_shared<FetchHook>(
      std::vector<std::string>{"probabilities", "classes"});
  Estimator fetching(fn, Config((dir.path() / "b").string()), Quiet());
  fetching.Train(TrainInput(), {hook}, std::nullopt, 3);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen.back(),
            (std::vector<std::string>{"classes", "logits", "probabilities"}));
  const Tensor& p = hook->last.at("probabilities");
  const Tensor& c = hook->last.at("classes");
  ASSERT_EQ(p.shape(), (Shape{32, 3}));
  for (int64_t r = 0; r < 32; ++r) {
    const float* row = p.data<float>() + r * 3;
    EXPECT_NEAR(row[0] + row[1] + row[2], 1.0f, 1e-5f) << r;
    const int64_t best = std::max_element(row, row + 3) - row;
    EXPECT_EQ(c.data<int64_t>()[r], best) << r;
  }
  // Evaluation computes them all, fetched or not.
  EXPECT_GT(fetching.Evaluate(EvalInput()).at("accuracy"), 0.0);
}

// What the Estimator asks of its backend: the input delivered in the
// backend's InputMemory (a GPU's pinned memory), every training step
// between BeginStep and EndStep with all its kernel calls inside,
// AbortStep for a step that throws, step graphs as the RunConfig says;
// evaluation is not bracketed.
class StepSpy final : public ForwardingBackend {
 public:
  StepSpy()
      : ForwardingBackend(MakeCpuBackend(1)),
        memory(std::make_shared<recflow::testing::RecordingMemory>()) {}
  std::shared_ptr<pipeline::Allocator> InputMemory() override { return memory; }
  void Prefetch(const pipeline::Element& e) override {
    ++prefetched;
    outside += recflow::testing::OutsideMemory(e, *memory);
    ForwardingBackend::Prefetch(e);
  }
  void BeginStep() override {
    log += 'B';
    in_step = true;
  }
  void EndStep() override {
    log += 'E';
    in_step = false;
  }
  void AbortStep() override {
    log += 'A';
    in_step = false;
  }
  void SetStepGraphs(bool on) override { graphs = on; }
  void SetInputInPlace(bool on) override { in_place = on; }
  std::function<void(const pipeline::Element&)> InputStager() override {
    ++stagers;
    return [this](const pipeline::Element&) { ++staged; };
  }
  void Around(CallKind, const Call& call) override {
    ++(in_step ? calls_in_steps : calls_outside);
    call();
  }

  std::shared_ptr<recflow::testing::RecordingMemory> memory;
  std::string log;  // B, E, A per call
  std::string outside;
  int prefetched = 0, calls_in_steps = 0, calls_outside = 0;
  bool in_step = false, graphs = false, in_place = true;
  int stagers = 0;              // InputStager() calls
  std::atomic<int> staged = 0;  // its functions' calls (pipeline threads)
};

TEST(EstimatorTest, BracketsEachTrainingStepAndTakesInputInTheBackendsMemory) {
  recflow::testing::TempDir dir;
  auto spy = std::make_shared<StepSpy>();
  EstimatorOptions options = Quiet();
  options.backend = spy;
  RunConfig config = Config(dir.path().string());
  Estimator est(Classifier(16), config, options);
  EXPECT_TRUE(spy->graphs);     // on by default
  EXPECT_FALSE(spy->in_place);  // off by default
  EXPECT_EQ(est.Train(TrainInput(), {}, std::nullopt, 6), 6);
  EXPECT_EQ(spy->log, "BEBEBEBEBEBE");
  EXPECT_EQ(spy->prefetched, 6);
  // Each batch staged by the input's thread before Prefetch took it.
  EXPECT_EQ(spy->stagers, 1);
  EXPECT_GE(spy->staged.load(), 6);
  EXPECT_EQ(spy->outside, "");  // "x", "id" and "label" all there
  EXPECT_GE(spy->calls_in_steps, 6 * 8);
  EXPECT_EQ(spy->calls_outside, 0);
  EXPECT_GT(spy->memory->allocations(), 0u);
  EXPECT_EQ(spy->memory->live(), 0u);  // the input's blocks all came back

  est.Evaluate(EvalInput());
  EXPECT_EQ(spy->log, "BEBEBEBEBEBE");
  EXPECT_GT(spy->calls_outside, 0);

  // Resumed at 6: steps 6 and 7 end, step 8 throws inside its bracket.
  const ModelFn throwing = [](const Features& f, const Tensor* labels,
                              Mode mode, ModelContext& ctx) {
    EstimatorSpec spec = Classifier(16)(f, labels, mode, ctx);
    if (ctx.global_step() == 8) throw Error("step 8 fails");
    return spec;
  };
  Estimator failing(throwing, config, options);
  spy->log.clear();
  EXPECT_THROW(failing.Train(TrainInput(), {}, std::nullopt, 20), Error);
  EXPECT_EQ(spy->log, "BEBEBA");
  config.cuda_graphs = false;
  Estimator plain(Classifier(16), config, options);
  EXPECT_FALSE(spy->graphs);

  // Input read in place: asked of the backend, and nothing staged.
  config.read_input_in_place = true;
  config.model_dir = (dir.path() / "in_place").string();
  Estimator in_place(Classifier(16), config, options);
  EXPECT_TRUE(spy->in_place);
  const int stagers = spy->stagers;
  const int staged = spy->staged.load();
  EXPECT_EQ(in_place.Train(TrainInput(), {}, std::nullopt, 4), 4);
  EXPECT_EQ(spy->stagers, stagers);
  EXPECT_EQ(spy->staged.load(), staged);
}

}  // namespace
}  // namespace recflow::train
