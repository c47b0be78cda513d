// Streaming evaluation metrics, as tf.compat.v1.metrics: each accumulates
// over the batches of an evaluation and gives its result at the end.
//
// A model_fn updates them by name through its ModelContext:
//   ctx.metrics().Get<Accuracy>("accuracy").Update(labels, classes);
// The Estimator resets them before an evaluation and reports every one.
//
// Thread safety: none; a MetricSet belongs to one evaluation loop.
#ifndef RECFLOW_TRAIN_METRICS_H_
#define RECFLOW_TRAIN_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "train/collective.h"
#include "train/error.h"

namespace recflow::train {

class Metric {
 public:
  virtual ~Metric() = default;
  virtual void Reset() = 0;
  virtual double Result() const = 0;
  // What the metric has accumulated, as sums that add up over shards of
  // the data (counts are exact as doubles up to 2^53), and setting them
  // back: how a data-parallel evaluation combines its ranks.
  virtual std::vector<double> Sums() const = 0;
  virtual void SetSums(std::span<const double> sums) = 0;
};

// Weighted mean of values (the "loss" metric of an evaluation).
class Mean final : public Metric {
 public:
  void Update(double value, double weight = 1.0) {
    sum_ += value * weight;
    weight_ += weight;
  }
  void Reset() override { sum_ = weight_ = 0; }
  double Result() const override { return weight_ == 0 ? 0 : sum_ / weight_; }
  std::vector<double> Sums() const override { return {sum_, weight_}; }
  void SetSums(std::span<const double> s) override;

 private:
  double sum_ = 0, weight_ = 0;
};

// Fraction of predictions equal to their labels.
class Accuracy final : public Metric {
 public:
  void Update(std::span<const int64_t> labels,
              std::span<const int64_t> predictions);
  void Reset() override { correct_ = total_ = 0; }
  double Result() const override {
    return total_ == 0 ? 0 : double(correct_) / double(total_);
  }
  std::vector<double> Sums() const override {
    return {double(correct_), double(total_)};
  }
  void SetSums(std::span<const double> s) override;

 private:
  uint64_t correct_ = 0, total_ = 0;
};

// Binary: labels 0/1 (nonzero is positive), probabilities of the positive
// class; a prediction is positive when its probability > threshold.
class Precision final : public Metric {
 public:
  explicit Precision(double threshold = 0.5) : threshold_(threshold) {}
  void Update(std::span<const float> labels,
              std::span<const float> probabilities);
  void Reset() override { tp_ = fp_ = 0; }
  double Result() const override {
    return tp_ + fp_ == 0 ? 0 : double(tp_) / double(tp_ + fp_);
  }
  std::vector<double> Sums() const override {
    return {double(tp_), double(fp_)};
  }
  void SetSums(std::span<const double> s) override;

 private:
  double threshold_;
  uint64_t tp_ = 0, fp_ = 0;
};

class Recall final : public Metric {
 public:
  explicit Recall(double threshold = 0.5) : threshold_(threshold) {}
  void Update(std::span<const float> labels,
              std::span<const float> probabilities);
  void Reset() override { tp_ = fn_ = 0; }
  double Result() const override {
    return tp_ + fn_ == 0 ? 0 : double(tp_) / double(tp_ + fn_);
  }
  std::vector<double> Sums() const override {
    return {double(tp_), double(fn_)};
  }
  void SetSums(std::span<const double> s) override;

 private:
  double threshold_;
  uint64_t tp_ = 0, fn_ = 0;
};

// Area under the ROC curve, TensorFlow's way: confusion counts at
// `thresholds` evenly spaced thresholds in [0, 1] (plus -eps and 1+eps at
// the ends) and a trapezoidal (Riemann) sum.
class AUC final : public Metric {
 public:
  explicit AUC(int thresholds = 200);
  void Update(std::span<const float> labels,
              std::span<const float> probabilities);
  void Reset() override;
  double Result() const override;
  std::vector<double> Sums() const override;
  void SetSums(std::span<const double> s) override;

 private:
  std::vector<double> thresholds_;
  std::vector<uint64_t> tp_, fp_, tn_, fn_;
};

class MetricSet {
 public:
  // The metric `name`, created with `args` the first time.  Throws Error
  // when `name` exists as another kind of metric.
  template <typename M, typename... Args>
  M& Get(const std::string& name, Args&&... args) {
    auto it = metrics_.find(name);
    if (it == metrics_.end()) {
      it = metrics_
               .emplace(name, std::make_unique<M>(std::forward<Args>(args)...))
               .first;
    }
    M* m = dynamic_cast<M*>(it->second.get());
    if (m == nullptr) {
      throw Error("metric " + name + " exists as another kind of metric");
    }
    return *m;
  }
  void Reset();
  std::map<std::string, double> Results() const;
  // Every metric's sums added up over the ranks of `world` (a collective:
  // every rank calls it).  Throws Error on every rank when the ranks do not
  // hold the same metrics (a rank whose share had no batch).
  void AllReduce(Collective& world);
  bool empty() const { return metrics_.empty(); }

 private:
  std::map<std::string, std::unique_ptr<Metric>> metrics_;
};

}  // namespace recflow::train

#endif  // RECFLOW_TRAIN_METRICS_H_
