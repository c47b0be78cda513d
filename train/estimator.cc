#include "train/estimator.h"

#include <fmt/format.h>
#include <sched.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <thread>
#include <typeinfo>

#include "train/basic_session_run_hooks.h"

namespace recflow::train {
namespace {

namespace fs = std::filesystem;

Tensor Int64Scalar(int64_t v) { return Tensor::Scalar<int64_t>(v); }

Tensor FloatScalar(double v) {
  return Tensor::Scalar<float>(static_cast<float>(v));
}

// The value of a float32 scalar in the backend's memory.
double ScalarOf(Backend& be, const Tensor& t) {
  return be.ToHost(t).data<float>()[0];
}

// Runs `fn` for each hook, stopping at the first exception after telling
// every hook about it.
template <typename Fn>
void ForHooks(const Hooks& hooks, const Fn& fn) {
  for (const auto& h : hooks) fn(*h);
}

// Called in a handler of `e`, thrown by a model_fn or a training step:
// rethrows it naming the batch (the one of global step `n` in training,
// the n-th batch otherwise), whose rows a message such as a label out of
// range counts.  train::Error's subclasses are rethrown as they are: their
// catchers tell them apart by type.
[[noreturn]] void RethrowNamingBatch(const Error& e, Mode mode, int64_t n) {
  if (typeid(e) != typeid(Error)) throw;
  const std::string_view batch = mode == Mode::kTrain
                                     ? "the batch of global step"
                                 : mode == Mode::kEval ? "evaluation batch"
                                                       : "prediction batch";
  throw Error(fmt::format("{} {}: {}", batch, n, e.what()));
}

void NotifyException(const Hooks& hooks, const std::exception& e) {
  for (const auto& h : hooks) {
    try {
      h->on_exception(e);
    } catch (...) {
      // The original exception is what the caller needs to see.
    }
  }
}

// Hands every hook the values its before_run asked for: "loss",
// "global_step", or a prediction or tensor of the model_fn's spec.
// Values come to the host only when some hook asked for them (a fetch
// from a GPU waits for the step that computes it), each once per step.
void AfterRun(Backend& be, const Hooks& hooks,
              const std::vector<SessionRunArgs>& args, RunContext& run,
              const EstimatorSpec& spec, const std::function<double()>& loss,
              int64_t global_step, int64_t batch) {
  std::map<std::string, Tensor> fetched;
  auto host = [&](const std::string& name, const Tensor& t) {
    auto it = fetched.find(name);
    if (it == fetched.end()) it = fetched.emplace(name, be.ToHost(t)).first;
    return it->second;
  };
  std::optional<double> loss_value;
  for (size_t i = 0; i < hooks.size(); ++i) {
    SessionRunValues values;
    values.batch_size = batch;
    for (const std::string& name : args[i].fetches) {
      if (name == "loss") {
        if (!loss_value) loss_value = loss();
        values.results[name] = FloatScalar(*loss_value);
      } else if (name == "global_step") {
        values.results[name] = Int64Scalar(global_step);
      } else if (auto p = spec.predictions.find(name);
                 p != spec.predictions.end()) {
        values.results[name] = host(name, p->second);
      } else if (auto t = spec.tensors.find(name); t != spec.tensors.end()) {
        values.results[name] = host(name, t->second);
      } else {
        throw Error(fmt::format(
            "a hook fetches \"{}\", which the model_fn does not provide "
            "(loss, global_step, its predictions and tensors)",
            name));
      }
    }
    hooks[i]->after_run(run, values);
  }
}

int64_t BatchSizeOf(const pipeline::Element& e) {
  for (const auto& c : e.components) {
    if (c.tensor.shape().rank() > 0) return c.tensor.num_rows();
  }
  return 1;
}

}  // namespace

double SessionRunValues::scalar(const std::string& name) const {
  auto it = results.find(name);
  if (it == results.end()) {
    throw Error(
        fmt::format("hook asked for \"{}\", which was not fetched", name));
  }
  const Tensor& t = it->second;
  if (t.dtype() == DType::kBytes) {
    throw Error(fmt::format("\"{}\" is not numeric", name));
  }
  return t.NumberAt(0);
}

Tensor ArgMax(Backend& be, const Tensor& logits) {
  if (logits.shape().rank() != 2) {
    throw Error(fmt::format("argmax: expected [rows, cols], got {}",
                            logits.shape().ToString()));
  }
  const int64_t rows = logits.shape()[0], cols = logits.shape()[1];
  Tensor out = be.Allocate(DType::kInt64, Shape{rows});
  be.ArgMax(rows, cols, logits.data<float>(), out.mutable_data<int64_t>());
  return out;
}

// ---- TrainingSession ----

TrainingSession::TrainingSession(Estimator& est, Mode mode,
                                 std::string summary_dir)
    : est_(est),
      mode_(mode),
      summary_dir_(std::move(summary_dir)),
      variables_(est.config().seed, est.backend_.get()) {}

const RunConfig& TrainingSession::config() const { return est_.config(); }

void TrainingSession::Log(std::string_view line) const { est_.Log(line); }

EventWriter& TrainingSession::summary_writer() {
  if (!events_) events_ = std::make_unique<EventWriter>(summary_dir_);
  return *events_;
}

std::string TrainingSession::SaveCheckpoint() {
  if (mode_ != Mode::kTrain) {
    throw Error("checkpoints are saved by training sessions only");
  }
  if (!est_.world_->is_chief()) return "";
  TensorMap tensors;
  for (Variable* v : variables_.all()) {
    tensors.emplace(v->name, est_.backend_->ToHost(v->value));
  }
  tensors.emplace("global_step", Int64Scalar(global_step_));
  if (iterator_ != nullptr) {
    const std::string state = iterator_->Save();
    tensors.emplace(
        kIteratorStateKey,
        Tensor::FromValues<uint8_t>(
            std::span(reinterpret_cast<const uint8_t*>(state.data()),
                      state.size()),
            Shape{static_cast<int64_t>(state.size())}));
  }
  const std::string path = est_.checkpoints_.Save(global_step_, tensors);
  last_saved_step_ = global_step_;
  Log(fmt::format("Saving checkpoints for {} into {}.", global_step_, path));
  return path;
}

// ---- Estimator ----

namespace {

// The device `text` names; "cuda" without an index is the GPU of the
// rank's local index (Horovod's one GPU per process: ranks 0..k-1 on a
// host take its GPUs 0..k-1).
DeviceSpec RankDevice(std::string_view text, const Collective& world) {
  DeviceSpec spec = ParseDevice(text);
  if (spec.device == Device::kCuda && !spec.index_given) {
    spec.index = world.local_rank();
  }
  return spec;
}

}  // namespace

Estimator::Estimator(ModelFn model_fn, RunConfig config,
                     EstimatorOptions options)
    : model_fn_(std::move(model_fn)),
      config_(std::move(config)),
      options_(std::move(options)),
      world_(options_.collective ? options_.collective : LocalCollective()),
      backend_(options_.backend ? options_.backend
                                : std::shared_ptr<Backend>(MakeBackend(
                                      RankDevice(config_.device, *world_),
                                      config_.threads))),
      checkpoints_(config_.model_dir.empty()
                       ? throw Error("RunConfig.model_dir is empty")
                       : config_.model_dir,
                   config_.keep_checkpoint_max) {
  backend_->SetStepGraphs(config_.cuda_graphs);
  backend_->SetInputInPlace(config_.read_input_in_place);
  if (world_->size() > 1) {
    // Every rank initialises as the chief does: initial values are a
    // function of the seed and the variable's name only.
    std::string seed = std::to_string(config_.seed);
    world_->Broadcast(seed, 0);
    config_.seed = std::stoull(seed);
  }
}

Estimator::~Estimator() = default;

void Estimator::Log(std::string_view line) const {
  if (options_.log) {
    options_.log(line);
  } else {
    std::fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
  }
}

pipeline::IteratorOptions Estimator::InputOptions() const {
  pipeline::IteratorOptions o;
  o.threads = config_.input_threads;
  // Batches arrive in the memory the backend copies from (a GPU's pinned
  // memory), made there by the pipeline's threads.
  o.output_memory = backend_->InputMemory();
  // A GPU's training thread is what its steps wait for: the prefetch
  // driver looks for room on a timer rather than being woken by each take
  // (a system call there); a CPU's steps fill the cores, where a timer
  // firing mid-step would preempt them.
  o.prefetch_polls = backend_->device() != Device::kCpu;
  // And are copied to the device by the pipeline's thread that made them
  // (a new stager for each iterator), unless read in place (no copy).
  if (config_.stage_input && !config_.read_input_in_place) {
    o.prepare = backend_->InputStager();
  }
  if (o.threads == 0 && world_->local_size() > 1) {
    // Ranks on one host share its cores rather than each taking all (the
    // cores this process may run on: mpirun may have bound it to some).
    cpu_set_t set;
    CPU_ZERO(&set);
    const int cores =
        sched_getaffinity(0, sizeof(set), &set) == 0
            ? CPU_COUNT(&set)
            : static_cast<int>(std::thread::hardware_concurrency());
    o.threads = std::max(1, cores / world_->local_size());
  }
  return o;
}

std::optional<std::string> Estimator::latest_checkpoint() const {
  return checkpoints_.Latest();
}

std::string Estimator::RestoreInto(TrainingSession& session,
                                   const std::string& checkpoint_path) {
  std::optional<CheckpointManager::Restored> restored;
  // The chief's checkpoint file as it read it, for the other ranks.
  std::string bytes;
  std::string* keep = world_->size() > 1 ? &bytes : nullptr;
  if (world_->is_chief()) {
    if (!checkpoint_path.empty()) {
      restored = CheckpointManager::Restored{
          checkpoint_path, ReadCheckpoint(checkpoint_path, keep)};
    } else {
      restored = checkpoints_.RestoreLatest(
          [this](std::string_view w) { Log(w); }, keep);
    }
  }
  if (world_->size() > 1) {
    // The chief's checkpoint, verified there, to every rank: model_dir
    // need not be shared between hosts.
    std::string path = restored ? restored->path : "";
    world_->Broadcast(path, 0);
    world_->Broadcast(bytes, 0);
    if (!world_->is_chief() && !path.empty()) {
      restored =
          CheckpointManager::Restored{path, ParseCheckpoint(bytes, path)};
    }
  }
  if (!restored) return {};
  TensorMap& t = restored->tensors;
  std::string iterator_state;
  if (auto it = t.find("global_step"); it != t.end()) {
    session.global_step_ = it->second.scalar<int64_t>();
    t.erase(it);
  }
  if (auto it = t.find(kIteratorStateKey); it != t.end()) {
    iterator_state.assign(it->second.raw_data(), it->second.byte_size());
    t.erase(it);
  }
  session.variables_.Restore(std::move(t), restored->path);
  session.restored_from_ = restored->path;
  session.last_saved_step_ = session.global_step_;
  Log(fmt::format("Restoring parameters from {} (global step {})",
                  restored->path, session.global_step_));
  return iterator_state;
}

EstimatorSpec Estimator::RunModel(TrainingSession& session,
                                  pipeline::Element& element, Mode mode,
                                  std::unique_ptr<ModelContext>* ctx,
                                  Tensor* labels_out, int64_t batch_number,
                                  const std::vector<std::string>* fetches) {
  const Tensor* labels = nullptr;
  for (auto it = element.components.begin(); it != element.components.end();
       ++it) {
    if (it->name == options_.label_key) {
      *labels_out = std::move(it->tensor);
      element.components.erase(it);
      labels = labels_out;
      break;
    }
  }
  if (labels == nullptr && mode != Mode::kPredict) {
    std::string names;
    for (const auto& c : element.components) names += " " + c.name;
    throw Error(fmt::format("{}: the input has no label \"{}\" (it has:{})",
                            ModeName(mode), options_.label_key, names));
  }
  if (mode == Mode::kPredict) labels = nullptr;
  // Ranks draw their own dropout masks.
  const uint64_t seed =
      world_->rank() == 0
          ? config_.seed
          : pipeline::MixSeed(config_.seed,
                              static_cast<uint64_t>(world_->rank()));
  *ctx = std::make_unique<ModelContext>(
      *backend_, session.variables_, session.metrics_, mode,
      &session.global_step_, seed, world_.get());
  (*ctx)->set_fetches(fetches);
  EstimatorSpec spec;
  try {
    spec = model_fn_(element, labels, mode, **ctx);
  } catch (const Error& e) {
    RethrowNamingBatch(e, mode, batch_number);
  }
  if (mode != Mode::kPredict && !spec.loss.valid()) {
    throw Error(
        fmt::format("model_fn returned no loss in {} mode", ModeName(mode)));
  }
  if (mode == Mode::kTrain && !spec.train_op) {
    throw Error("model_fn returned no train_op in train mode");
  }
  return spec;
}

int64_t Estimator::Train(const InputFn& input_fn, const Hooks& user_hooks,
                         std::optional<int64_t> steps,
                         std::optional<int64_t> max_steps) {
  if (steps && max_steps) {
    throw Error("Train: give steps or max_steps, not both");
  }
  if ((steps && *steps <= 0) || (max_steps && *max_steps <= 0)) {
    throw Error("Train: steps and max_steps must be positive");
  }
  TrainingSession session(*this, Mode::kTrain, config_.model_dir);
  const std::string iterator_state = RestoreInto(session, "");
  if (max_steps && session.global_step_ >= *max_steps) {
    Log(
        fmt::format("Skipping training since max_steps ({}) has already been "
                    "reached (global step {}).",
                    *max_steps, session.global_step_));
    return session.global_step_;
  }

  Hooks hooks = user_hooks;
  if (steps) hooks.push_back(StopAtStepHook::NumSteps(*steps));
  if (max_steps) hooks.push_back(StopAtStepHook::LastStep(*max_steps));
  // On a GPU the loss is checked at the logging cadence, so that the steps
  // between never wait for the device (TF checks every step).
  hooks.push_back(std::make_shared<NanTensorHook>(
      true, backend_->device() == Device::kCpu
                ? 1
                : std::max<int64_t>(config_.log_step_count_steps, 1)));
  // The chief logs, writes summaries and checkpoints (TF's chief-only
  // hooks); every rank runs the rest.
  const bool chief = world_->is_chief();
  if (chief && config_.log_step_count_steps > 0) {
    hooks.push_back(
        std::make_shared<StepCounterHook>(config_.log_step_count_steps));
    hooks.push_back(std::make_shared<LoggingTensorHook>(
        std::vector<std::string>{"loss", "global_step"},
        config_.log_step_count_steps));
  }
  if (chief && config_.save_summary_steps > 0) {
    hooks.push_back(std::make_shared<SummarySaverHook>(
        config_.save_summary_steps, std::vector<std::string>{"loss"}));
  }
  if (chief) {
    hooks.push_back(std::make_shared<CheckpointSaverHook>(
        config_.save_checkpoints_steps, config_.save_checkpoints_steps > 0
                                            ? 0
                                            : config_.save_checkpoints_secs));
  }

  Loop loop;
  loop.mode = Mode::kTrain;
  // The input's iterator is made once the session exists, and continues
  // where the checkpoint left it.
  loop.make_input = [&] {
    pipeline::Iterator it = input_fn().MakeIterator(InputOptions());
    if (iterator_state.empty()) return it;
    // The state does not fit this input (pipeline::Error: other stages) or
    // a file it names is gone or changed (records::Error); a training
    // error is none of these and is not caught here.
    const auto restart = [&](const recflow::Error& e) {
      Log(
          fmt::format("WARNING: the checkpoint's input position does not "
                      "fit this input_fn ({}); reading the input from its "
                      "start",
                      e.what()));
      it = input_fn().MakeIterator(InputOptions());
    };
    try {
      it.Restore(iterator_state);
      Log("Input iterator restored: the input continues where the "
          "checkpoint left it.");
    } catch (const pipeline::Error& e) {
      restart(e);
    } catch (const records::Error& e) {
      restart(e);
    }
    return it;
  };
  loop.step = [this](EstimatorSpec& spec, int64_t) {
    spec.train_op();
    return std::function<double()>(
        [this, &spec] { return ScalarOf(*backend_, spec.loss.value()); });
  };
  RunLoop(session, hooks, loop);
  if (session.events_) session.events_->Flush();
  return session.global_step_;
}

int64_t Estimator::RunLoop(TrainingSession& session, const Hooks& hooks,
                           const Loop& loop) {
  const bool training = loop.mode == Mode::kTrain;
  const bool distributed = training && world_->size() > 1;
  int64_t batches = 0;
  try {
    ForHooks(hooks, [](SessionRunHook& h) { h.begin(); });
    pipeline::Iterator it = loop.make_input();
    if (training) session.iterator_ = &it;
    ForHooks(hooks,
             [&](SessionRunHook& h) { h.after_create_session(session); });
    pipeline::Element element;
    // A stop some rank's hook asked for in its last after_run.
    bool stop_after = false;
    std::vector<std::string> fetches;  // this step's hooks'
    while (!loop.max_batches || batches < *loop.max_batches) {
      if (!distributed && stop_after) break;
      RunContext run(session);
      std::vector<SessionRunArgs> args;
      // A rank that asked to stop runs no more hooks; the others learn of
      // it in the collective below (their hooks may see one before_run
      // more, without a step).
      if (!stop_after) {
        for (auto& h : hooks) {
          if (!run.stop_requested()) args.push_back(h->before_run(run));
        }
      }
      // In training, decided together before the next batch is read, so
      // that every rank stops after the same step and no rank reads input
      // it will not train on (the checkpoint's position stays exact).
      const bool stop = stop_after || run.stop_requested();
      if (training ? world_->Any(stop) : stop) break;
      const bool has = it.Next(&element);
      const int64_t local_batch = has ? BatchSizeOf(element) : 0;
      int64_t batch = local_batch;
      if (distributed) {
        // Whether any rank's input ended, and the examples of all ranks.
        int64_t v[2] = {has ? 0 : 1, batch};
        world_->AllReduce(std::span(v), ReduceOp::kSum);
        if (v[0] > 0) {
          Log(fmt::format(
              "The input of {} of {} ranks ended at global step {}.", v[0],
              world_->size(), session.global_step_));
          break;
        }
        batch = v[1];
      } else if (!has) {
        if (training) {
          Log(fmt::format("The input ended at global step {}.",
                          session.global_step_));
        }
        break;
      }
      // Starts the batch's copy to the device on the copy stream, while
      // the device still computes the previous step.
      backend_->Prefetch(element);
      std::unique_ptr<ModelContext> ctx;
      Tensor labels;
      // In training a model_fn may skip predictions no hook fetches.
      fetches.clear();
      for (const SessionRunArgs& a : args) {
        fetches.insert(fetches.end(), a.fetches.begin(), a.fetches.end());
      }
      // A training step's calls, which a backend may run as one unit (a
      // CUDA graph); the hooks' fetches come after it.
      if (training) backend_->BeginStep();
      EstimatorSpec spec;
      std::function<double()> loss;
      try {
        const int64_t number =
            training ? session.global_step_ + 1 : batches + 1;
        spec = RunModel(session, element, loop.mode, &ctx, &labels, number,
                        training ? &fetches : nullptr);
        try {
          loss = loop.step(spec, local_batch);
        } catch (const Error& e) {
          RethrowNamingBatch(e, loop.mode, number);
        }
      } catch (...) {
        if (training) backend_->AbortStep();
        throw;
      }
      if (training) backend_->EndStep();
      ++batches;
      AfterRun(*backend_, hooks, args, run, spec, loss, session.global_step_,
               batch);
      stop_after = run.stop_requested();
      if (!distributed && stop_after) break;
    }
    ForHooks(hooks, [&](SessionRunHook& h) { h.end(session); });
    session.iterator_ = nullptr;
  } catch (const std::exception& e) {
    session.iterator_ = nullptr;
    NotifyException(hooks, e);
    throw;
  }
  return batches;
}

std::map<std::string, double> Estimator::Evaluate(
    const InputFn& input_fn, std::optional<int64_t> steps, const Hooks& hooks,
    const std::string& checkpoint_path, const std::string& name) {
  const std::string dir =
      (fs::path(config_.model_dir) / (name.empty() ? "eval" : "eval_" + name))
          .string();
  TrainingSession session(*this, Mode::kEval, dir);
  RestoreInto(session, checkpoint_path);
  if (session.restored_from_.empty()) {
    Log(
        fmt::format("WARNING: evaluating without a checkpoint in {}: the "
                    "model is freshly initialised",
                    config_.model_dir));
  }
  session.metrics_.Reset();
  Mean loss;
  Loop loop;
  loop.mode = Mode::kEval;
  loop.make_input = [&] { return input_fn().MakeIterator(InputOptions()); };
  loop.step = [&](EstimatorSpec& spec, int64_t batch) {
    const double value = ScalarOf(*backend_, spec.loss.value());
    loss.Update(value, static_cast<double>(batch));
    return std::function<double()>([value] { return value; });
  };
  loop.max_batches = steps;
  int64_t batches = RunLoop(session, hooks, loop);
  if (world_->size() > 1) {
    // Each rank evaluated its own share: add up what they accumulated.
    session.metrics_.AllReduce(*world_);
    std::vector<double> loss_sums = loss.Sums();
    world_->AllReduce(std::span(loss_sums), ReduceOp::kSum);
    loss.SetSums(loss_sums);
    batches = world_->Sum(batches);
  }
  std::map<std::string, double> results = session.metrics_.Results();
  results["loss"] = loss.Result();
  if (world_->is_chief()) {
    EventWriter& events = session.summary_writer();
    for (const auto& [metric, value] : results) {
      events.AddScalar(metric, value, session.global_step_);
    }
    events.Flush();
  }
  results["global_step"] = static_cast<double>(session.global_step_);
  std::string line =
      fmt::format("Saving dict for global step {}:", session.global_step_);
  for (const auto& [metric, value] : results) {
    line += fmt::format(" {} = {:.6g},", metric, value);
  }
  line.pop_back();
  Log(line + fmt::format(" ({} batches)", batches));
  return results;
}

void Estimator::Predict(
    const InputFn& input_fn,
    const std::function<bool(const std::map<std::string, Tensor>&)>& on_batch,
    const std::string& checkpoint_path) {
  TrainingSession session(*this, Mode::kPredict, config_.model_dir);
  RestoreInto(session, checkpoint_path);
  if (session.restored_from_.empty()) {
    throw Error(
        fmt::format("predict: no checkpoint in {}; train the model first",
                    config_.model_dir));
  }
  pipeline::Iterator it = input_fn().MakeIterator(InputOptions());
  pipeline::Element element;
  for (int64_t batch = 1; it.Next(&element); ++batch) {
    backend_->Prefetch(element);
    std::unique_ptr<ModelContext> ctx;
    Tensor labels;
    EstimatorSpec spec =
        RunModel(session, element, Mode::kPredict, &ctx, &labels, batch);
    if (spec.predictions.empty()) {
      throw Error("model_fn returned no predictions in infer mode");
    }
    std::map<std::string, Tensor> host;
    for (const auto& [name, t] : spec.predictions) {
      host.emplace(name, backend_->ToHost(t));
    }
    if (!on_batch(host)) break;
  }
}

std::map<std::string, double> Estimator::TrainAndEvaluate(
    const InputFn& train_input, const InputFn& eval_input, int64_t max_steps,
    int64_t eval_every_steps, const Hooks& train_hooks,
    std::optional<int64_t> eval_steps,
    const std::function<bool(const std::map<std::string, double>&)>&
        after_eval) {
  if (eval_every_steps <= 0) {
    throw Error("TrainAndEvaluate: eval_every_steps must be positive");
  }
  std::map<std::string, double> last;
  int64_t step = -1;
  while (true) {
    const int64_t before = step;
    std::string latest;
    if (world_->is_chief()) latest = checkpoints_.Latest().value_or("");
    if (world_->size() > 1) world_->Broadcast(latest, 0);
    const int64_t at = latest.empty() ? 0 : CheckpointStep(latest);
    const int64_t target = std::min(max_steps, at + eval_every_steps);
    step = Train(train_input, train_hooks, std::nullopt, target);
    last = Evaluate(eval_input, eval_steps);
    if (after_eval && !after_eval(last)) break;
    // Done at max_steps, or when the training input has run out.
    if (step >= max_steps || step == before || step < target) break;
  }
  return last;
}

}  // namespace recflow::train
