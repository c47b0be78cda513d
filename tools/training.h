// Training on TFRecord files of tf.Examples with a canned model: what
// `recflow train` and the demo's training step run.
#ifndef RECFLOW_TOOLS_TRAINING_H_
#define RECFLOW_TOOLS_TRAINING_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "records/feature_spec.h"
#include "train/collective.h"

namespace recflow::tools {

struct TrainJob {
  std::string model = "dnn";  // linear, dnn, cnn
  records::FeatureSpec spec;
  std::string label = "label";
  std::vector<std::string> train_files, eval_files;
  std::string model_dir;
  // Feature keys to train on (empty: every FixedLen feature of the spec
  // but the label; with an image, its int64 height/width/channels
  // scalars are left out).
  std::vector<std::string> features;
  // The shape of a raw-bytes image feature; empty: height/width features
  // of the first record, else a square single-channel image.
  std::vector<int64_t> image_shape;
  int n_classes = 10;  // --classes: at least 2
  std::vector<int64_t> hidden = {256, 128};
  int64_t batch = 128;
  int64_t steps = 5000;       // total (max_steps): a rerun resumes
  int64_t eval_every = 1000;  // steps between evaluations
  std::string optimizer = "adam";
  float learning_rate = 0.001f;
  float dropout = 0.0f;
  int64_t shuffle = 10000;
  // Read the training files in a global shuffle (every record once per
  // epoch, by index) instead of through a shuffle buffer.  Data-parallel
  // jobs always do: it is the input whose checkpointed position carries
  // over exactly to another number of ranks.
  bool global_shuffle = false;
  uint64_t seed = 1;
  int threads = 0;
  std::string device = "cpu";  // cpu, cuda, cuda:N
  bool cuda_graphs = true;     // RunConfig::cuda_graphs
  int64_t save_checkpoints_steps = 500;
  bool live = false;                          // a progress line on stderr
  std::function<void(std::string_view)> log;  // null: stderr
  // The ranks training together (null: this process alone).  Each rank
  // reads its share of the training and evaluation records.
  std::shared_ptr<train::Collective> world;
};

struct TrainResult {
  std::map<std::string, double> eval;  // the last evaluation
  int64_t global_step = 0;
  int64_t start_step = 0;  // where this run started (a resumed run: > 0)
  std::string restored_from;
  double train_seconds = 0;  // in training steps, evaluations excluded
  double eval_seconds = 0;
  double examples_per_s = 0;
  std::string model_dir;
  std::string device;  // what trained: the GPU's name or the CPU backend's
  // The feature columns used, e.g. " x: numeric [1]; image: image 28x28x1
  // scaled to [0, 1]" (--json's "columns", the text's "features:").
  std::string columns;
  int preempted_by = 0;  // SIGTERM/SIGINT that stopped it (checkpointed)
  int ranks = 1;         // processes that trained together
  // Training steps launched as one CUDA graph (RunConfig::cuda_graphs).
  uint64_t graph_launches = 0;
};

TrainResult RunTraining(const TrainJob& job);

}  // namespace recflow::tools

#endif  // RECFLOW_TOOLS_TRAINING_H_
