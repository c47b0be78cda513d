#include "tools/training.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>

#include "pipeline/dataset.h"
#include "records/example_parser.h"
#include "records/tfrecord_reader.h"
#include "tools/cli.h"
#include "train/basic_session_run_hooks.h"
#include "train/canned.h"

namespace recflow::tools {
namespace {

using records::FeatureConfig;
using train::FeatureColumn;

bool IsImageMetadata(const std::string& name) {
  return name == "height" || name == "width" || name == "channels" ||
         name == "depth";
}

// The first record's image `key` (its byte length) and its int64
// height/width features (-1 where missing), read in one parse.
struct FirstImage {
  int64_t bytes = 0, height = -1, width = -1;
};

FirstImage ReadFirstImage(const std::vector<std::string>& files,
                          const std::string& key, const FeatureConfig& config) {
  records::FeatureSpec spec;
  spec.Add(key, config);
  FeatureConfig dim;
  dim.dtype = records::DType::kInt64;
  dim.default_value = records::DefaultValue{{}, {-1}, {}};
  spec.Add("height", dim);
  spec.Add("width", dim);
  pipeline::Iterator it = pipeline::Dataset::FromTFRecords(files)
                              .Take(1)
                              .Parse(spec)
                              .MakeIterator();
  pipeline::Element e;
  if (!it.Next(&e)) throw UsageError("the training files hold no records");
  return {static_cast<int64_t>(e[key].bytes(0).size()),
          e["height"].scalar<int64_t>(), e["width"].scalar<int64_t>()};
}

std::vector<int64_t> ImageShape(const TrainJob& job, const std::string& key,
                                const FeatureConfig& config) {
  if (!job.image_shape.empty()) {
    if (job.image_shape.size() != 3) {
      throw UsageError("--image-shape takes HEIGHT,WIDTH,CHANNELS");
    }
    return job.image_shape;
  }
  const auto [bytes, h, w] = ReadFirstImage(job.train_files, key, config);
  if (h > 0 && w > 0 && bytes % (h * w) == 0) return {h, w, bytes / (h * w)};
  const auto side = static_cast<int64_t>(std::llround(std::sqrt(bytes)));
  if (side * side != bytes) {
    throw UsageError(fmt::format(
        "feature {} holds {} bytes per example, not a square image, and the "
        "records have no height/width features: give --image-shape H,W,C "
        "(a bytes feature is read as a raw image; leave text out with "
        "--features)",
        key, bytes));
  }
  return {side, side, 1};
}

struct Columns {
  std::vector<FeatureColumn> columns;
  std::optional<FeatureColumn> image;
  std::string description;
};

Columns ColumnsFor(const TrainJob& job) {
  Columns out;
  for (const std::string& want : job.features) {
    if (job.spec.Find(want) == nullptr) {
      std::vector<std::string> names;
      for (const auto& [name, config] : job.spec.features) {
        names.push_back(name);
      }
      throw UsageError(fmt::format(
          "--features names {}, which the spec does not have (it has {})", want,
          fmt::join(names, ", ")));
    }
    if (want == job.label) {
      throw UsageError(fmt::format(
          "--features names {}, the label: a model does not take its label "
          "as a feature",
          want));
    }
  }
  bool has_image = false;
  for (const auto& [name, config] : job.spec.features) {
    has_image |= name != job.label && config.dtype == records::DType::kBytes &&
                 config.kind == FeatureConfig::Kind::kFixed &&
                 config.num_elements() == 1;
  }
  for (const auto& [name, config] : job.spec.features) {
    if (name == job.label) continue;
    if (!job.features.empty() &&
        std::find(job.features.begin(), job.features.end(), name) ==
            job.features.end()) {
      continue;
    }
    if (job.features.empty() && has_image && IsImageMetadata(name)) continue;
    if (config.kind != FeatureConfig::Kind::kFixed) {
      throw UsageError(fmt::format(
          "feature {} is VarLen; the canned models take FixedLen features "
          "(leave it out with --features)",
          name));
    }
    if (config.dtype == records::DType::kBytes) {
      if (config.num_elements() != 1) {
        throw UsageError(fmt::format(
            "feature {}: bytes features are taken as one raw image each; "
            "this one has shape [{}]",
            name, fmt::join(config.shape, ", ")));
      }
      const auto s = ImageShape(job, name, config);
      FeatureColumn c = train::RawBytesColumn(
          name, pipeline::Shape{s[0], s[1], s[2]}, 1.0f / 255);
      out.description += fmt::format(" {}: image {}x{}x{} scaled to [0, 1];",
                                     name, s[0], s[1], s[2]);
      if (out.image) {
        throw UsageError(
            "more than one image feature; choose one with --features");
      }
      out.image = c;
      out.columns.push_back(c);
    } else {
      std::vector<int64_t> shape = config.shape;
      if (shape.empty()) shape = {1};
      out.columns.push_back(train::NumericColumn(
          name, pipeline::Shape(std::span<const int64_t>(shape))));
      out.description +=
          fmt::format(" {}: numeric [{}];", name, fmt::join(shape, ", "));
    }
  }
  if (out.columns.empty()) {
    throw UsageError(
        fmt::format("no features to train on: the spec holds only the label {}",
                    job.label));
  }
  if (!out.description.empty()) out.description.pop_back();
  return out;
}

// Counts examples and time spent in training steps.
class ThroughputHook : public train::SessionRunHook {
 public:
  ThroughputHook(const TrainJob& job, double* seconds, int64_t* examples)
      : job_(job), seconds_(seconds), examples_(examples) {}
  void begin() override { start_ = std::chrono::steady_clock::now(); }
  // Fetches the loss only on steps that print it: a fetch waits for a
  // GPU's step to finish.
  train::SessionRunArgs before_run(train::RunContext&) override {
    const auto now = std::chrono::steady_clock::now();
    print_ = job_.live && now - last_print_ >= std::chrono::milliseconds(250);
    if (!print_) return {};
    last_print_ = now;
    return {{"loss", "global_step"}};
  }
  void after_run(train::RunContext&,
                 const train::SessionRunValues& v) override {
    *examples_ += v.batch_size;
    if (!print_) return;
    const auto now = std::chrono::steady_clock::now();
    const double s =
        *seconds_ + std::chrono::duration<double>(now - start_).count();
    fmt::print(stderr, "\r  step {:>6}/{}  loss {:.4f}  {:.0f} examples/s   ",
               static_cast<int64_t>(v.scalar("global_step")), job_.steps,
               v.scalar("loss"), s > 0 ? *examples_ / s : 0.0);
  }
  void end(train::TrainingSession& session) override {
    // The time includes the device's work on the last steps.
    session.estimator().backend().Synchronize();
    Stop();
  }
  void on_exception(const std::exception&) override { Stop(); }

 private:
  void Stop() {
    *seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_)
            .count();
    if (job_.live) fmt::print(stderr, "\r{:78}\r", "");
  }
  const TrainJob& job_;
  double* seconds_;
  int64_t* examples_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_print_;
  bool print_ = false;
};

}  // namespace

TrainResult RunTraining(const TrainJob& job) {
  if (job.train_files.empty()) throw UsageError("no training files");
  if (job.eval_files.empty()) throw UsageError("no evaluation files");
  if (job.model_dir.empty()) throw UsageError("--model-dir is required");
  if (job.batch <= 0 || job.steps <= 0 || job.eval_every <= 0) {
    throw UsageError("--batch, --steps and --eval-every must be positive");
  }
  const records::FeatureConfig* label = job.spec.Find(job.label);
  if (label == nullptr || label->kind != FeatureConfig::Kind::kFixed ||
      label->num_elements() != 1) {
    throw UsageError(fmt::format(
        "the spec has no FixedLen scalar feature {} to use as the label",
        job.label));
  }
  const int n_classes = job.n_classes;
  if (n_classes < 2) {
    throw UsageError(fmt::format(
        "--classes {}: a classifier has at least 2 classes", n_classes));
  }
  // The label's dtype, before anything trains: a bytes label cannot be a
  // class, and a float one only the 0/1 target of a binary classifier.
  if (label->dtype == records::DType::kBytes ||
      (label->dtype != records::DType::kInt64 && n_classes > 2)) {
    throw UsageError(fmt::format(
        "--label {} is {} in the spec; a classifier of {} classes takes "
        "int64 class ids in [0, {}){} (make it int64 in the spec)",
        job.label, records::DTypeName(label->dtype), n_classes, n_classes,
        n_classes == 2 ? " or float 0/1" : ""));
  }
  const Columns cols = ColumnsFor(job);

  train::RunConfig config;
  config.model_dir = job.model_dir;
  config.seed = job.seed;
  config.save_checkpoints_steps = job.save_checkpoints_steps;
  config.keep_checkpoint_max = 5;
  config.save_summary_steps = 100;
  config.log_step_count_steps = job.live ? 0 : 500;
  config.threads = job.threads;
  config.device = job.device;
  config.cuda_graphs = job.cuda_graphs;
  const auto lr = train::ConstantLearningRate(job.learning_rate);
  train::ModelFn model_fn;
  if (job.model == "linear") {
    model_fn = train::LinearClassifierFn({.columns = cols.columns,
                                          .n_classes = n_classes,
                                          .optimizer = job.optimizer,
                                          .learning_rate = lr});
  } else if (job.model == "dnn") {
    model_fn = train::DNNClassifierFn({.hidden_units = job.hidden,
                                       .columns = cols.columns,
                                       .n_classes = n_classes,
                                       .dropout = job.dropout,
                                       .optimizer = job.optimizer,
                                       .learning_rate = lr});
  } else if (job.model == "cnn") {
    if (!cols.image) {
      throw UsageError("--model cnn needs an image (a bytes feature)");
    }
    train::CNNOptions o;
    o.image = *cols.image;
    o.dense_units = {job.hidden.empty() ? 128 : job.hidden.front()};
    o.dropout = job.dropout;
    o.n_classes = n_classes;
    o.optimizer = job.optimizer;
    o.learning_rate = lr;
    model_fn = train::CNNClassifierFn(o);
  } else {
    throw UsageError(fmt::format(
        "unknown --model {} (expected linear, dnn or cnn)", job.model));
  }
  train::EstimatorOptions options;
  options.label_key = job.label;
  options.log = job.log;
  options.collective = job.world;
  train::Estimator est(model_fn, config, options);
  train::Collective& world = est.collective();
  const int64_t ranks = world.size(), rank = world.rank();

  pipeline::ParseOptions parse;
  parse.num_parallel_calls = pipeline::kAutotune;
  const bool global_shuffle = job.global_shuffle || ranks > 1;
  if (ranks > 1 && world.is_chief()) {
    est.Log(fmt::format(
        "{} ranks ({}): each trains on batches of {} ({} a step), reading "
        "its share of a global shuffle; rank 0 writes {}",
        ranks, world.name(), job.batch, job.batch * ranks, job.model_dir));
  }
  const auto train_input = [&] {
    if (global_shuffle) {
      // Rank r of N takes positions r, r + N, ... of the epochs' stream:
      // the checkpoint's position continues exactly on any N.
      pipeline::GlobalShuffleOptions o;
      o.seed = job.seed;
      o.num_shards = ranks;
      o.shard_index = rank;
      o.num_epochs = -1;
      return pipeline::Dataset::FromTFRecordsGlobalShuffle(job.train_files, o)
          .Batch(job.batch, /*drop_remainder=*/true)
          .Parse(job.spec, parse)
          .Prefetch(2);
    }
    pipeline::TFRecordOptions source;
    source.num_parallel_reads =
        static_cast<int>(std::min<size_t>(4, job.train_files.size()));
    source.shuffle_files = true;
    source.seed = job.seed;
    return pipeline::Dataset::FromTFRecords(job.train_files, source)
        .Shuffle(job.shuffle, job.seed)
        .Repeat()
        .Batch(job.batch, /*drop_remainder=*/true)
        .Parse(job.spec, parse)
        .Prefetch(2);
  };
  const auto eval_input = [&] {
    // Each rank evaluates its share (whole files when there are enough);
    // the Estimator adds up the ranks' metrics.
    return pipeline::Dataset::FromTFRecords(job.eval_files)
        .Shard(ranks, rank)
        .Batch(500)
        .Parse(job.spec, parse)
        .Prefetch(2);
  };

  TrainResult result;
  result.model_dir = job.model_dir;
  result.device = est.backend().device_name();
  result.columns = cols.description;
  if (auto latest = est.latest_checkpoint()) {
    result.restored_from = *latest;
    result.start_step = train::CheckpointStep(*latest);
  }
  int64_t examples = 0;
  auto throughput =
      std::make_shared<ThroughputHook>(job, &result.train_seconds, &examples);
  auto preemption = std::make_shared<train::PreemptionHook>();
  const auto start = std::chrono::steady_clock::now();
  result.eval =
      est.TrainAndEvaluate(train_input, eval_input, job.steps, job.eval_every,
                           {throughput, preemption}, std::nullopt,
                           [&](const std::map<std::string, double>&) {
                             // A signal on any rank ends every rank.
                             return !world.Any(preemption->preempted_by() != 0);
                           });
  const double total =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  result.global_step = static_cast<int64_t>(result.eval.at("global_step"));
  result.examples_per_s =
      result.train_seconds > 0 ? examples / result.train_seconds : 0;
  result.eval_seconds = std::max(0.0, total - result.train_seconds);
  result.preempted_by = preemption->preempted_by();
  result.ranks = static_cast<int>(ranks);
  result.graph_launches = est.backend().step_graph_stats().launches;
  return result;
}

}  // namespace recflow::tools
