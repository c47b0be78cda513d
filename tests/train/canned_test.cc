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

// 8x8 images of a bar: class 0 horizontal, 1 vertical, 2 diagonal, at a
// random place, over noise.  A CNN must tell them apart; the default suite
// had no CPU test of the demo's CNN model function.
Element Bars(int64_t n, uint64_t seed, int classes) {
  pipeline::Rng rng(seed);
  std::vector<float> pixels;
  std::vector<int64_t> label;
  for (int64_t i = 0; i < n; ++i) {
    const auto c = static_cast<int>(rng.Below(static_cast<uint64_t>(classes)));
    const auto at = static_cast<int>(rng.Below(6)) + 1;
    float image[8][8];
    for (auto& row : image) {
      for (float& p : row) p = static_cast<float>(rng.Below(300)) / 1000;
    }
    for (int k = 0; k < 8; ++k) {
      if (c == 0) image[at][k] = 1;
      if (c == 1) image[k][at] = 1;
      if (c == 2) image[k][k] = 1;
    }
    pixels.insert(pixels.end(), &image[0][0], &image[0][0] + 64);
    label.push_back(c);
  }
  Element e;
  e.Set("image", Tensor::FromValues<float>(pixels, Shape{n, 8, 8, 1}));
  e.Set("label", Tensor::FromValues<int64_t>(label, Shape{n}));
  return e;
}

TEST(CannedTest, CnnClassifierTellsImagesApart) {
  for (int classes : {3, 2}) {  // 2: one logit and a sigmoid head
    SCOPED_TRACE(classes);
    const Element train = Bars(600, 5, classes), eval = Bars(300, 6, classes);
    testing::TempDir dir;
    Estimator cnn(
        CNNClassifierFn({.image = NumericColumn("image", Shape{8, 8, 1}),
                         .filters = {4},
                         .dense_units = {16},
                         .dropout = 0.1f,
                         .n_classes = classes,
                         .learning_rate = ConstantLearningRate(0.01f)}),
        CannedConfig(dir.path().string()), Quiet());
    cnn.Train(
        [&] {
          return Dataset::FromTensorSlices(train)
              .Shuffle(600, 1)
              .Repeat()
              .Batch(32);
        },
        {}, 150);
    const auto m = cnn.Evaluate(
        [&] { return Dataset::FromTensorSlices(eval).Batch(100); });
    EXPECT_GT(m.at("accuracy"), 0.95);
    const TensorMap ckpt = ReadCheckpoint(*cnn.latest_checkpoint());
    EXPECT_EQ(ckpt.at("cnn/logits/kernel").shape(),
              (Shape{16, classes == 2 ? 1 : classes}));
  }
  EXPECT_THROW(CNNClassifierFn({.image = NumericColumn("image", Shape{64})}),
               Error);
}

// A column that is shifted and scaled, x = 10 + u read as (x - 10) * 2,
// under a linear model (whose bias shows the shift: 0, not -40) and a DNN
// with batch normalisation (evaluated with its moving statistics).
TEST(CannedTest, ShiftedColumnsAndBatchNormFit) {
  const int64_t n = 800;
  std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
  pipeline::Rng rng(7);
  for (int64_t i = 0; i < n; ++i) {
    const float u = static_cast<float>(rng.Below(2000)) / 2000 - 0.5f;
    x[i] = 10 + u;
    y[i] = 4 * u + 0.5f;
  }
  Element e;
  e.Set("x", Tensor::FromValues<float>(x, Shape{n}));
  e.Set("label", Tensor::FromValues<float>(y, Shape{n}));
  auto input = [&] {
    return Dataset::FromTensorSlices(e).Shuffle(200, 3).Repeat().Batch(32);
  };
  auto eval = [&] { return Dataset::FromTensorSlices(e).Batch(200); };
  const FeatureColumn column = NumericColumn("x", Shape{1}, 10.0f, 2.0f);
  testing::TempDir a, b;
  LinearRegressor linear(
      {.columns = {column}, .learning_rate = ConstantLearningRate(0.05f)},
      CannedConfig(a.path().string()), Quiet());
  linear.Train(input, {}, 800);
  EXPECT_LT(linear.Evaluate(eval).at("loss"), 1e-3);
  const TensorMap weights = ReadCheckpoint(*linear.latest_checkpoint());
  const Tensor& bias = weights.at("linear/linear_model/bias");
  ASSERT_EQ(bias.num_elements(), 1);
  EXPECT_NEAR(bias.values<float>()[0], 0.5, 0.05);
  DNNRegressor dnn({.hidden_units = {16},
                    .columns = {column},
                    .batch_norm = true,
                    .learning_rate = ConstantLearningRate(0.01f)},
                   CannedConfig(b.path().string()), Quiet());
  dnn.Train(input, {}, 800);
  EXPECT_LT(dnn.Evaluate(eval).at("loss"), 0.05);
  const TensorMap ckpt = ReadCheckpoint(*dnn.latest_checkpoint());
  EXPECT_EQ(ckpt.count("dnn/hiddenlayer_0/batchnorm/moving_mean"), 1u);
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
// target of 2, silently), a multi-class head's in [0, n_classes).  The
// error names the batch (by the global step it would train, in
// evaluation by its number) and the row in it.
TEST(CannedTest, LabelsOutsideTheClassesAreRefused) {
  const auto make = [](std::vector<int64_t> labels) {
    const auto n = static_cast<int64_t>(labels.size());
    Element e;
    e.Set("x", Tensor::FromValues<float>(
                   std::vector<float>(static_cast<size_t>(n), 0.5f), Shape{n}));
    e.Set("label", Tensor::FromValues<int64_t>(labels, Shape{n}));
    return e;
  };
  const auto error = [&](int n_classes, std::vector<int64_t> labels) {
    const Element e = make(labels);
    testing::TempDir dir;
    LinearClassifier est(
        {.columns = {NumericColumn("x")}, .n_classes = n_classes},
        CannedConfig(dir.path().string()), Quiet());
    try {
      est.Train([&] { return Dataset::FromTensorSlices(e).Batch(4); }, {},
                static_cast<int64_t>(labels.size() / 4));
    } catch (const Error& err) {
      return std::string(err.what());
    }
    return std::string();
  };
  EXPECT_EQ(error(2, {0, 1, 1, 0}), "");
  EXPECT_EQ(error(2, {0, 1, 2, 0}),
            "the batch of global step 1: label 2 of row 2 is outside [0, 1] "
            "(the classifier has 2 classes)");
  EXPECT_EQ(error(2, {0, 0, 0, 0, -1, 0, 1, 0}),
            "the batch of global step 2: label -1 of row 0 is outside [0, 1] "
            "(the classifier has 2 classes)");
  EXPECT_EQ(error(3, {0, 1, 2, 0}), "");
  EXPECT_EQ(error(3, {0, 1, 2, 0, 1, 1, 1, 1, 0, 3, 2, 0}),
            "the batch of global step 3: label 3 of row 1 is outside [0, 3) "
            "(the logits' classes)");
  // Evaluation, after a step of training.
  testing::TempDir dir;
  LinearClassifier est({.columns = {NumericColumn("x")}, .n_classes = 3},
                       CannedConfig(dir.path().string()), Quiet());
  const Element good = make({0, 1, 2, 0});
  est.Train([&] { return Dataset::FromTensorSlices(good).Batch(4); }, {}, 1);
  const Element bad = make({0, 1, 2, 0, 1, 1, 5, 1});
  try {
    est.Evaluate([&] { return Dataset::FromTensorSlices(bad).Batch(4); });
    ADD_FAILURE() << "evaluated labels outside the classes";
  } catch (const Error& err) {
    EXPECT_STREQ(err.what(),
                 "evaluation batch 2: label 5 of row 2 is outside [0, 3) "
                 "(the logits' classes)");
  }
}

}  // namespace
}  // namespace recflow::train
