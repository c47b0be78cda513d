#include "train/metrics.h"

#include <fmt/format.h>

namespace recflow::train {
namespace {

void CheckSizes(size_t labels, size_t predictions, const char* metric) {
  if (labels != predictions) {
    throw Error(fmt::format("{}: {} labels but {} predictions", metric, labels,
                            predictions));
  }
}

}  // namespace

void Accuracy::Update(std::span<const int64_t> labels,
                      std::span<const int64_t> predictions) {
  CheckSizes(labels.size(), predictions.size(), "accuracy");
  for (size_t i = 0; i < labels.size(); ++i) {
    correct_ += labels[i] == predictions[i];
  }
  total_ += labels.size();
}

void Precision::Update(std::span<const float> labels,
                       std::span<const float> probabilities) {
  CheckSizes(labels.size(), probabilities.size(), "precision");
  for (size_t i = 0; i < labels.size(); ++i) {
    if (probabilities[i] > threshold_) {
      (labels[i] != 0 ? tp_ : fp_) += 1;
    }
  }
}

void Recall::Update(std::span<const float> labels,
                    std::span<const float> probabilities) {
  CheckSizes(labels.size(), probabilities.size(), "recall");
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] != 0) (probabilities[i] > threshold_ ? tp_ : fn_) += 1;
  }
}

AUC::AUC(int thresholds) {
  if (thresholds < 2) throw Error("auc: needs at least 2 thresholds");
  constexpr double kEpsilon = 1e-7;
  thresholds_.push_back(-kEpsilon);
  for (int i = 1; i < thresholds - 1; ++i) {
    thresholds_.push_back(double(i) / double(thresholds - 1));
  }
  thresholds_.push_back(1.0 + kEpsilon);
  Reset();
}

void AUC::Reset() {
  tp_.assign(thresholds_.size(), 0);
  fp_.assign(thresholds_.size(), 0);
  tn_.assign(thresholds_.size(), 0);
  fn_.assign(thresholds_.size(), 0);
}

void AUC::Update(std::span<const float> labels,
                 std::span<const float> probabilities) {
  CheckSizes(labels.size(), probabilities.size(), "auc");
  for (size_t i = 0; i < labels.size(); ++i) {
    const bool positive = labels[i] != 0;
    for (size_t t = 0; t < thresholds_.size(); ++t) {
      const bool predicted = probabilities[i] > thresholds_[t];
      if (positive) {
        (predicted ? tp_[t] : fn_[t]) += 1;
      } else {
        (predicted ? fp_[t] : tn_[t]) += 1;
      }
    }
  }
}

double AUC::Result() const {
  // ROC points from the highest threshold to the lowest; trapezoids.
  double area = 0;
  for (size_t t = 0; t + 1 < thresholds_.size(); ++t) {
    auto tpr = [&](size_t k) {
      const double p = double(tp_[k] + fn_[k]);
      return p == 0 ? 0 : double(tp_[k]) / p;
    };
    auto fpr = [&](size_t k) {
      const double n = double(fp_[k] + tn_[k]);
      return n == 0 ? 0 : double(fp_[k]) / n;
    };
    area += (fpr(t) - fpr(t + 1)) * (tpr(t) + tpr(t + 1)) / 2;
  }
  return area;
}

void MetricSet::Reset() {
  for (auto& [name, m] : metrics_) m->Reset();
}

std::map<std::string, double> MetricSet::Results() const {
  std::map<std::string, double> out;
  for (const auto& [name, m] : metrics_) out[name] = m->Result();
  return out;
}

}  // namespace recflow::train
