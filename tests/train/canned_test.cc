// Canned estimators over every kind of feature column, on problems each
// must learn: a binary head over categorical columns (identity, vocabulary
// as one-hot and as embedding), and regressors.
#include "train/canned.h"

#include <gtest/gtest.h>

#include <cmath>

#include "estimator_test_util.h"
#include "test_util.h"

namespace recflow::train {
namespace {

using estimator_testing::Quiet;
using pipeline::Dataset;
using pipeline::Element;

RunConfig CannedConfig(const std::string& dir) {
  RunConfig c;
  c.model_dir = dir;
  c.seed = 3;
  c.save_checkpoints_steps = 1000;
  c.log_step_count_steps = 0;
  c.save_summary_steps = 0;
  c.threads = 2;
  return c;
}

// label = 1 when the colour is "red" or the weekday is 0..2 (an OR of two
// categorical facts), plus a numeric feature that carries no signal.
Element Categorical(int64_t n, uint64_t seed) {
  const std::string colours[] = {"red", "green", "blue", "mauve"};
  pipeline::Rng rng(seed);
  std::vector<std::string> colour;
  std::vector<int64_t> weekday, label;
  std::vector<float> noise;
  for (int64_t i = 0; i < n; ++i) {
    colour.push_back(colours[rng.Below(4)]);  // "mauve": out of vocabulary
    weekday.push_back(static_cast<int64_t>(rng.Below(7)));
    noise.push_back(static_cast<float>(rng.Below(1000)) / 1000);
    label.push_back(colour.back() == "red" || weekday.back() < 3);
  }
  Element e;
  e.Set("colour", Tensor::FromStrings(colour, Shape{n}));
  e.Set("weekday", Tensor::FromValues<int64_t>(weekday, Shape{n}));
  e.Set("noise", Tensor::FromValues<float>(noise, Shape{n}));
  e.Set("label", Tensor::FromValues<int64_t>(label, Shape{n}));
  return e;
}

std::vector<FeatureColumn> CategoricalColumns(bool embed) {
  FeatureColumn colour =
      CategoricalColumnWithVocabularyList("colour", {"red", "green", "blue"});
  FeatureColumn weekday = CategoricalColumnWithIdentity("weekday", 7);
  return {embed ? EmbeddingColumn(colour, 3) : IndicatorColumn(colour),
          embed ? EmbeddingColumn(weekday, 3) : IndicatorColumn(weekday),
          NumericColumn("noise")};
}

TEST(CannedTest, BinaryClassifiersLearnFromCategoricalColumns) {
  const Element train = Categorical(2000, 1), eval = Categorical(500, 2);
  auto train_input = [&] {
    return Dataset::FromTensorSlices(train).Shuffle(500, 1).Repeat().Batch(32);
  };
  auto eval_input = [&] { return Dataset::FromTensorSlices(eval).Batch(100); };
  for (int kind = 0; kind < 3; ++kind) {
    SCOPED_TRACE(kind);
    testing::TempDir dir;
    std::unique_ptr<Estimator> est;
    if (kind == 0) {
      est = std::make_unique<LinearClassifier>(
          LinearOptions{.columns = CategoricalColumns(false),
                        .learning_rate = ConstantLearningRate(0.05f)},
          CannedConfig(dir.path().string()), Quiet());
    } else {
      est = std::make_unique<DNNClassifier>(
          DNNOptions{.hidden_units = {16},
                     .columns = CategoricalColumns(kind == 2),
                     .learning_rate = ConstantLearningRate(0.01f)},
          CannedConfig(dir.path().string()), Quiet());
    }
    est->Train(train_input, {}, 600);
    const auto m = est->Evaluate(eval_input);
    EXPECT_GT(m.at("accuracy"), 0.95);
    EXPECT_GT(m.at("auc"), 0.97);
    EXPECT_GT(m.at("precision"), 0.9);
    EXPECT_GT(m.at("recall"), 0.9);
    if (kind == 2) {
      const TensorMap ckpt = ReadCheckpoint(*est->latest_checkpoint());
      // Three words + one out-of-vocabulary bucket.
      EXPECT_EQ(ckpt.at("input_layer/colour_embedding/embeddings").shape(),
                (Shape{4, 3}));
    }
  }
}

TEST(CannedTest, RegressorsFitALinearFunction) {
  const int64_t n = 1000;
  std::vector<float> x(static_cast<size_t>(2 * n)), y(static_cast<size_t>(n));
  pipeline::Rng rng(4);
  for (int64_t i = 0; i < n; ++i) {
    x[2 * i] = static_cast<float>(rng.Below(2000)) / 1000 - 1;
    x[2 * i + 1] = static_cast<float>(rng.Below(2000)) / 1000 - 1;
    y[i] = 3 * x[2 * i] - 2 * x[2 * i + 1] + 0.5f;
  }
  Element e;
  e.Set("x", Tensor::FromValues<float>(x, Shape{n, 2}));
  e.Set("label", Tensor::FromValues<float>(y, Shape{n}));
  auto input = [&] {
    return Dataset::FromTensorSlices(e).Shuffle(200, 2).Repeat().Batch(32);
  };
  auto eval = [&] { return Dataset::FromTensorSlices(e).Batch(250); };
  testing::TempDir a, b;
  LinearRegressor linear({.columns = {NumericColumn("x", Shape{2})},
                          .learning_rate = ConstantLearningRate(0.05f)},
                         CannedConfig(a.path().string()), Quiet());
  linear.Train(input, {}, 800);
  EXPECT_LT(linear.Evaluate(eval).at("loss"), 1e-3);
  DNNRegressor dnn({.hidden_units = {16},
                    .columns = {NumericColumn("x", Shape{2})},
                    .learning_rate = ConstantLearningRate(0.01f)},
                   CannedConfig(b.path().string()), Quiet());
  dnn.Train(input, {}, 800);
  EXPECT_LT(dnn.Evaluate(eval).at("loss"), 0.05);
  int64_t seen = 0;
  dnn.Predict(eval, [&](const std::map<std::string, Tensor>& p) {
    const auto v = p.at("predictions").values<float>();
    for (size_t i = 0; i < v.size(); ++i) {
      EXPECT_NEAR(v[i], y[static_cast<size_t>(seen) + i], 0.5);
    }
    seen += static_cast<int64_t>(v.size());
    return true;
  });
  EXPECT_EQ(seen, n);
}

TEST(CannedTest, ColumnsRefuseWhatTheyCannotTake) {
  EXPECT_THROW(CategoricalColumnWithIdentity("k", 0), Error);
  EXPECT_THROW(EmbeddingColumn(NumericColumn("k"), 3), Error);
  EXPECT_THROW(DNNClassifierFn({.columns = {NumericColumn("x")}}), Error);
  testing::TempDir dir;
  Element e = Categorical(64, 1);
  e.Set("weekday",
        Tensor::FromValues<int64_t>(std::vector<int64_t>(64, 9), Shape{64}));
  LinearClassifier est({.columns = CategoricalColumns(false)},
                       CannedConfig(dir.path().string()), Quiet());
  try {
    est.Train([&] { return Dataset::FromTensorSlices(e).Batch(32); });
    FAIL();
  } catch (const Error& err) {
    EXPECT_NE(
        std::string(err.what())
            .find(
                "feature weekday: value 9 of example 0 is not an id in [0, 7)"),
        std::string::npos)
        << err.what();
  }
}

// Labels outside a classifier's classes are refused, never trained on: a
// binary head's must be 0 or 1 (a 2 went into the sigmoid's loss as a
// target of 2, silently), a multi-class head's in [0, n_classes).
TEST(CannedTest, LabelsOutsideTheClassesAreRefused) {
  const auto error = [](int n_classes, std::vector<int64_t> labels) {
    const auto n = static_cast<int64_t>(labels.size());
    Element e;
    e.Set("x", Tensor::FromValues<float>(
                   std::vector<float>(static_cast<size_t>(n), 0.5f), Shape{n}));
    e.Set("label", Tensor::FromValues<int64_t>(labels, Shape{n}));
    testing::TempDir dir;
    LinearClassifier est(
        {.columns = {NumericColumn("x")}, .n_classes = n_classes},
        CannedConfig(dir.path().string()), Quiet());
    try {
      est.Train([&] { return Dataset::FromTensorSlices(e).Batch(4); }, {}, 1);
    } catch (const Error& err) {
      return std::string(err.what());
    }
    return std::string();
  };
  EXPECT_EQ(error(2, {0, 1, 1, 0}), "");
  EXPECT_EQ(error(2, {0, 1, 2, 0}),
            "label 2 of row 2 is outside [0, 1] (the classifier has 2 "
            "classes)");
  EXPECT_EQ(error(2, {-1, 0, 1, 0}),
            "label -1 of row 0 is outside [0, 1] (the classifier has 2 "
            "classes)");
  EXPECT_EQ(error(3, {0, 1, 2, 0}), "");
  EXPECT_EQ(error(3, {0, 3, 2, 0}),
            "label 3 of row 1 is outside [0, 3) (the logits' classes)");
}

}  // namespace
}  // namespace recflow::train
