// recflow train: trains a canned model (linear, dnn, cnn) on TFRecord files
// of tf.Examples, evaluating every N steps, with checkpoints and
// TensorBoard logs in --model-dir; run again, it resumes.  Under mpirun
// (`mpirun -np N recflow train ...`) the N processes train one model
// data-parallel: docs/DISTRIBUTED.md.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "tools/cli.h"
#include "tools/training.h"

namespace recflow::tools {
namespace {

struct TrainOptions {
  TrainJob job;
  std::string spec_path;
  std::vector<std::string> train, eval;
  bool json = false;
};

int PrintResult(const TrainOptions& o, const TrainResult& r);

int RunTrain(TrainOptions& o) {
  if (train::LaunchedByMpi()) o.job.world = train::MpiWorld();
  const train::Collective* world = o.job.world.get();
  const bool chief = world == nullptr || world->is_chief();
  o.job.live = chief && !o.json && isatty(STDERR_FILENO);
  if (o.json || !chief) o.job.log = [](std::string_view) {};
  const auto run = [&] {
    o.job.spec = records::FeatureSpec::FromFile(o.spec_path);
    o.job.train_files = ExpandInputs(o.train);
    o.job.eval_files = ExpandInputs(o.eval);
    const TrainResult r = RunTraining(o.job);
    return chief ? PrintResult(o, r) : kExitOk;
  };
  if (world == nullptr || world->size() == 1) return run();
  try {
    return run();
  } catch (const std::exception& e) {
    // One rank of several: its error ends the whole job (the others would
    // wait in a collective), named by rank.
    fmt::print(stderr, "recflow: rank {} of {}: {}\n", world->rank(),
               world->size(), e.what());
    std::fflush(stderr);
    o.job.world->Abort(ExitCodeFor(e));
    throw;  // Abort does not return in a world of several
  }
}

int PrintResult(const TrainOptions& o, const TrainResult& r) {
  if (o.json) {
    nlohmann::json out = {{"model_dir", r.model_dir},
                          {"global_step", r.global_step},
                          {"start_step", r.start_step},
                          {"train_seconds", r.train_seconds},
                          {"eval_seconds", r.eval_seconds},
                          {"examples_per_s", r.examples_per_s},
                          {"device", r.device},
                          {"columns", r.columns},
                          {"preempted", r.preempted_by != 0},
                          {"ranks", r.ranks},
                          {"cuda_graph_launches", r.graph_launches},
                          {"eval", r.eval}};
    fmt::print("{}\n", out.dump());
    return kExitOk;
  }
  std::string metrics;
  for (const auto& [k, v] : r.eval) {
    if (k != "global_step") metrics += fmt::format(" {} {:.4f},", k, v);
  }
  if (!metrics.empty()) metrics.pop_back();
  fmt::print(
      "{} at global step {}{}:{}\n"
      "trained {:.1f} s at {:.0f} examples/s on {}{} (evaluation {:.1f} s)\n"
      "features:{}\n"
      "checkpoints and TensorBoard logs: {}   (tensorboard --logdir {})\n",
      r.preempted_by ? "stopped by a signal (checkpoint saved)" : "evaluated",
      r.global_step,
      r.start_step > 0 ? fmt::format(" (resumed from step {})", r.start_step)
                       : "",
      metrics, r.train_seconds, r.examples_per_s, r.device,
      r.ranks > 1 ? fmt::format(" x {} ranks", r.ranks) : "", r.eval_seconds,
      r.columns, r.model_dir, r.model_dir);
  return kExitOk;
}

}  // namespace

Runner AddTrainCommand(CLI::App& app) {
  auto o = std::make_shared<TrainOptions>();
  TrainJob& j = o->job;
  app.add_option("--model", j.model, "linear, dnn or cnn")
      ->capture_default_str()
      ->check(CLI::IsMember({"linear", "dnn", "cnn"}));
  app.add_option("--spec", o->spec_path, "FeatureSpec JSON of the records")
      ->required();
  app.add_option("--label", j.label, "the feature to predict (int64 classes)")
      ->capture_default_str();
  app.add_option("--train", o->train, "training files, globs or directories")
      ->required();
  app.add_option("--eval", o->eval, "evaluation files, globs or directories")
      ->required();
  app.add_option("--model-dir", j.model_dir,
                 "checkpoints and TensorBoard logs; resumed from when it "
                 "holds a checkpoint")
      ->required();
  app.add_option("--features", j.features,
                 "feature keys to train on (default: every FixedLen feature "
                 "but the label)")
      ->delimiter(',');
  app.add_option("--image-shape", j.image_shape,
                 "H,W,C of a raw-bytes image feature (default: from the "
                 "records' height/width, else square)")
      ->delimiter(',');
  app.add_option("--classes", j.n_classes,
                 "number of classes: the label's int64 ids are in [0, N)")
      ->capture_default_str();
  app.add_option("--hidden", j.hidden,
                 "hidden layer sizes (dnn); cnn: its dense layer")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--batch", j.batch, "examples per step")
      ->capture_default_str()
      ->check(Positive());
  app.add_option("--steps", j.steps,
                 "total training steps (a rerun continues up to it)")
      ->capture_default_str()
      ->check(Positive());
  app.add_option("--eval-every", j.eval_every, "steps between evaluations")
      ->capture_default_str()
      ->check(Positive());
  app.add_option("--optimizer", j.optimizer, "sgd, momentum or adam")
      ->capture_default_str()
      ->check(CLI::IsMember({"sgd", "momentum", "adam"}));
  app.add_option("--learning-rate", j.learning_rate)
      ->capture_default_str()
      ->check(Positive());
  app.add_option("--dropout", j.dropout,
                 "dropout after hidden layers: the fraction of units dropped, "
                 "in [0, 1)")
      ->capture_default_str()
      ->check(Fraction());
  app.add_option("--shuffle", j.shuffle, "shuffle buffer (examples)")
      ->capture_default_str()
      ->check(Positive());
  app.add_flag("--global-shuffle", j.global_shuffle,
               "read the training records in a global shuffle (by index, "
               "every record once per epoch) instead of a shuffle buffer; "
               "always on under mpirun with several ranks");
  app.add_option("--seed", j.seed, "initialisation, dropout and input order")
      ->capture_default_str();
  app.add_option("--device", j.device,
                 "where to train: cpu, cuda (GPU 0; under mpirun the GPU of "
                 "the rank's local index, gradients all-reduced by NCCL) or "
                 "cuda:N; checkpoints move between them")
      ->capture_default_str();
  app.add_flag("--cuda-graphs,!--no-cuda-graphs", j.cuda_graphs,
               "on a GPU, launch each training step as one captured CUDA "
               "graph (fewer launches for small models; same results; the "
               "default), or each call by itself");
  app.add_option("--threads", j.threads, "compute threads (0: all cores)")
      ->capture_default_str()
      ->check(NonNegative());
  app.add_option("--save-checkpoints-steps", j.save_checkpoints_steps)
      ->capture_default_str()
      ->check(Positive());
  app.add_flag("--json", o->json,
               "print one JSON object as the last line instead of progress");
  return [o] { return RunTrain(*o); };
}

}  // namespace recflow::tools
