// A small synthetic problem for tests that run the Estimator: three
// Gaussian clusters, a one-hidden-layer classifier, a quiet config.
#ifndef RECFLOW_TESTS_TRAIN_ESTIMATOR_TEST_UTIL_H_
#define RECFLOW_TESTS_TRAIN_ESTIMATOR_TEST_UTIL_H_

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "pipeline/dataset.h"
#include "train/estimator.h"
#include "train/layers.h"
#include "train/metrics.h"
#include "train/ops.h"
#include "train/optimizers.h"

namespace recflow::train::estimator_testing {

using pipeline::Dataset;
using pipeline::Element;

// Three Gaussian clusters in 2-D, labelled by cluster, with an id per
// example so tests can see which examples a step trained on.
inline Element Clusters(int64_t n, uint64_t seed) {
  std::vector<float> x(static_cast<size_t>(2 * n));
  std::vector<int64_t> label(static_cast<size_t>(n)),
      id(static_cast<size_t>(n));
  pipeline::Rng rng(seed);
  const float centers[3][2] = {{2, 0}, {-1, 1.7f}, {-1, -1.7f}};
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = static_cast<int64_t>(rng.Below(3));
    for (int d = 0; d < 2; ++d) {
      const double u = (rng.Next() >> 11) * 0x1.0p-53 - 0.5;
      x[static_cast<size_t>(2 * i + d)] = centers[c][d] + static_cast<float>(u);
    }
    label[static_cast<size_t>(i)] = c;
    id[static_cast<size_t>(i)] = i;
  }
  Element e;
  e.Set("x", Tensor::FromValues<float>(x, Shape{n, 2}));
  e.Set("label", Tensor::FromValues<int64_t>(label, Shape{n}));
  e.Set("id", Tensor::FromValues<int64_t>(id, Shape{n}));
  return e;
}

inline InputFn TrainInput(int64_t repeat = -1) {
  return [repeat] {
    return Dataset::FromTensorSlices(Clusters(600, 1))
        .Shuffle(200, 5)
        .Repeat(repeat)
        .Batch(32)
        .Prefetch(2);
  };
}

inline InputFn EvalInput() {
  return [] { return Dataset::FromTensorSlices(Clusters(300, 2)).Batch(64); };
}

struct Recorder {
  // Per training step: the first ids of its batch and its loss.
  std::vector<std::vector<int64_t>> ids;
  std::vector<float> losses;
};

inline ModelFn Classifier(int64_t hidden = 16, Recorder* rec = nullptr,
                          bool nan_loss = false) {
  return [=](const Features& f, const Tensor* labels, Mode mode,
             ModelContext& ctx) {
    Var x = ops::Constant(ctx.backend(), f["x"]);
    Var h = layers::Dense(ctx, x,
                          {.units = hidden, .activation = Activation::kRelu});
    Var logits = layers::Dense(ctx, h, {.units = 3});
    EstimatorSpec spec;
    spec.predictions["classes"] = ArgMax(ctx.backend(), logits.value());
    spec.tensors["first_id"] = f["id"].Slice(0);
    if (mode == Mode::kPredict) return spec;
    spec.loss = ops::SparseSoftmaxCrossEntropy(ctx.backend(), logits, *labels);
    if (nan_loss) spec.loss = ops::Scale(ctx.backend(), spec.loss, NAN);
    if (mode == Mode::kEval) {
      const Tensor classes = ArgMax(ctx.backend(), logits.value());
      ctx.metrics()
          .Get<Accuracy>("accuracy")
          .Update(labels->values<int64_t>(), classes.values<int64_t>());
    }
    if (mode == Mode::kTrain) {
      if (rec != nullptr) {
        const auto ids = f["id"].values<int64_t>();
        rec->ids.emplace_back(ids.begin(), ids.end());
        rec->losses.push_back(spec.loss.value().data<float>()[0]);
      }
      spec.train_op = std::make_shared<Adam>(0.05f)->Minimize(ctx, spec.loss);
    }
    return spec;
  };
}

inline RunConfig Config(const std::string& dir) {
  RunConfig c;
  c.model_dir = dir;
  c.seed = 11;
  c.save_checkpoints_steps = 10;
  c.save_summary_steps = 10;
  c.log_step_count_steps = 50;
  c.threads = 2;
  return c;
}

inline EstimatorOptions Quiet() {
  EstimatorOptions o;
  o.log = [](std::string_view) {};
  return o;
}

}  // namespace recflow::train::estimator_testing

#endif  // RECFLOW_TESTS_TRAIN_ESTIMATOR_TEST_UTIL_H_
