#include "train/metrics.h"

#include <fmt/format.h>

#include <cmath>
#include <string>

#include "pipeline/dataset_base.h"

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

namespace {

void CheckSums(std::span<const double> s, size_t n, const char* metric) {
  if (s.size() != n) {
    throw Error(
        fmt::format("{}: {} sums where {} were expected", metric, s.size(), n));
  }
}

uint64_t Count(double v) { return static_cast<uint64_t>(std::llround(v)); }

}  // namespace

void Mean::SetSums(std::span<const double> s) {
  CheckSums(s, 2, "mean");
  sum_ = s[0];
  weight_ = s[1];
}

void Accuracy::SetSums(std::span<const double> s) {
  CheckSums(s, 2, "accuracy");
  correct_ = Count(s[0]);
  total_ = Count(s[1]);
}

void Precision::SetSums(std::span<const double> s) {
  CheckSums(s, 2, "precision");
  tp_ = Count(s[0]);
  fp_ = Count(s[1]);
}

void Recall::SetSums(std::span<const double> s) {
  CheckSums(s, 2, "recall");
  tp_ = Count(s[0]);
  fn_ = Count(s[1]);
}

std::vector<double> AUC::Sums() const {
  std::vector<double> out;
  out.reserve(4 * tp_.size());
  for (const auto* counts : {&tp_, &fp_, &tn_, &fn_}) {
    for (uint64_t c : *counts) out.push_back(double(c));
  }
  return out;
}

void AUC::SetSums(std::span<const double> s) {
  CheckSums(s, 4 * tp_.size(), "auc");
  size_t at = 0;
  for (auto* counts : {&tp_, &fp_, &tn_, &fn_}) {
    for (uint64_t& c : *counts) c = Count(s[at++]);
  }
}

void MetricSet::AllReduce(Collective& world) {
  if (world.size() == 1) return;
  // The same metrics on every rank: their count and a fingerprint of their
  // names and sizes agree (max == -max of the negations over the ranks).
  std::vector<double> sums;
  std::vector<size_t> sizes;
  uint64_t fingerprint = 0;
  for (const auto& [name, metric] : metrics_) {
    const std::vector<double> s = metric->Sums();
    fingerprint = pipeline::MixSeed(
        fingerprint,
        pipeline::Fingerprint(fmt::format("{}#{}", name, s.size())));
    sizes.push_back(s.size());
    sums.insert(sums.end(), s.begin(), s.end());
  }
  const auto n = static_cast<int64_t>(metrics_.size());
  const auto f = static_cast<int64_t>(fingerprint >> 1);
  int64_t bounds[4] = {n, f, -n, -f};
  world.AllReduce(std::span(bounds), ReduceOp::kMax);
  if (bounds[0] != -bounds[2] || bounds[1] != -bounds[3]) {
    throw Error(fmt::format(
        "evaluation over {} ranks: the ranks hold different metrics (this "
        "rank, {}, has {}); does some rank's share of the input have no "
        "batch?",
        world.size(), world.rank(), metrics_.size()));
  }
  world.AllReduce(std::span(sums), ReduceOp::kSum);
  size_t at = 0, i = 0;
  for (auto& [name, metric] : metrics_) {
    metric->SetSums(std::span(sums).subspan(at, sizes[i]));
    at += sizes[i++];
  }
}

}  // namespace recflow::train
