// Metrics against tf.keras.metrics' definitions.
#include "train/metrics.h"

#include <gtest/gtest.h>

#include "train/error.h"

namespace recflow::train {
namespace {

TEST(MetricsTest, AccuracyPrecisionRecallAuc) {
  MetricSet m;
  const int64_t labels[] = {1, 2, 3, 4};
  const int64_t preds[] = {1, 0, 3, 0};
  m.Get<Accuracy>("accuracy").Update(labels, preds);
  EXPECT_DOUBLE_EQ(m.Results().at("accuracy"), 0.5);
  EXPECT_THROW(m.Get<Mean>("accuracy"), Error);

  const float y[] = {1, 1, 0, 0, 1};
  const float p[] = {0.9f, 0.4f, 0.6f, 0.1f, 0.7f};
  Precision precision;
  Recall recall;
  precision.Update(y, p);
  recall.Update(y, p);
  EXPECT_DOUBLE_EQ(precision.Result(), 2.0 / 3);
  EXPECT_DOUBLE_EQ(recall.Result(), 2.0 / 3);
  AUC auc;
  auc.Update(y, p);
  // 6 positive/negative pairs, 5 ordered correctly.
  EXPECT_NEAR(auc.Result(), 5.0 / 6, 0.01);
  AUC perfect;
  const float sure[] = {0.99f, 0.8f, 0.2f, 0.01f, 0.7f};
  perfect.Update(y, sure);
  EXPECT_NEAR(perfect.Result(), 1.0, 1e-9);
}

}  // namespace
}  // namespace recflow::train
