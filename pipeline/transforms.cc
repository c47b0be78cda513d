// Element-wise and counting transformations: Filter, Repeat, Take, Skip,
// Shard, IgnoreErrors.
#include <fmt/format.h>

#include "pipeline/stages.h"

namespace recflow::pipeline::stages {
namespace {

class FilterDataset final : public UnaryDataset {
 public:
  FilterDataset(DatasetPtr input, PredicateFn fn, std::string name)
      : UnaryDataset(std::move(input)),
        fn_(std::move(fn)),
        name_(std::move(name)) {}
  std::string Label() const override {
    return fmt::format("Filter({})", name_);
  }
  std::string StageName() const override { return "filter:" + name_; }
  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    return std::make_unique<It>(this, input_->MakeIterator(ctx, salt));
  }

 private:
  class It final : public IteratorBase {
   public:
    It(const FilterDataset* d, std::unique_ptr<IteratorBase> in)
        : d_(d), in_(std::move(in)) {}
    bool GetNext(Element* out) override {
      while (in_->GetNext(out)) {
        if (d_->fn_(*out)) return true;
      }
      return false;
    }
    void Save(StateWriter* w) override {
      w->BeginStage("filter");
      in_->Save(w);
    }
    void Restore(StateReader* r) override {
      r->BeginStage("filter");
      in_->Restore(r);
    }

   private:
    const FilterDataset* d_;
    std::unique_ptr<IteratorBase> in_;
  };

  PredicateFn fn_;
  std::string name_;
};

class RepeatDataset final : public UnaryDataset {
 public:
  RepeatDataset(DatasetPtr input, int64_t count)
      : UnaryDataset(std::move(input)), count_(count) {}
  std::string Label() const override {
    return fmt::format("Repeat({})", count_);
  }
  std::string StageName() const override { return "repeat"; }
  // tf.data's rule: forever is infinite unless the input is known empty.
  int64_t Cardinality() const override {
    const int64_t n = input_->Cardinality();
    if (count_ < 0) return n == 0 ? 0 : kInfiniteCardinality;
    if (count_ == 0) return 0;
    if (n < 0) return n;
    const __int128 total = static_cast<__int128>(n) * count_;
    return total > INT64_MAX ? kUnknownCardinality
                             : static_cast<int64_t>(total);
  }
  bool DescribeForFusion(FusableStage* out) const override {
    out->kind = FusableStage::Kind::kRepeat;
    out->input = input_;
    out->count = count_;
    return true;
  }
  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    return std::make_unique<It>(this, ctx, salt);
  }

 private:
  class It final : public IteratorBase {
   public:
    It(const RepeatDataset* d, IteratorContext* ctx, uint64_t salt)
        : epochs_(d->count_, salt, [d, ctx](uint64_t epoch_salt) {
            return d->input_->MakeIterator(ctx, epoch_salt);
          }) {}
    bool GetNext(Element* out) override {
      while (IteratorBase* in = epochs_.Begin()) {
        if (in->GetNext(out)) {
          epochs_.Handed(1);
          return true;
        }
        if (!epochs_.EndEpoch()) return false;
      }
      return false;
    }
    void Save(StateWriter* w) override { epochs_.Save(w); }
    void Restore(StateReader* r) override { epochs_.Restore(r); }

   private:
    RepeatEpochs<IteratorBase> epochs_;
  };

  int64_t count_;
};

// Take (keep the first `count`) and Skip (drop them).
class CountDataset final : public UnaryDataset {
 public:
  CountDataset(DatasetPtr input, int64_t count, bool take)
      : UnaryDataset(std::move(input)), count_(count), take_(take) {}
  std::string Label() const override {
    return fmt::format("{}({})", take_ ? "Take" : "Skip", count_);
  }
  std::string StageName() const override { return take_ ? "take" : "skip"; }
  int64_t Cardinality() const override {
    const int64_t n = input_->Cardinality();
    if (take_) {
      if (count_ < 0 || n == kUnknownCardinality) return n;
      return n == kInfiniteCardinality ? count_ : std::min(n, count_);
    }
    if (n < 0) return n;
    return count_ < 0 ? 0 : std::max<int64_t>(0, n - count_);
  }
  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    return std::make_unique<It>(this, input_->MakeIterator(ctx, salt));
  }

 private:
  class It final : public IteratorBase {
   public:
    It(const CountDataset* d, std::unique_ptr<IteratorBase> in)
        : d_(d), in_(std::move(in)) {}
    bool GetNext(Element* out) override {
      if (d_->take_) {
        if (d_->count_ >= 0 && seen_ >= d_->count_) return false;
        if (!in_->GetNext(out)) return false;
        ++seen_;
        return true;
      }
      while (d_->count_ < 0 || seen_ < d_->count_) {
        if (!in_->GetNext(out)) return false;
        ++seen_;
      }
      if (d_->count_ < 0) return false;  // Skip(-1) skips everything
      return in_->GetNext(out);
    }
    void Save(StateWriter* w) override {
      w->BeginStage(d_->take_ ? "take" : "skip");
      w->I64(seen_);
      in_->Save(w);
    }
    void Restore(StateReader* r) override {
      r->BeginStage(d_->take_ ? "take" : "skip");
      seen_ = r->I64();
      if (seen_ < 0 || (d_->count_ >= 0 && seen_ > d_->count_)) {
        r->Fail(fmt::format("{} elements counted by {}", seen_, d_->Label()));
      }
      in_->Restore(r);
    }

   private:
    const CountDataset* d_;
    std::unique_ptr<IteratorBase> in_;
    int64_t seen_ = 0;
  };

  int64_t count_;
  bool take_;
};

class ShardDataset final : public UnaryDataset {
 public:
  ShardDataset(DatasetPtr input, int64_t n, int64_t index)
      : UnaryDataset(std::move(input)), n_(n), index_(index) {}
  std::string Label() const override {
    return fmt::format("Shard({}, {})", n_, index_);
  }
  std::string StageName() const override { return "shard"; }
  // Elements index, index + n, ...
  int64_t Cardinality() const override {
    const int64_t c = input_->Cardinality();
    if (c < 0) return c;
    return c / n_ + (index_ < c % n_ ? 1 : 0);
  }
  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    return std::make_unique<It>(this, input_->MakeIterator(ctx, salt));
  }

 private:
  class It final : public IteratorBase {
   public:
    It(const ShardDataset* d, std::unique_ptr<IteratorBase> in)
        : d_(d), in_(std::move(in)) {}
    bool GetNext(Element* out) override {
      while (in_->GetNext(out)) {
        const int64_t i = next_index_++;
        if (i % d_->n_ == d_->index_) return true;
      }
      return false;
    }
    void Save(StateWriter* w) override {
      w->BeginStage("shard");
      w->I64(next_index_);
      in_->Save(w);
    }
    void Restore(StateReader* r) override {
      r->BeginStage("shard");
      next_index_ = r->I64();
      if (next_index_ < 0) r->Fail(fmt::format("element {}", next_index_));
      in_->Restore(r);
    }

   private:
    const ShardDataset* d_;
    std::unique_ptr<IteratorBase> in_;
    int64_t next_index_ = 0;
  };

  int64_t n_, index_;
};

class IgnoreErrorsDataset final : public UnaryDataset {
 public:
  explicit IgnoreErrorsDataset(DatasetPtr input)
      : UnaryDataset(std::move(input)) {}
  std::string Label() const override { return "IgnoreErrors()"; }
  std::string StageName() const override { return "ignore_errors"; }
  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    return std::make_unique<It>(input_->MakeIterator(ctx, salt),
                                ctx->Counter(this, StageName()));
  }

 private:
  class It final : public IteratorBase {
   public:
    It(std::unique_ptr<IteratorBase> in, StageCounter* counter)
        : in_(std::move(in)), counter_(counter) {}
    bool GetNext(Element* out) override {
      while (true) {
        try {
          return in_->GetNext(out);
        } catch (const Cancelled&) {
          throw;
        } catch (const std::exception&) {
          counter_->errors_ignored.fetch_add(1, std::memory_order_relaxed);
        }
      }
    }
    void Save(StateWriter* w) override {
      w->BeginStage("ignore_errors");
      in_->Save(w);
    }
    void Restore(StateReader* r) override {
      r->BeginStage("ignore_errors");
      in_->Restore(r);
    }

   private:
    std::unique_ptr<IteratorBase> in_;
    StageCounter* counter_;
  };
};

}  // namespace

DatasetPtr Filter(DatasetPtr input, PredicateFn fn, std::string name) {
  return std::make_shared<FilterDataset>(std::move(input), std::move(fn),
                                         std::move(name));
}
DatasetPtr Repeat(DatasetPtr input, int64_t count) {
  return std::make_shared<RepeatDataset>(std::move(input), count);
}
DatasetPtr Take(DatasetPtr input, int64_t count) {
  return std::make_shared<CountDataset>(std::move(input), count, true);
}
DatasetPtr Skip(DatasetPtr input, int64_t count) {
  return std::make_shared<CountDataset>(std::move(input), count, false);
}
DatasetPtr Shard(DatasetPtr input, int64_t num_shards, int64_t index) {
  return std::make_shared<ShardDataset>(std::move(input), num_shards, index);
}
DatasetPtr IgnoreErrors(DatasetPtr input) {
  return std::make_shared<IgnoreErrorsDataset>(std::move(input));
}

}  // namespace recflow::pipeline::stages
