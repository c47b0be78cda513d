// Estimator: train, evaluate and predict a model_fn on input from
// pipeline/, with hooks, checkpoints and TensorBoard summaries, as
// tf.estimator.Estimator.
//
//   EstimatorSpec ModelFn(const Features& f, const Tensor* labels, Mode mode,
//                         ModelContext& ctx) {
//     Var x = ops::Constant(ctx.backend(), f["x"]);
//     Var logits = layers::Dense(ctx, x, {.units = 10});
//     EstimatorSpec spec;
//     spec.predictions["classes"] = ArgMax(ctx.backend(), logits.value());
//     if (mode == Mode::kPredict) return spec;
//     spec.loss = ops::SparseSoftmaxCrossEntropy(ctx.backend(), logits,
//                                                *labels);
//     if (mode == Mode::kTrain) {
//       spec.train_op = std::make_shared<Adam>(1e-3f)->Minimize(ctx,
//       spec.loss);
//     }
//     return spec;
//   }
//   Estimator est(ModelFn, {.model_dir = "/tmp/model"});
//   est.Train(input_fn, {}, /*steps=*/std::nullopt, /*max_steps=*/10000);
//   auto metrics = est.Evaluate(eval_input_fn);
//
// The model_fn runs every step (eagerly): it computes the forward pass on
// this step's batch with the variables of the context, and its train op
// runs backward and the update.  Input stays outside the model: input_fn
// returns a Dataset whose iterator the Estimator creates once the session
// exists, and checkpoints hold parameters, optimizer slots, the global
// step and that iterator's position, never data.
//
// Every Train/Evaluate/Predict starts from the latest checkpoint in
// model_dir (a damaged one is skipped, with a warning, for the previous),
// as TensorFlow's Estimator does; Train saves one at its end.
//
// Data-parallel (EstimatorOptions::collective of size N > 1; Horovod's
// model, docs/DISTRIBUTED.md): every rank constructs the Estimator and
// calls the same methods in the same order.  The chief (rank 0) alone
// reads and writes model_dir: it restores the checkpoint and broadcasts
// it (variables, global step, input position) to every rank; without a
// checkpoint every rank initialises from the chief's seed (broadcast at
// construction), which gives the chief's values (initial values are a
// function of seed and name only).  Each step every rank runs its own
// batch and the optimizer averages the gradients over the ranks (one
// all-reduce), so N ranks with batch B take the step one process takes
// with batch N x B.  Stops are collective: a hook's request_stop on any
// rank, or the end of any rank's input, stops every rank after the same
// step.  The chief runs the checkpoint, summary and logging hooks; user
// hooks run on every rank; SessionRunValues::batch_size counts the
// examples of all ranks.  input_fn shards the input itself (the
// collective's rank and size; FromTFRecordsGlobalShuffle's num_shards and
// shard_index keep the checkpointed position exact across a change of N).
// Evaluate reduces the loss and metrics over the ranks, each rank
// evaluating its own share.  A rank that throws leaves the others in a
// collective: callers end the job (Collective::Abort), as `recflow train`
// does.
//
// Thread safety: one call at a time per Estimator.
#ifndef RECFLOW_TRAIN_ESTIMATOR_H_
#define RECFLOW_TRAIN_ESTIMATOR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pipeline/dataset.h"
#include "train/backend.h"
#include "train/checkpoint.h"
#include "train/collective.h"
#include "train/event_writer.h"
#include "train/hooks.h"
#include "train/model_context.h"
#include "train/optimizers.h"

namespace recflow::train {

struct RunConfig {
  std::string model_dir;
  uint64_t seed = 0;  // initialisation, dropout and (via input_fn) order
  // Checkpoint every this many steps, or (0) every save_checkpoints_secs.
  int64_t save_checkpoints_steps = 0;
  double save_checkpoints_secs = 600;
  int keep_checkpoint_max = 5;  // <= 0: keep all
  int64_t save_summary_steps = 100;
  int64_t log_step_count_steps = 100;
  int threads = 0;  // CPU backend threads; 0: the machine's cores
  // Threads of the input pipeline's iterators (IteratorOptions::threads);
  // 0: the machine's cores, shared out among the ranks on this host.
  int input_threads = 0;
  // Where the model trains: "cpu", "cuda" (GPU 0; under MPI, the GPU of
  // the rank's local index, one GPU per rank on a host) or "cuda:N".  The
  // same model_fn, hooks and checkpoints work on each; a checkpoint written
  // on one device restores on the other.
  std::string device = "cpu";
  // On a GPU, each training step after the first two is captured into a
  // CUDA graph and launched as one (Backend::BeginStep): for small models,
  // whose steps cost more in kernel launches than in kernels.  The same
  // results; on by default: measured 1.8-1.9x a DNN step on an H200, and
  // no loss beyond the noise for the CNN (docs/PERFORMANCE.md).  The CPU
  // ignores it.
  bool cuda_graphs = true;
  // On a GPU, each batch's copy to the device is started on the input
  // pipeline's thread as the batch is made (Backend::InputStager; with a
  // Prefetch last in the input_fn, as tf.data advises, that is the
  // prefetch's driver thread), instead of on the training thread at the
  // start of its step.  The same results.  The CPU ignores it.
  bool stage_input = true;
  // On a GPU, small batches in pinned memory are read by the step where
  // the pipeline made them, not copied (Backend::SetInputInPlace; then no
  // batch is staged).  The same results.  Off by default: not yet measured
  // on a GPU.  The CPU ignores it.
  bool read_input_in_place = false;
};

using Features = pipeline::Element;

struct EstimatorSpec {
  Var loss;                                   // TRAIN and EVAL
  TrainOp train_op;                           // TRAIN
  std::map<std::string, Tensor> predictions;  // PREDICT (and fetchable)
  std::map<std::string, Tensor> tensors;      // more fetchable values
};

// labels is null in PREDICT mode or when the element has no label.
using ModelFn =
    std::function<EstimatorSpec(const Features& features, const Tensor* labels,
                                Mode mode, ModelContext& ctx)>;
using InputFn = std::function<pipeline::Dataset()>;
using Hooks = std::vector<std::shared_ptr<SessionRunHook>>;

struct EstimatorOptions {
  // The element component passed as labels (and removed from features).
  std::string label_key = "label";
  // Null: the backend RunConfig::device names (the CPU backend with
  // RunConfig::threads threads, or the CUDA backend).
  std::shared_ptr<Backend> backend;
  // Where the estimator's log lines go (null: stderr, one line each).  The
  // input pipeline's own notices go to pipeline::SetLogSink's sink.
  std::function<void(std::string_view)> log;
  // The ranks that train together (null: this process alone); see above.
  std::shared_ptr<Collective> collective;
};

class Estimator;

// The running session a hook sees.
class TrainingSession {
 public:
  Mode mode() const { return mode_; }
  int64_t global_step() const { return global_step_; }
  const RunConfig& config() const;
  Estimator& estimator() { return est_; }
  VariableStore& variables() { return variables_; }
  // TRAIN: writes a checkpoint of the variables, the global step and the
  // input iterator's position now; returns its path.  Only the chief
  // writes: on the other ranks of a data-parallel job it does nothing and
  // returns "".
  std::string SaveCheckpoint();
  // The event file of this session (model_dir, or model_dir/eval[_name]).
  EventWriter& summary_writer();
  void Log(std::string_view line) const;
  // The checkpoint this session started from (empty: none).
  const std::string& restored_from() const { return restored_from_; }
  // The step of the last checkpoint written or restored (-1: none).
  int64_t last_saved_step() const { return last_saved_step_; }

 private:
  friend class Estimator;
  TrainingSession(Estimator& est, Mode mode, std::string summary_dir);

  Estimator& est_;
  Mode mode_;
  std::string summary_dir_;
  int64_t global_step_ = 0;
  VariableStore variables_;
  MetricSet metrics_;
  std::unique_ptr<EventWriter> events_;
  pipeline::Iterator* iterator_ = nullptr;
  std::string restored_from_;
  int64_t last_saved_step_ = -1;
};

class Estimator {
 public:
  Estimator(ModelFn model_fn, RunConfig config, EstimatorOptions options = {});
  ~Estimator();

  // Trains until the input ends, `steps` more steps, or `max_steps` in
  // total (nothing when already reached), or a hook stops it.  Returns the
  // global step.
  int64_t Train(const InputFn& input_fn, const Hooks& hooks = {},
                std::optional<int64_t> steps = std::nullopt,
                std::optional<int64_t> max_steps = std::nullopt);

  // Evaluates the checkpoint (default: the latest) over `steps` batches or
  // the whole input.  Returns "loss" (the mean over examples), the
  // model_fn's metrics and "global_step", and writes them as summaries to
  // model_dir/eval (or eval_<name>).
  std::map<std::string, double> Evaluate(
      const InputFn& input_fn, std::optional<int64_t> steps = std::nullopt,
      const Hooks& hooks = {}, const std::string& checkpoint_path = "",
      const std::string& name = "");

  // Streams the model_fn's predictions, one batch at a time, to
  // `on_batch` (return false to stop).
  void Predict(
      const InputFn& input_fn,
      const std::function<bool(const std::map<std::string, Tensor>&)>& on_batch,
      const std::string& checkpoint_path = "");

  // Alternates Train(eval_every_steps more steps) and Evaluate until
  // max_steps or the training input ends; returns the last evaluation.
  // `after_eval` (optional) sees each evaluation and may return false to
  // stop.
  std::map<std::string, double> TrainAndEvaluate(
      const InputFn& train_input, const InputFn& eval_input, int64_t max_steps,
      int64_t eval_every_steps, const Hooks& train_hooks = {},
      std::optional<int64_t> eval_steps = std::nullopt,
      const std::function<bool(const std::map<std::string, double>&)>&
          after_eval = {});

  const RunConfig& config() const { return config_; }
  Backend& backend() { return *backend_; }
  // The ranks training together (a world of one by default).
  Collective& collective() { return *world_; }
  std::optional<std::string> latest_checkpoint() const;
  void Log(std::string_view line) const;

 private:
  friend class TrainingSession;
  // Restores the latest (or given) checkpoint into `session`; returns the
  // iterator state it held (empty when none).
  std::string RestoreInto(TrainingSession& session,
                          const std::string& checkpoint_path);
  // The options of input_fn's iterators (RunConfig::input_threads).
  pipeline::IteratorOptions InputOptions() const;
  // Splits an element into features and labels; runs model_fn, whose
  // train::Errors are rethrown naming the batch by `batch_number` (the
  // global step it trains in training).  `fetches`: what the step's hooks
  // fetch (ModelContext::Fetched; null: unknown).
  EstimatorSpec RunModel(TrainingSession& session, pipeline::Element& element,
                         Mode mode, std::unique_ptr<ModelContext>* ctx,
                         Tensor* labels_out, int64_t batch_number,
                         const std::vector<std::string>* fetches = nullptr);
  // The one session loop of Train and Evaluate: begin, the input made by
  // `make_input`, after_create_session, then per batch before_run, the
  // model (RunModel), `step` (the train op, or the eval loss: it returns
  // what hooks read as the loss) and after_run, until a hook stops, the
  // input ends or `max_batches` ran; then end (on an exception, the hooks
  // that take one are told).  Training (`mode` kTrain) decides stopping and
  // the end of input with every rank and exposes the iterator to hooks
  // (for checkpoints); evaluation runs each rank's share alone.  Returns
  // the batches run.
  struct Loop {
    Mode mode;
    std::function<pipeline::Iterator()> make_input;
    std::function<std::function<double()>(EstimatorSpec& spec, int64_t batch)>
        step;
    std::optional<int64_t> max_batches;
  };
  int64_t RunLoop(TrainingSession& session, const Hooks& hooks,
                  const Loop& loop);

  ModelFn model_fn_;
  RunConfig config_;
  EstimatorOptions options_;
  // The world first: the backend's GPU is the local rank's (and the
  // backend, with its NCCL communicator, goes before the world does).
  std::shared_ptr<Collective> world_;
  std::shared_ptr<Backend> backend_;
  CheckpointManager checkpoints_;
};

// Key of the input iterator's state in checkpoints; "global_step" holds
// the step (int64 scalar).
inline constexpr char kIteratorStateKey[] = "_input_iterator_state";

// The index of the largest value of each row of a [rows, cols] float
// tensor, as int64 [rows] (tf.argmax(axis=-1)), in the backend's memory.
Tensor ArgMax(Backend& be, const Tensor& logits);

}  // namespace recflow::train

#endif  // RECFLOW_TRAIN_ESTIMATOR_H_
