// Data-parallel training over MPI, run by ctest as `mpirun -np 2` (test
// train.distributed; label mpi): the collectives, 2 ranks x batch B against
// 1 process x batch 2B, every record once per epoch across a restart with
// another number of ranks (2 -> 1 and 1 -> 2), collective stops and the
// evaluation's reduction.  Every rank runs every test; rank 0 makes the
// files and checks what only it can see.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "pipeline/dataset.h"
#include "records/example_builder.h"
#include "test_util.h"
#include "train/canned.h"
#include "train/checkpoint.h"
#include "train/collective.h"
#include "train/estimator.h"

namespace recflow::train {
namespace {

using pipeline::Dataset;

constexpr int64_t kRecords = 45;  // neither 2 nor 4 divides it

records::FeatureSpec Spec() {
  return records::FeatureSpec::FromJsonText(R"({"features": {
      "id": {"kind": "fixed", "dtype": "int64", "shape": []},
      "x": {"kind": "fixed", "dtype": "float", "shape": [3]},
      "label": {"kind": "fixed", "dtype": "int64", "shape": []}}})");
}

// Counts the records each training step of this rank saw, by id.
struct Seen {
  std::vector<int64_t> counts = std::vector<int64_t>(kRecords);
};

// hidden_units {128, 128} gives a kernel of 16,384 values, which is
// all-reduced where it is; smaller gradients are packed into one buffer.
ModelFn CountingDnn(Seen* seen, std::vector<int64_t> hidden = {6}) {
  ModelFn dnn = DNNClassifierFn({.hidden_units = std::move(hidden),
                                 .columns = {NumericColumn("x", Shape{3})},
                                 .n_classes = 3,
                                 .optimizer = "adam",
                                 .learning_rate = ConstantLearningRate(0.02f)});
  return [dnn, seen](const Features& f, const Tensor* labels, Mode mode,
                     ModelContext& ctx) {
    if (mode == Mode::kTrain && seen != nullptr) {
      const Tensor& ids = f["id"];
      for (int64_t i = 0; i < ids.num_elements(); ++i) {
        ++seen->counts.at(static_cast<size_t>(ids.data<int64_t>()[i]));
      }
    }
    return dnn(f, labels, mode, ctx);
  };
}

// A checksum of every variable at the end of training, to compare ranks.
class ChecksumHook : public SessionRunHook {
 public:
  void end(TrainingSession& session) override {
    sum = 0;
    for (Variable* v : session.variables().all()) {
      for (int64_t i = 0; i < v->size(); ++i) {
        sum += v->data()[i] * static_cast<double>(1 + i % 7);
      }
    }
  }
  double sum = 0;
};

class DistributedTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (LaunchedByMpi() && MpiBuilt()) world_ = MpiWorld();
  }

  void SetUp() override {
    if (!world_ || world_->size() != 2) {
      GTEST_SKIP() << "needs 2 MPI ranks: ctest runs it as `mpirun -np 2` "
                      "(test train.distributed)";
    }
    if (world_->is_chief()) {
      dir_ = std::make_unique<testing::TempDir>();
      root_ = dir_->path().string();
      for (int f = 0; f < 2; ++f) {
        std::vector<std::string> recs;
        for (int64_t id = f * 20; id < (f == 0 ? 20 : kRecords); ++id) {
          records::ExampleBuilder b;
          const int64_t label = id % 3;
          b.AddInt64("id", id).AddInt64("label", label);
          b.AddFloatList(
              "x", std::vector<float>{float(label) + 0.1f * float(id % 5),
                                      float(id % 4) * 0.3f, -float(label)});
          recs.emplace_back(b.Serialize());
        }
        testing::WriteRecords(File(fmt::format("d{}.tfrecord", f)), recs);
      }
    }
    world_->Broadcast(root_, 0);
    world_->Barrier();
  }

  void TearDown() override {
    if (!world_ || world_->size() != 2) return;
    world_->Barrier();  // rank 0 removes the files once all are done
    dir_.reset();
  }

  std::string File(const std::string& name) const { return root_ + "/" + name; }
  std::vector<std::string> Files() const {
    return {File("d0.tfrecord"), File("d1.tfrecord")};
  }

  // Shard `rank` of `ranks` of an endless global shuffle, in batches.
  InputFn Input(int64_t ranks, int64_t rank, int64_t batch) const {
    return [=, files = Files()] {
      pipeline::GlobalShuffleOptions o;
      o.seed = 3;
      o.num_shards = ranks;
      o.shard_index = rank;
      o.num_epochs = -1;
      return Dataset::FromTFRecordsGlobalShuffle(files, o)
          .Batch(batch, /*drop_remainder=*/true)
          .Parse(Spec());
    };
  }

  RunConfig Config(const std::string& model_dir) const {
    RunConfig c;
    c.model_dir = File(model_dir);
    c.seed = 11;
    c.save_checkpoints_steps = 1000;
    c.save_summary_steps = 0;
    c.log_step_count_steps = 0;
    c.threads = 1;
    return c;
  }

  EstimatorOptions Options(std::shared_ptr<Collective> world) const {
    EstimatorOptions o;
    o.collective = std::move(world);
    o.log = [](std::string_view) {};
    return o;
  }

  static std::shared_ptr<Collective> world_;
  std::unique_ptr<testing::TempDir> dir_;
  std::string root_;
};

std::shared_ptr<Collective> DistributedTest::world_;

TEST_F(DistributedTest, CollectivesReduceAndBroadcast) {
  const int r = world_->rank();
  std::vector<float> f = {1.0f + r, 2.0f * r};
  world_->AllReduce(std::span(f), ReduceOp::kSum);
  EXPECT_EQ(f, (std::vector<float>{3.0f, 2.0f}));
  std::vector<int64_t> i = {r, -r};
  world_->AllReduce(std::span(i), ReduceOp::kMax);
  EXPECT_EQ(i, (std::vector<int64_t>{1, 0}));
  std::vector<double> d = {0.5 * r};
  world_->AllReduce(std::span(d), ReduceOp::kMin);
  EXPECT_EQ(d[0], 0.0);
  std::string s = r == 1 ? std::string(100000, 'x') : "";
  world_->Broadcast(s, 1);
  EXPECT_EQ(s, std::string(100000, 'x'));
  EXPECT_EQ(world_->Sum(r + 1), 3);
  EXPECT_TRUE(world_->Any(r == 1));
  EXPECT_FALSE(world_->Any(false));
}

TEST_F(DistributedTest, TwoRanksOfBatchBTakeTheStepsOfOneProcessWith2B) {
  const int r = world_->rank();
  auto checksum = std::make_shared<ChecksumHook>();
  Estimator two(CountingDnn(nullptr, {128, 128}), Config("two"),
                Options(world_));
  EXPECT_EQ(two.Train(Input(2, r, 4), {checksum}, std::nullopt, 6), 6);
  // Every rank ends with the chief's variables.
  double bounds[2] = {checksum->sum, -checksum->sum};
  world_->AllReduce(std::span(bounds), ReduceOp::kMax);
  EXPECT_EQ(bounds[0], -bounds[1]) << "ranks hold different variables";

  // The same steps in one process, batch 8 (each rank computes it alone).
  Estimator one(CountingDnn(nullptr, {128, 128}),
                Config(fmt::format("one-{}", r)), Options(LocalCollective()));
  EXPECT_EQ(one.Train(Input(1, 0, 8), {}, std::nullopt, 6), 6);
  const TensorMap a = ReadCheckpoint(*two.latest_checkpoint());
  const TensorMap b = ReadCheckpoint(*one.latest_checkpoint());
  ASSERT_EQ(a.size(), b.size());
  int compared = 0;
  for (const auto& [name, t] : a) {
    if (t.dtype() != DType::kFloat32) continue;
    const Tensor& u = b.at(name);
    ASSERT_EQ(t.num_elements(), u.num_elements()) << name;
    double moved = 0;
    for (int64_t i = 0; i < t.num_elements(); ++i) {
      EXPECT_NEAR(t.data<float>()[i], u.data<float>()[i], 2e-5)
          << name << "[" << i << "]";
      moved += std::abs(t.data<float>()[i]);
    }
    EXPECT_GT(moved, 0) << name;
    ++compared;
  }
  EXPECT_GE(compared, 4);  // kernels, biases and Adam's slots
}

TEST_F(DistributedTest, EveryRecordOncePerEpochAcrossTwoToOneAndOneToTwo) {
  const int r = world_->rank();
  {
    // 2 ranks x 4 steps x batch 3 = 24 records, then rank 0 alone
    // continues from the checkpoint with the same batch (the pipeline the
    // state was saved from): 7 steps x 3 = 21; 45 in all.
    Seen seen;
    Estimator two(CountingDnn(&seen), Config("2to1"), Options(world_));
    EXPECT_EQ(two.Train(Input(2, r, 3), {}, std::nullopt, 4), 4);
    world_->Barrier();
    if (world_->is_chief()) {
      Estimator one(CountingDnn(&seen), Config("2to1"),
                    Options(LocalCollective()));
      EXPECT_EQ(one.Train(Input(1, 0, 3), {}, std::nullopt, 11), 11);
    }
    world_->AllReduce(std::span(seen.counts), ReduceOp::kSum);
    for (int64_t id = 0; id < kRecords; ++id) {
      EXPECT_EQ(seen.counts[static_cast<size_t>(id)], 1) << "record " << id;
    }
  }
  {
    // Rank 0 alone: 4 steps x batch 5 = 20; then 2 ranks x 7 steps x
    // batch 5 = 70: two epochs, across the first epoch's end.
    Seen seen;
    if (world_->is_chief()) {
      Estimator one(CountingDnn(&seen), Config("1to2"),
                    Options(LocalCollective()));
      EXPECT_EQ(one.Train(Input(1, 0, 5), {}, std::nullopt, 4), 4);
    }
    world_->Barrier();
    Estimator two(CountingDnn(&seen), Config("1to2"), Options(world_));
    EXPECT_EQ(two.Train(Input(2, r, 5), {}, std::nullopt, 11), 11);
    world_->AllReduce(std::span(seen.counts), ReduceOp::kSum);
    for (int64_t id = 0; id < kRecords; ++id) {
      EXPECT_EQ(seen.counts[static_cast<size_t>(id)], 2) << "record " << id;
    }
  }
}

// Asks to stop after global step `at` on one rank only.
class StopOnRank : public SessionRunHook {
 public:
  StopOnRank(bool active, int64_t at) : active_(active), at_(at) {}
  SessionRunArgs before_run(RunContext&) override { return {{"global_step"}}; }
  void after_run(RunContext& ctx, const SessionRunValues& v) override {
    ++steps;
    global_batch = v.batch_size;
    if (active_ && v.scalar("global_step") >= at_) ctx.request_stop();
  }
  int64_t steps = 0, global_batch = 0;

 private:
  bool active_;
  int64_t at_;
};

TEST_F(DistributedTest, AStopOnOneRankStopsEveryRankAfterTheSameStep) {
  const int r = world_->rank();
  auto hook = std::make_shared<StopOnRank>(r == 1, 3);
  Estimator est(CountingDnn(nullptr), Config("stop"), Options(world_));
  EXPECT_EQ(est.Train(Input(2, r, 4), {hook}, std::nullopt, 100), 3);
  EXPECT_EQ(hook->steps, 3);
  EXPECT_EQ(hook->global_batch, 8);  // the examples of both ranks
}

TEST_F(DistributedTest, EvaluationAddsUpTheRanksShares) {
  const int r = world_->rank();
  Estimator two(CountingDnn(nullptr), Config("eval"), Options(world_));
  two.Train(Input(2, r, 4), {}, std::nullopt, 5);
  // Each rank evaluates one file; the reduction is the whole input's.
  const auto shared = two.Evaluate([files = Files(), r] {
    return Dataset::FromTFRecords(files).Shard(2, r).Batch(6).Parse(Spec());
  });
  Estimator one(CountingDnn(nullptr), Config("eval"),
                Options(LocalCollective()));
  const auto whole = one.Evaluate([files = Files()] {
    return Dataset::FromTFRecords(files).Batch(6).Parse(Spec());
  });
  ASSERT_EQ(shared.size(), whole.size());
  for (const auto& [name, value] : whole) {
    EXPECT_NEAR(shared.at(name), value, 1e-6) << name;
  }
  EXPECT_EQ(shared.at("global_step"), 5);
}

}  // namespace
}  // namespace recflow::train
