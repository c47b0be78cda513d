// Canned estimators over feature columns, as tf.estimator's
// LinearClassifier/Regressor and DNNClassifier/Regressor, plus a small
// convolutional classifier for images (recflow's own, used by
// `recflow train --model cnn` and the demo).
//
//   std::vector<FeatureColumn> columns = {
//       NumericColumn("age"),
//       EmbeddingColumn(CategoricalColumnWithVocabularyList(
//                           "country", {"fr", "de", "jp"}), 4),
//       IndicatorColumn(CategoricalColumnWithIdentity("weekday", 7))};
//   DNNClassifier est({.hidden_units = {64, 32}, .columns = columns,
//                      .n_classes = 3},
//                     {.model_dir = "/tmp/m"});
//   est.Train(input_fn, {}, std::nullopt, 10000);
//
// Heads: n_classes > 2 uses softmax cross-entropy and reports accuracy;
// n_classes == 2 one logit with sigmoid cross-entropy and reports
// accuracy, precision, recall and auc; regressors mean squared error.
// Predictions: "classes" (int64), "probabilities" (float32), "logits"
// (in training a multi-class head computes classes and probabilities
// only when a hook fetches them: ModelContext::Fetched);
// regressors "predictions".
#ifndef RECFLOW_TRAIN_CANNED_H_
#define RECFLOW_TRAIN_CANNED_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "train/estimator.h"

namespace recflow::train {

struct FeatureColumn {
  enum class Kind : uint8_t {
    kNumeric,     // numbers of `shape` per example
    kRawBytes,    // a bytes value decoded as uint8 of `shape`
    kIdentity,    // integer ids in [0, num_buckets)
    kVocabulary,  // strings looked up in `vocabulary`
  };
  Kind kind = Kind::kNumeric;
  std::string key;
  Shape shape{1};
  // Numeric and raw bytes: (x - shift) * scale.
  float shift = 0.0f, scale = 1.0f;
  // Categorical: buckets; a vocabulary's out-of-vocabulary values (and
  // ids outside the buckets, when not `strict`) contribute zeros, as
  // TensorFlow's default_value=-1.
  int64_t num_buckets = 0;
  std::vector<std::string> vocabulary;
  // Categorical as an input: 0 one-hot (indicator), > 0 an embedding of
  // that dimension.
  int64_t embedding_dim = 0;

  bool categorical() const {
    return kind == Kind::kIdentity || kind == Kind::kVocabulary;
  }
  // Width of this column in the input layer.
  int64_t width() const;
};

FeatureColumn NumericColumn(std::string key, Shape shape = Shape{1},
                            float shift = 0.0f, float scale = 1.0f);
// A bytes feature of raw uint8 values (an image) seen as numbers.
FeatureColumn RawBytesColumn(std::string key, Shape shape, float scale);
FeatureColumn CategoricalColumnWithIdentity(std::string key,
                                            int64_t num_buckets);
FeatureColumn CategoricalColumnWithVocabularyList(
    std::string key, std::vector<std::string> vocabulary);
FeatureColumn IndicatorColumn(FeatureColumn categorical);
FeatureColumn EmbeddingColumn(FeatureColumn categorical, int64_t dimension);

// The dense [batch, sum of widths] input the columns describe (tf's
// input_layer); creates embedding variables "input_layer/<key>_embedding".
Var InputLayer(ModelContext& ctx, const Features& features,
               std::span<const FeatureColumn> columns);

struct LinearOptions {
  std::vector<FeatureColumn> columns = {};
  int n_classes = 2;  // classifiers
  std::string optimizer = "adam";
  LearningRate learning_rate = ConstantLearningRate(0.01f);
};

struct DNNOptions {
  std::vector<int64_t> hidden_units = {};
  std::vector<FeatureColumn> columns = {};
  int n_classes = 2;  // classifiers
  Activation activation = Activation::kRelu;
  float dropout = 0.0f;
  bool batch_norm = false;
  std::string optimizer = "adam";
  LearningRate learning_rate = ConstantLearningRate(0.001f);
};

// conv(filters[0]) -> pool -> conv(filters[1]) -> pool ... -> dense ->
// logits, on one image column of shape [height, width, channels].
struct CNNOptions {
  FeatureColumn image;
  std::vector<int64_t> filters = {32, 64};
  int kernel = 3;
  std::vector<int64_t> dense_units = {128};
  float dropout = 0.25f;
  int n_classes = 10;
  std::string optimizer = "adam";
  LearningRate learning_rate = ConstantLearningRate(0.001f);
};

ModelFn LinearClassifierFn(LinearOptions o);
ModelFn LinearRegressorFn(LinearOptions o);
ModelFn DNNClassifierFn(DNNOptions o);
ModelFn DNNRegressorFn(DNNOptions o);
ModelFn CNNClassifierFn(CNNOptions o);

class LinearClassifier : public Estimator {
 public:
  LinearClassifier(LinearOptions o, RunConfig c, EstimatorOptions e = {})
      : Estimator(LinearClassifierFn(std::move(o)), std::move(c),
                  std::move(e)) {}
};
class LinearRegressor : public Estimator {
 public:
  LinearRegressor(LinearOptions o, RunConfig c, EstimatorOptions e = {})
      : Estimator(LinearRegressorFn(std::move(o)), std::move(c), std::move(e)) {
  }
};
class DNNClassifier : public Estimator {
 public:
  DNNClassifier(DNNOptions o, RunConfig c, EstimatorOptions e = {})
      : Estimator(DNNClassifierFn(std::move(o)), std::move(c), std::move(e)) {}
};
class DNNRegressor : public Estimator {
 public:
  DNNRegressor(DNNOptions o, RunConfig c, EstimatorOptions e = {})
      : Estimator(DNNRegressorFn(std::move(o)), std::move(c), std::move(e)) {}
};

}  // namespace recflow::train

#endif  // RECFLOW_TRAIN_CANNED_H_
