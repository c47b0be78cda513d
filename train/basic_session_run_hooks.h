// The hooks TensorFlow ships in basic_session_run_hooks.py, plus early
// stopping evaluated in process and a preemption hook.  The Estimator adds
// StepCounterHook, LoggingTensorHook (loss), SummarySaverHook (loss),
// NanTensorHook and CheckpointSaverHook from RunConfig by itself.
#ifndef RECFLOW_TRAIN_BASIC_SESSION_RUN_HOOKS_H_
#define RECFLOW_TRAIN_BASIC_SESSION_RUN_HOOKS_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "train/hooks.h"

namespace recflow::train {

// Fires every N steps or every S seconds (TF's SecondOrStepTimer).
class SecondOrStepTimer {
 public:
  SecondOrStepTimer(int64_t every_steps, double every_secs);
  bool ShouldTrigger(int64_t step) const;
  // Marks `step` as triggered; returns the seconds and steps since the
  // last trigger (nullopt the first time).
  std::optional<std::pair<double, int64_t>> Update(int64_t step);
  int64_t last_step() const { return last_step_; }

 private:
  int64_t every_steps_;
  double every_secs_;
  int64_t last_step_ = -1;
  std::chrono::steady_clock::time_point last_time_;
};

// Logs global_step/sec and examples/sec and writes them as summaries.
class StepCounterHook : public SessionRunHook {
 public:
  explicit StepCounterHook(int64_t every_n_steps = 100,
                           double every_n_secs = 0);
  SessionRunArgs before_run(RunContext& ctx) override;
  void after_run(RunContext& ctx, const SessionRunValues& values) override;

 private:
  SecondOrStepTimer timer_;
  int64_t examples_ = 0;
};

// Logs the named values ("loss = 0.3521, step = 200 (1.234 sec)").
class LoggingTensorHook : public SessionRunHook {
 public:
  LoggingTensorHook(std::vector<std::string> tensors, int64_t every_n_iter,
                    double every_n_secs = 0, bool at_end = false);
  SessionRunArgs before_run(RunContext& ctx) override;
  void after_run(RunContext& ctx, const SessionRunValues& values) override;
  void end(TrainingSession& session) override;

 private:
  void LogValues(TrainingSession& session, const SessionRunValues& values,
                 std::optional<double> secs);
  std::vector<std::string> tensors_;
  SecondOrStepTimer timer_;
  bool at_end_;
  int64_t iter_ = 0;
  bool triggered_ = false;
  std::optional<SessionRunValues> last_;
};

// Requests a stop once global_step reaches last_step (or num_steps more
// than it was at the start).
class StopAtStepHook : public SessionRunHook {
 public:
  static std::shared_ptr<StopAtStepHook> NumSteps(int64_t num_steps);
  static std::shared_ptr<StopAtStepHook> LastStep(int64_t last_step);
  void after_create_session(TrainingSession& session) override;
  SessionRunArgs before_run(RunContext& ctx) override;
  void after_run(RunContext& ctx, const SessionRunValues& values) override;
  int64_t last_step() const { return last_step_; }

 private:
  StopAtStepHook(std::optional<int64_t> num, std::optional<int64_t> last);
  std::optional<int64_t> num_steps_;
  int64_t last_step_ = 0;
};

// Called around checkpoint saves; after_save returning true stops training.
class CheckpointSaverListener {
 public:
  virtual ~CheckpointSaverListener() = default;
  virtual void begin() {}
  virtual void before_save(TrainingSession& /*session*/, int64_t /*step*/) {}
  virtual bool after_save(TrainingSession& /*session*/, int64_t /*step*/,
                          const std::string& /*path*/) {
    return false;
  }
  virtual void end(TrainingSession& /*session*/, int64_t /*step*/) {}
};

// Saves a checkpoint every N steps or S seconds and at the end.
class CheckpointSaverHook : public SessionRunHook {
 public:
  CheckpointSaverHook(
      int64_t save_steps, double save_secs,
      std::vector<std::shared_ptr<CheckpointSaverListener>> listeners = {});
  void begin() override;
  void after_create_session(TrainingSession& session) override;
  void after_run(RunContext& ctx, const SessionRunValues& values) override;
  void end(TrainingSession& session) override;

 private:
  bool Save(TrainingSession& session);  // true: a listener asked to stop
  SecondOrStepTimer timer_;
  std::vector<std::shared_ptr<CheckpointSaverListener>> listeners_;
};

// Fails (throws Error) or stops when the loss is NaN or infinite.
class NanTensorHook : public SessionRunHook {
 public:
  // Checks every step (TensorFlow's), or every `every_n_steps`-th: the
  // Estimator checks a GPU's loss at its logging cadence so that other
  // steps never wait for the device.
  explicit NanTensorHook(bool fail_on_nan_loss = true,
                         int64_t every_n_steps = 1)
      : fail_(fail_on_nan_loss),
        every_n_steps_(std::max<int64_t>(every_n_steps, 1)) {}
  SessionRunArgs before_run(RunContext& ctx) override;
  void after_run(RunContext& ctx, const SessionRunValues& values) override;

 private:
  bool fail_;
  int64_t every_n_steps_;
  int64_t iter_ = 0;
  bool triggered_ = false;
};

// Writes the named scalar values to the session's event file every N
// steps.
class SummarySaverHook : public SessionRunHook {
 public:
  SummarySaverHook(int64_t save_steps, std::vector<std::string> tensors);
  SessionRunArgs before_run(RunContext& ctx) override;
  void after_run(RunContext& ctx, const SessionRunValues& values) override;
  void end(TrainingSession& session) override;

 private:
  std::vector<std::string> tensors_;
  SecondOrStepTimer timer_;
  bool triggered_ = false;
};

// Evaluates in process every N steps and stops training when `metric` has
// not improved for `max_evals_without_improvement` evaluations (TF's
// stop_if_no_*_hook, without re-reading event files).
class EarlyStoppingHook : public SessionRunHook {
 public:
  using EvaluateFn = std::function<std::map<std::string, double>()>;
  EarlyStoppingHook(EvaluateFn evaluate, std::string metric,
                    int max_evals_without_improvement, bool higher_is_better,
                    int64_t every_n_steps);
  void after_run(RunContext& ctx, const SessionRunValues& values) override;
  std::optional<double> best() const { return best_; }
  int evaluations() const { return evaluations_; }

 private:
  EvaluateFn evaluate_;
  std::string metric_;
  int patience_;
  bool higher_is_better_;
  SecondOrStepTimer timer_;
  std::optional<double> best_;
  int since_best_ = 0;
  int evaluations_ = 0;
};

// On SIGTERM or SIGINT: at the next step boundary, saves a checkpoint and
// stops training cleanly (the Estimator returns normally).  Its handler is
// installed at the first run's begin() and kept until the hook is
// destroyed (or a run throws), so that a signal between runs (during
// TrainAndEvaluate's evaluations) is caught too: preempted_by() reports it
// at once, for the caller to stop (`recflow train` does), and the next
// run in the process stops at its first step.  The previous handlers come
// back when the hook goes.  One preemption hook per process at a time.
class PreemptionHook : public SessionRunHook {
 public:
  PreemptionHook();
  ~PreemptionHook() override;
  void begin() override;
  void after_run(RunContext& ctx, const SessionRunValues& values) override;
  void end(TrainingSession& session) override;
  void on_exception(const std::exception& e) override;
  // The signal that stopped training, or one caught since that will stop
  // the next run (0: none).
  int preempted_by() const;

 private:
  void Uninstall();
  bool installed_ = false;
  int preempted_by_ = 0;
  struct sigaction old_term_ {
  }, old_int_{};
};

}  // namespace recflow::train

#endif  // RECFLOW_TRAIN_BASIC_SESSION_RUN_HOOKS_H_
