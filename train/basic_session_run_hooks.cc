#include "train/basic_session_run_hooks.h"

#include <fmt/format.h>

#include <cmath>

#include "train/estimator.h"

namespace recflow::train {

// ---- SecondOrStepTimer ----

SecondOrStepTimer::SecondOrStepTimer(int64_t every_steps, double every_secs)
    : every_steps_(every_steps), every_secs_(every_secs) {
  if (every_steps <= 0 && every_secs <= 0) {
    throw Error("a hook needs every_n_steps or every_n_secs > 0");
  }
}

bool SecondOrStepTimer::ShouldTrigger(int64_t step) const {
  if (last_step_ < 0) return true;
  if (step == last_step_) return false;
  if (every_steps_ > 0) return step >= last_step_ + every_steps_;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                       last_time_)
             .count() >= every_secs_;
}

std::optional<std::pair<double, int64_t>> SecondOrStepTimer::Update(
    int64_t step) {
  const auto now = std::chrono::steady_clock::now();
  std::optional<std::pair<double, int64_t>> since;
  if (last_step_ >= 0) {
    since = {std::chrono::duration<double>(now - last_time_).count(),
             step - last_step_};
  }
  last_step_ = step;
  last_time_ = now;
  return since;
}

// ---- StepCounterHook ----

StepCounterHook::StepCounterHook(int64_t every_n_steps, double every_n_secs)
    : timer_(every_n_secs > 0 ? 0 : every_n_steps, every_n_secs) {}

SessionRunArgs StepCounterHook::before_run(RunContext&) {
  return {{"global_step"}};
}

void StepCounterHook::after_run(RunContext& ctx,
                                const SessionRunValues& values) {
  const auto step = static_cast<int64_t>(values.scalar("global_step"));
  examples_ += values.batch_size;
  if (!timer_.ShouldTrigger(step)) return;
  const auto since = timer_.Update(step);
  if (since && since->first > 0) {
    const double steps_per_sec = since->second / since->first;
    const double examples_per_sec = examples_ / since->first;
    TrainingSession& s = ctx.session();
    s.Log(fmt::format("global_step/sec: {:.4g}, examples/sec: {:.4g}",
                      steps_per_sec, examples_per_sec));
    s.summary_writer().AddScalar("global_step/sec", steps_per_sec, step);
    s.summary_writer().AddScalar("examples/sec", examples_per_sec, step);
  }
  examples_ = 0;
}

// ---- LoggingTensorHook ----

LoggingTensorHook::LoggingTensorHook(std::vector<std::string> tensors,
                                     int64_t every_n_iter, double every_n_secs,
                                     bool at_end)
    : tensors_(std::move(tensors)),
      timer_(every_n_secs > 0 ? 0 : every_n_iter, every_n_secs),
      at_end_(at_end) {}

SessionRunArgs LoggingTensorHook::before_run(RunContext&) {
  // Fetch only on steps that log (or every step when the last values are
  // logged at the end): a fetch from a GPU waits for its step.
  triggered_ = at_end_ || timer_.ShouldTrigger(iter_);
  if (!triggered_) return {};
  return {tensors_};
}

void LoggingTensorHook::LogValues(TrainingSession& session,
                                  const SessionRunValues& values,
                                  std::optional<double> secs) {
  std::string line;
  for (const auto& name : tensors_) {
    if (!line.empty()) line += ", ";
    const Tensor& t = values.results.at(name);
    line += fmt::format("{} = {}", name,
                        t.num_elements() == 1 && t.dtype() != DType::kBytes
                            ? fmt::format("{:.6g}", values.scalar(name))
                            : t.DebugString(6));
  }
  if (secs) line += fmt::format(" ({:.3f} sec)", *secs);
  session.Log(line);
}

void LoggingTensorHook::after_run(RunContext& ctx,
                                  const SessionRunValues& values) {
  if (!triggered_) {
    ++iter_;
    return;
  }
  last_ = values;
  if (!timer_.ShouldTrigger(iter_)) {
    ++iter_;
    return;
  }
  const auto since = timer_.Update(iter_);
  ++iter_;
  LogValues(ctx.session(), values,
            since ? std::optional<double>(since->first) : std::nullopt);
}

void LoggingTensorHook::end(TrainingSession& session) {
  if (at_end_ && last_) LogValues(session, *last_, std::nullopt);
}

// ---- StopAtStepHook ----

StopAtStepHook::StopAtStepHook(std::optional<int64_t> num,
                               std::optional<int64_t> last)
    : num_steps_(num), last_step_(last.value_or(0)) {}

std::shared_ptr<StopAtStepHook> StopAtStepHook::NumSteps(int64_t num_steps) {
  return std::shared_ptr<StopAtStepHook>(
      new StopAtStepHook(num_steps, std::nullopt));
}

std::shared_ptr<StopAtStepHook> StopAtStepHook::LastStep(int64_t last_step) {
  return std::shared_ptr<StopAtStepHook>(
      new StopAtStepHook(std::nullopt, last_step));
}

void StopAtStepHook::after_create_session(TrainingSession& session) {
  if (num_steps_) last_step_ = session.global_step() + *num_steps_;
}

SessionRunArgs StopAtStepHook::before_run(RunContext& ctx) {
  if (ctx.session().global_step() >= last_step_) ctx.request_stop();
  return {{"global_step"}};
}

void StopAtStepHook::after_run(RunContext& ctx,
                               const SessionRunValues& values) {
  if (values.scalar("global_step") >= static_cast<double>(last_step_)) {
    ctx.request_stop();
  }
}

// ---- CheckpointSaverHook ----

CheckpointSaverHook::CheckpointSaverHook(
    int64_t save_steps, double save_secs,
    std::vector<std::shared_ptr<CheckpointSaverListener>> listeners)
    : timer_(save_steps, save_secs), listeners_(std::move(listeners)) {}

void CheckpointSaverHook::begin() {
  for (auto& l : listeners_) l->begin();
}

void CheckpointSaverHook::after_create_session(TrainingSession& session) {
  // Counting starts at the restored step; the variables do not exist
  // before the first step, so the first save comes after it.
  timer_.Update(session.global_step());
}

bool CheckpointSaverHook::Save(TrainingSession& session) {
  const int64_t step = session.global_step();
  for (auto& l : listeners_) l->before_save(session, step);
  const std::string path = session.SaveCheckpoint();
  bool stop = false;
  for (auto& l : listeners_) stop |= l->after_save(session, step, path);
  return stop;
}

void CheckpointSaverHook::after_run(RunContext& ctx, const SessionRunValues&) {
  const int64_t step = ctx.session().global_step();
  if (!timer_.ShouldTrigger(step)) return;
  timer_.Update(step);
  if (Save(ctx.session())) {
    ctx.session().Log("A checkpoint listener requested that training stop.");
    ctx.request_stop();
  }
}

void CheckpointSaverHook::end(TrainingSession& session) {
  const int64_t step = session.global_step();
  if (step != session.last_saved_step()) Save(session);
  for (auto& l : listeners_) l->end(session, step);
}

// ---- NanTensorHook ----

SessionRunArgs NanTensorHook::before_run(RunContext&) {
  triggered_ = ++iter_ % every_n_steps_ == 0;
  if (!triggered_) return {};
  return {{"loss", "global_step"}};
}

void NanTensorHook::after_run(RunContext& ctx, const SessionRunValues& values) {
  if (!triggered_) return;
  const double loss = values.scalar("loss");
  if (std::isfinite(loss)) return;
  const std::string what =
      fmt::format("Model diverged with loss = {} at global step {}", loss,
                  static_cast<int64_t>(values.scalar("global_step")));
  if (fail_) throw Error(what + " (NanTensorHook)");
  ctx.session().Log(what + "; stopping training.");
  ctx.request_stop();
}

// ---- SummarySaverHook ----

SummarySaverHook::SummarySaverHook(int64_t save_steps,
                                   std::vector<std::string> tensors)
    : tensors_(std::move(tensors)), timer_(save_steps, 0) {}

SessionRunArgs SummarySaverHook::before_run(RunContext& ctx) {
  triggered_ = timer_.ShouldTrigger(ctx.session().global_step() + 1);
  if (!triggered_) return {};
  SessionRunArgs args{tensors_};
  args.fetches.push_back("global_step");
  return args;
}

void SummarySaverHook::after_run(RunContext& ctx,
                                 const SessionRunValues& values) {
  if (!triggered_) return;
  const auto step = static_cast<int64_t>(values.scalar("global_step"));
  timer_.Update(step);
  for (const auto& name : tensors_) {
    ctx.session().summary_writer().AddScalar(name, values.scalar(name), step);
  }
}

void SummarySaverHook::end(TrainingSession& session) {
  session.summary_writer().Flush();
}

// ---- EarlyStoppingHook ----

EarlyStoppingHook::EarlyStoppingHook(EvaluateFn evaluate, std::string metric,
                                     int max_evals_without_improvement,
                                     bool higher_is_better,
                                     int64_t every_n_steps)
    : evaluate_(std::move(evaluate)),
      metric_(std::move(metric)),
      patience_(max_evals_without_improvement),
      higher_is_better_(higher_is_better),
      timer_(every_n_steps, 0) {}

void EarlyStoppingHook::after_run(RunContext& ctx, const SessionRunValues&) {
  const int64_t step = ctx.session().global_step();
  if (timer_.last_step() < 0) timer_.Update(0);
  if (!timer_.ShouldTrigger(step)) return;
  timer_.Update(step);
  const auto metrics = evaluate_();
  auto it = metrics.find(metric_);
  if (it == metrics.end()) {
    throw Error(
        fmt::format("EarlyStoppingHook: the evaluation has no metric "
                    "\"{}\"",
                    metric_));
  }
  ++evaluations_;
  const double v = it->second;
  if (!best_ || (higher_is_better_ ? v > *best_ : v < *best_)) {
    best_ = v;
    since_best_ = 0;
    return;
  }
  if (++since_best_ >= patience_) {
    ctx.session().Log(fmt::format(
        "Early stopping at global step {}: {} has not improved on {:.6g} for "
        "{} evaluations",
        step, metric_, *best_, since_best_));
    ctx.request_stop();
  }
}

// ---- PreemptionHook ----

namespace {
std::atomic<int> pending_signal{0};
extern "C" void OnPreemptionSignal(int sig) { pending_signal.store(sig); }
}  // namespace

PreemptionHook::PreemptionHook() = default;
PreemptionHook::~PreemptionHook() { Uninstall(); }

void PreemptionHook::begin() {
  // A signal still pending was caught by this process after the last step
  // of a run (after its last after_run, or between runs): it stops this
  // run.  Installed once, kept until the hook goes.
  if (installed_) return;
  struct sigaction sa {};
  sa.sa_handler = OnPreemptionSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, &old_term_);
  sigaction(SIGINT, &sa, &old_int_);
  installed_ = true;
}

void PreemptionHook::Uninstall() {
  if (!installed_) return;
  sigaction(SIGTERM, &old_term_, nullptr);
  sigaction(SIGINT, &old_int_, nullptr);
  installed_ = false;
}

void PreemptionHook::after_run(RunContext& ctx, const SessionRunValues&) {
  const int sig = pending_signal.exchange(0);
  if (sig == 0) return;
  preempted_by_ = sig;
  TrainingSession& s = ctx.session();
  s.Log(
      fmt::format("Received {} at global step {}: saving a checkpoint and "
                  "stopping.",
                  sig == SIGTERM ? "SIGTERM" : "SIGINT", s.global_step()));
  s.SaveCheckpoint();
  ctx.request_stop();
}

int PreemptionHook::preempted_by() const {
  return preempted_by_ != 0 ? preempted_by_ : pending_signal.load();
}

// Not uninstalled at a run's end: between TrainAndEvaluate's training
// segments (its evaluations) a signal must be caught too, not meet the
// previous disposition (SIG_DFL ends the process mid-evaluation).
void PreemptionHook::end(TrainingSession&) {}

void PreemptionHook::on_exception(const std::exception&) { Uninstall(); }

}  // namespace recflow::train
