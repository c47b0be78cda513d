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
        : d_(d), ctx_(ctx), salt_(salt) {}
    bool GetNext(Element* out) override {
      while (true) {
        if (!in_) {
          if (d_->count_ >= 0 && epoch_ >= d_->count_) return false;
          Open();
        }
        if (in_->GetNext(out)) {
          produced_ = true;
          FillNext();
          return true;
        }
        in_.reset();
        // As tf.data: an input that is empty ends the repetition rather
        // than spinning forever.
        if (!produced_) {
          epoch_ = d_->count_ >= 0 ? d_->count_ : epoch_;
          next_.reset();
          return false;
        }
        ++epoch_;
      }
    }
    void Save(StateWriter* w) override {
      w->BeginStage("repeat");
      w->I64(epoch_);
      w->Bool(produced_);
      w->Bool(in_ != nullptr);
      if (in_) in_->Save(w);
    }
    void Restore(StateReader* r) override {
      r->BeginStage("repeat");
      epoch_ = r->I64();
      if (epoch_ < 0 || (d_->count_ >= 0 && epoch_ > d_->count_)) {
        r->Fail(fmt::format("epoch {} of Repeat({})", epoch_, d_->count_));
      }
      const bool produced = r->Bool();
      in_.reset();
      next_.reset();
      if (r->Bool()) {
        Open();
        in_->Restore(r);
      }
      produced_ = produced;
    }

   private:
    void Open() {
      in_ = next_ ? std::move(next_)
                  : d_->input_->MakeIterator(ctx_, RepeatSalt(salt_, epoch_));
      produced_ = false;
    }

    // While this epoch's input drains (a shuffle's buffer at its input's
    // end), the next epoch's fills, an element for each one handed out, as
    // TensorFlow's shuffle-and-repeat keeps its buffer full across epochs:
    // else the next epoch would begin by reading a whole buffer while the
    // consumer waits.  Only when reading happens changes (the next epoch's
    // iterator is never saved; see IteratorBase::FillAhead).
    void FillNext() {
      if (!in_->Draining()) return;
      if (!next_) {
        if (d_->count_ >= 0 && epoch_ + 1 >= d_->count_) return;
        try {
          next_ = d_->input_->MakeIterator(ctx_, RepeatSalt(salt_, epoch_ + 1));
        } catch (...) {
          return;  // thrown again where the epoch opens
        }
      }
      next_->FillAhead(1);
    }

    const RepeatDataset* d_;
    IteratorContext* ctx_;
    uint64_t salt_;
    int64_t epoch_ = 0;
    bool produced_ = false;
    std::unique_ptr<IteratorBase> in_;
    std::unique_ptr<IteratorBase> next_;  // epoch_ + 1's (see FillNext)
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
