// In-memory sources: tensors, tensor slices, ranges, counters, random
// numbers and generators.  (TFRecord files: tfrecord_dataset.cc; CSV:
// csv_dataset.cc.)
#include <fmt/format.h>

#include "pipeline/stages.h"

namespace recflow::pipeline::stages {
namespace {

// FromTensorSlices (the rows of arrays) and FromTensors (the arrays as
// one element, whole = true).
class TensorSlicesDataset final : public DatasetBase {
 public:
  TensorSlicesDataset(Element arrays, bool whole)
      : arrays_(std::move(arrays)), whole_(whole) {
    const char* what = whole_ ? "FromTensors" : "FromTensorSlices";
    if (arrays_.components.empty()) {
      throw Error(fmt::format("{}: no arrays given", what));
    }
    if (whole_) {
      rows_ = 1;
      return;
    }
    rows_ = -1;
    for (const auto& c : arrays_.components) {
      if (c.tensor.shape().rank() == 0 && !c.tensor.ragged()) {
        throw Error(fmt::format(
            "FromTensorSlices: '{}' is a scalar; arrays need a first "
            "dimension to slice",
            c.name));
      }
      const int64_t n = c.tensor.num_rows();
      if (rows_ >= 0 && n != rows_) {
        throw Error(fmt::format(
            "FromTensorSlices: '{}' has {} rows, '{}' has {}; all arrays "
            "need the same first dimension",
            c.name, n, arrays_.components[0].name, rows_));
      }
      rows_ = n;
    }
  }

  std::unique_ptr<IteratorBase> MakeIteratorInternal(IteratorContext*,
                                                     uint64_t) const override {
    return std::make_unique<It>(this);
  }
  std::string Describe() const override {
    std::vector<std::string> parts;
    for (const auto& c : arrays_.components) {
      parts.push_back(fmt::format("{}:{}{}", c.name,
                                  DTypeName(c.tensor.dtype()),
                                  c.tensor.shape().ToString()));
    }
    return fmt::format("{}({})", whole_ ? "Tensors" : "TensorSlices",
                       fmt::join(parts, ", "));
  }
  std::string StageName() const override {
    return whole_ ? "tensors" : "tensor_slices";
  }
  int64_t Cardinality() const override { return rows_; }

 private:
  class It final : public IteratorBase {
   public:
    explicit It(const TensorSlicesDataset* d) : d_(d) {}
    bool GetNext(Element* out) override {
      if (next_ >= d_->rows_) return false;
      out->components.clear();
      out->batch_origins.reset();
      out->origin = {};
      for (const auto& c : d_->arrays_.components) {
        out->components.push_back(
            {c.name, d_->whole_ ? c.tensor : c.tensor.Slice(next_)});
      }
      ++next_;
      return true;
    }
    void Save(StateWriter* w) override {
      w->BeginStage(d_->StageName());
      w->I64(next_);
    }
    void Restore(StateReader* r) override {
      r->BeginStage(d_->StageName());
      next_ = r->I64();
      if (next_ < 0 || next_ > d_->rows_) {
        r->Fail(fmt::format("row {} of {}", next_, d_->rows_));
      }
    }

   private:
    const TensorSlicesDataset* d_;
    int64_t next_ = 0;
  };

  Element arrays_;
  bool whole_;
  int64_t rows_ = 0;
};

// Range, and Counter (no stop: counter = true).
class RangeDataset final : public DatasetBase {
 public:
  RangeDataset(int64_t start, int64_t stop, int64_t step, bool counter)
      : start_(start), stop_(stop), step_(step), counter_(counter) {}

  std::unique_ptr<IteratorBase> MakeIteratorInternal(IteratorContext*,
                                                     uint64_t) const override {
    return std::make_unique<It>(this);
  }
  std::string Describe() const override {
    if (counter_) return fmt::format("Counter({}, {})", start_, step_);
    return fmt::format("Range({}, {}, {})", start_, stop_, step_);
  }
  std::string StageName() const override {
    return counter_ ? "counter" : "range";
  }
  int64_t Cardinality() const override {
    if (counter_) return kInfiniteCardinality;
    const __int128 span = static_cast<__int128>(stop_) - start_;
    if (step_ > 0 ? span <= 0 : span >= 0) return 0;
    return static_cast<int64_t>((span + step_ - (step_ > 0 ? 1 : -1)) / step_);
  }

 private:
  class It final : public IteratorBase {
   public:
    explicit It(const RangeDataset* d) : d_(d), next_(d->start_) {}
    bool GetNext(Element* out) override {
      if (!d_->counter_ &&
          (d_->step_ > 0 ? next_ >= d_->stop_ : next_ <= d_->stop_)) {
        return false;
      }
      out->components.clear();
      out->batch_origins.reset();
      out->origin = {};
      out->components.push_back({"value", Tensor::Scalar<int64_t>(next_)});
      // A counter wraps as int64 arithmetic does, after 2^63 elements.
      next_ = static_cast<int64_t>(static_cast<uint64_t>(next_) +
                                   static_cast<uint64_t>(d_->step_));
      return true;
    }
    void Save(StateWriter* w) override {
      w->BeginStage(d_->StageName());
      w->I64(next_);
    }
    void Restore(StateReader* r) override {
      r->BeginStage(d_->StageName());
      next_ = r->I64();
      if (!Reachable()) {
        r->Fail(
            fmt::format("{} is not a position of {}", next_, d_->Describe()));
      }
    }

   private:
    // On the progression: for a range at most one step past its end
    // (where the iterator stops), [start, stop + step) for step > 0; for a
    // counter anywhere on it (a step of 0: at start).
    bool Reachable() const {
      const __int128 offset = static_cast<__int128>(next_) - d_->start_;
      if (d_->step_ == 0) return offset == 0;
      if (offset % d_->step_ != 0) return false;
      if (d_->counter_) return d_->step_ > 0 ? offset >= 0 : offset <= 0;
      const __int128 past = static_cast<__int128>(d_->stop_) + d_->step_;
      return d_->step_ > 0 ? next_ >= d_->start_ && next_ < past
                           : next_ <= d_->start_ && next_ > past;
    }

    const RangeDataset* d_;
    int64_t next_;
  };

  int64_t start_, stop_, step_;
  bool counter_;
};

// tf.data's random: int64 scalars, uniform over every int64 value.
class RandomDataset final : public DatasetBase {
 public:
  RandomDataset(std::optional<uint64_t> seed, bool rerandomize)
      : seed_(seed), rerandomize_(rerandomize) {}

  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    return std::make_unique<It>(
        StageSeed(*this, seed_, *ctx, salt, rerandomize_));
  }
  std::string Describe() const override {
    return fmt::format("Random(seed={}, rerandomize_each_iteration={})",
                       seed_ ? fmt::format("{}", *seed_) : "none",
                       rerandomize_);
  }
  std::string StageName() const override { return "random"; }
  int64_t Cardinality() const override { return kInfiniteCardinality; }

 private:
  class It final : public IteratorBase {
   public:
    explicit It(uint64_t seed) : rng_(seed) {}
    bool GetNext(Element* out) override {
      out->components.clear();
      out->batch_origins.reset();
      out->origin = {};
      out->components.push_back(
          {"value",
           Tensor::Scalar<int64_t>(static_cast<int64_t>(rng_.Next()))});
      return true;
    }
    void Save(StateWriter* w) override {
      w->BeginStage("random");
      w->U64(rng_.state());
    }
    void Restore(StateReader* r) override {
      r->BeginStage("random");
      rng_.set_state(r->U64());
    }

   private:
    Rng rng_;
  };

  std::optional<uint64_t> seed_;
  bool rerandomize_;
};

class GeneratorDataset final : public DatasetBase {
 public:
  GeneratorDataset(GeneratorFn fn, std::string name)
      : fn_(std::move(fn)), name_(std::move(name)) {}

  std::unique_ptr<IteratorBase> MakeIteratorInternal(IteratorContext*,
                                                     uint64_t) const override {
    return std::make_unique<It>(this);
  }
  std::string Describe() const override {
    return fmt::format("Generator({})", name_);
  }
  std::string StageName() const override { return "generator:" + name_; }

 private:
  // The state is the number of elements produced; a restore makes the
  // generator afresh and skips that many (generators must be
  // deterministic).
  class It final : public IteratorBase {
   public:
    explicit It(const GeneratorDataset* d) : d_(d) {}
    bool GetNext(Element* out) override {
      if (done_) return false;
      if (!next_) next_ = d_->fn_();
      std::optional<Element> e = next_();
      if (!e) {
        done_ = true;
        return false;
      }
      *out = std::move(*e);
      ++produced_;
      return true;
    }
    void Save(StateWriter* w) override {
      w->BeginStage("generator");
      w->U64(produced_);
      w->Bool(done_);
    }
    void Restore(StateReader* r) override {
      r->BeginStage("generator");
      const uint64_t target = r->U64();
      const bool done = r->Bool();
      next_ = d_->fn_();
      produced_ = 0;
      done_ = false;
      while (produced_ < target) {
        if (!next_()) {
          throw Error(fmt::format(
              "generator '{}' ended after {} elements while restoring a "
              "state at element {}; is it deterministic?",
              d_->name_, produced_, target));
        }
        ++produced_;
      }
      done_ = done;
    }

   private:
    const GeneratorDataset* d_;
    std::function<std::optional<Element>()> next_;
    uint64_t produced_ = 0;
    bool done_ = false;
  };

  GeneratorFn fn_;
  std::string name_;
};

}  // namespace

DatasetPtr TensorSlices(Element arrays) {
  return std::make_shared<TensorSlicesDataset>(std::move(arrays), false);
}
DatasetPtr Tensors(Element arrays) {
  return std::make_shared<TensorSlicesDataset>(std::move(arrays), true);
}
DatasetPtr Range(int64_t start, int64_t stop, int64_t step) {
  return std::make_shared<RangeDataset>(start, stop, step, false);
}
DatasetPtr Counter(int64_t start, int64_t step) {
  return std::make_shared<RangeDataset>(start, 0, step, true);
}
DatasetPtr Random(std::optional<uint64_t> seed, bool rerandomize) {
  return std::make_shared<RandomDataset>(seed, rerandomize);
}
DatasetPtr Generator(GeneratorFn fn, std::string name) {
  return std::make_shared<GeneratorDataset>(std::move(fn), std::move(name));
}

}  // namespace recflow::pipeline::stages
