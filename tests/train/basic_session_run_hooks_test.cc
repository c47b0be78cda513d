// The hooks tf.estimator ships (basic_session_run_hooks.cc) in a training
// run: stop at a step, NaN losses, early stopping, preemption.
#include "train/basic_session_run_hooks.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <map>

#include "estimator_test_util.h"
#include "test_util.h"

namespace recflow::train {
namespace {

using namespace estimator_testing;

// SIGTERM's handler now in this process.
sighandler_t SigtermHandler() {
  struct sigaction now {};
  sigaction(SIGTERM, nullptr, &now);
  return now.sa_handler;
}

TEST(BasicSessionRunHooksTest, StopAtStepCountsFromNowOrToALastStep) {
  testing::TempDir dir;
  Estimator est(Classifier(), Config(dir.path().string()), Quiet());
  EXPECT_EQ(est.Train(TrainInput(), {StopAtStepHook::NumSteps(3)}), 3);
  // num_steps counts from the restored step; last_step is absolute.
  EXPECT_EQ(est.Train(TrainInput(), {StopAtStepHook::NumSteps(3)}), 6);
  EXPECT_EQ(est.Train(TrainInput(), {StopAtStepHook::LastStep(8)}), 8);
  EXPECT_EQ(est.Train(TrainInput(), {StopAtStepHook::LastStep(8)}), 8);
}

TEST(BasicSessionRunHooksTest, EarlyStoppingEvaluatesInProcess) {
  testing::TempDir dir;
  Estimator est(Classifier(), Config(dir.path().string()), Quiet());
  int evaluations = 0;
  auto hook = std::make_shared<EarlyStoppingHook>(
      [&] {
        ++evaluations;
        // Improves twice, then never again.
        return std::map<std::string, double>{
            {"accuracy", evaluations <= 2 ? evaluations * 0.1 : 0.05}};
      },
      "accuracy", /*max_evals_without_improvement=*/3,
      /*higher_is_better=*/true, /*every_n_steps=*/5);
  EXPECT_EQ(est.Train(TrainInput(), {hook}, 1000), 25);
  EXPECT_EQ(evaluations, 5);
  EXPECT_DOUBLE_EQ(*hook->best(), 0.2);
}

TEST(BasicSessionRunHooksTest, PreemptionSavesAndStopsAtTheNextStep) {
  testing::TempDir dir;
  RunConfig config = Config(dir.path().string());
  config.save_checkpoints_steps = 1000;
  auto preemption = std::make_shared<PreemptionHook>();
  // Raises SIGTERM during step 4.
  class Raise : public SessionRunHook {
    void after_run(RunContext&, const SessionRunValues& v) override {
      if (v.scalar("global_step") == 4) raise(SIGTERM);
    }
    SessionRunArgs before_run(RunContext&) override {
      return {{"global_step"}};
    }
  };
  Estimator est(Classifier(), config, Quiet());
  EXPECT_EQ(est.Train(TrainInput(), {std::make_shared<Raise>(), preemption}),
            4);
  EXPECT_EQ(preemption->preempted_by(), SIGTERM);
  EXPECT_EQ(est.latest_checkpoint(), dir.File("model.ckpt-4"));
  // With the hook gone, SIGTERM is back to its previous disposition.
  preemption.reset();
  EXPECT_EQ(SigtermHandler(), SIG_DFL);
}

// A signal caught after a run's last step (here in a hook's end(), while
// the handler is still installed) is not lost: the next run in the
// process, as TrainAndEvaluate's next training segment, stops at its first
// step.  (It was dropped as the next run began, and `recflow train` then
// ran all its steps after a SIGTERM.)
TEST(BasicSessionRunHooksTest, ASignalAfterTheLastStepStopsTheNextRun) {
  testing::TempDir dir;
  RunConfig config = Config(dir.path().string());
  config.save_checkpoints_steps = 1000;
  auto preemption = std::make_shared<PreemptionHook>();
  class RaiseAtEnd : public SessionRunHook {
    void end(TrainingSession&) override { raise(SIGTERM); }
  };
  Estimator est(Classifier(), config, Quiet());
  EXPECT_EQ(
      est.Train(TrainInput(), {std::make_shared<RaiseAtEnd>(), preemption}, 3),
      3);
  EXPECT_EQ(preemption->preempted_by(), SIGTERM);  // caught, not yet acted on
  EXPECT_EQ(est.Train(TrainInput(), {preemption}, 3), 4);
  EXPECT_EQ(preemption->preempted_by(), SIGTERM);
  EXPECT_EQ(est.latest_checkpoint(), dir.File("model.ckpt-4"));
  // Taken: a third run trains its steps.
  auto again = std::make_shared<PreemptionHook>();
  EXPECT_EQ(est.Train(TrainInput(), {again}, 2), 6);
  EXPECT_EQ(again->preempted_by(), 0);
}

// Between two runs (TrainAndEvaluate's evaluation between its training
// segments) the handler stays: a SIGTERM there is caught, reported at once
// for the caller to stop, and stops the next run at its first step.  (The
// handler was uninstalled at each run's end, and such a signal ended the
// process mid-evaluation.)
TEST(BasicSessionRunHooksTest, ASignalBetweenRunsIsCaughtAndReported) {
  testing::TempDir dir;
  RunConfig config = Config(dir.path().string());
  config.save_checkpoints_steps = 1000;
  auto preemption = std::make_shared<PreemptionHook>();
  Estimator est(Classifier(), config, Quiet());
  EXPECT_EQ(est.Train(TrainInput(), {preemption}, 3), 3);
  EXPECT_EQ(preemption->preempted_by(), 0);
  raise(SIGTERM);  // the process goes on
  EXPECT_EQ(preemption->preempted_by(), SIGTERM);
  EXPECT_EQ(est.Train(TrainInput(), {preemption}, 3), 4);
  EXPECT_EQ(preemption->preempted_by(), SIGTERM);
  EXPECT_EQ(est.latest_checkpoint(), dir.File("model.ckpt-4"));
  preemption.reset();
  EXPECT_EQ(SigtermHandler(), SIG_DFL);
}

}  // namespace
}  // namespace recflow::train
