// Element-wise and counting transformations: Filter, TakeWhile, Scan,
// Unique, Repeat, Take, Skip, AssertCardinality, RejectionResample, Shard,
// IgnoreErrors.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <unordered_set>

#include "pipeline/stages.h"

namespace recflow::pipeline::stages {
namespace {

// Filter (keep the elements the predicate accepts) and tf.data's
// take_while (the elements up to the first it rejects, which ends the
// stream: it and the rest unread).  A predicate that throws has used up
// its element; the stream goes on after it (under IgnoreErrors).
class PredicateDataset final : public UnaryDataset {
 public:
  PredicateDataset(DatasetPtr input, PredicateFn fn, std::string name,
                   bool take_while)
      : UnaryDataset(std::move(input)),
        fn_(std::move(fn)),
        name_(std::move(name)),
        take_while_(take_while) {}
  std::string Label() const override {
    return fmt::format("{}({})", take_while_ ? "TakeWhile" : "Filter", name_);
  }
  std::string StageName() const override {
    return (take_while_ ? "take_while:" : "filter:") + name_;
  }
  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    return std::make_unique<It>(this, input_->MakeIterator(ctx, salt));
  }

 private:
  class It final : public IteratorBase {
   public:
    It(const PredicateDataset* d, std::unique_ptr<IteratorBase> in)
        : d_(d), in_(std::move(in)) {}
    bool GetNext(Element* out) override {
      if (d_->take_while_) {
        if (done_ || !in_->GetNext(out)) return false;
        if (d_->fn_(*out)) return true;
        done_ = true;
        return false;
      }
      while (in_->GetNext(out)) {
        if (d_->fn_(*out)) return true;
      }
      return false;
    }
    void Save(StateWriter* w) override {
      if (d_->take_while_) {
        w->BeginStage("take_while");
        w->Bool(done_);
      } else {
        w->BeginStage("filter");
      }
      in_->Save(w);
    }
    void Restore(StateReader* r) override {
      if (d_->take_while_) {
        r->BeginStage("take_while");
        done_ = r->Bool();
      } else {
        r->BeginStage("filter");
      }
      in_->Restore(r);
    }

   private:
    const PredicateDataset* d_;
    std::unique_ptr<IteratorBase> in_;
    bool done_ = false;  // take_while: the predicate rejected one
  };

  PredicateFn fn_;
  std::string name_;
  bool take_while_;
};

// Throws unless `state` has the components of `initial`, in order, with
// the same dtypes (shapes may change, as tf.data's scan allows).
void CheckScanState(const Element& initial, const Element& state,
                    std::string_view what) {
  bool same = state.components.size() == initial.components.size();
  for (size_t c = 0; same && c < state.components.size(); ++c) {
    same = state.components[c].name == initial.components[c].name &&
           state.components[c].tensor.dtype() ==
               initial.components[c].tensor.dtype();
  }
  if (same) return;
  auto list = [](const Element& e) {
    std::vector<std::string> parts;
    for (const auto& c : e.components) {
      parts.push_back(
          fmt::format("{}:{}", c.name, DTypeName(c.tensor.dtype())));
    }
    return fmt::format("{{{}}}", fmt::join(parts, " "));
  };
  throw Error(fmt::format(
      "{} has components {}, the initial state {}; a scan function must "
      "keep the state's names and dtypes",
      what, list(state), list(initial)));
}

// tf.data's scan: a state carried from element to element.
class ScanDataset final : public UnaryDataset {
 public:
  ScanDataset(DatasetPtr input, Element initial, Dataset::ScanFn fn,
              std::string name)
      : UnaryDataset(std::move(input)),
        initial_(std::move(initial)),
        fn_(std::move(fn)),
        name_(std::move(name)) {}
  std::string Label() const override { return fmt::format("Scan({})", name_); }
  std::string StageName() const override { return "scan:" + name_; }
  int64_t Cardinality() const override { return input_->Cardinality(); }
  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    return std::make_unique<It>(this, input_->MakeIterator(ctx, salt));
  }

 private:
  class It final : public IteratorBase {
   public:
    It(const ScanDataset* d, std::unique_ptr<IteratorBase> in)
        : d_(d), in_(std::move(in)), state_(d->initial_) {}
    // The state changes only when the function returns: one that throws
    // (or returns a state of other components) uses up its element and
    // leaves the state as it was.
    bool GetNext(Element* out) override {
      Element e;
      if (!in_->GetNext(&e)) return false;
      const int64_t i = next_++;
      auto [state, output] = d_->fn_(state_, std::move(e));
      CheckScanState(
          d_->initial_, state,
          fmt::format("{}: the state returned for element {}", d_->Label(), i));
      state_ = std::move(state);
      *out = std::move(output);
      return true;
    }
    void Save(StateWriter* w) override {
      w->BeginStage("scan");
      w->I64(next_);
      w->WriteElement(state_);
      in_->Save(w);
    }
    void Restore(StateReader* r) override {
      r->BeginStage("scan");
      next_ = r->I64();
      if (next_ < 0) r->Fail(fmt::format("element {}", next_));
      Element state = r->ReadElement();
      try {
        CheckScanState(d_->initial_, state, "the saved state");
      } catch (const Error& e) {
        r->Fail(e.what());
      }
      state_ = std::move(state);
      in_->Restore(r);
    }

   private:
    const ScanDataset* d_;
    std::unique_ptr<IteratorBase> in_;
    Element state_;
    int64_t next_ = 0;  // elements scanned, for errors
  };

  Element initial_;
  Dataset::ScanFn fn_;
  std::string name_;
};

// A byte string that two elements share exactly when they have the same
// component names, dtypes, shapes (row lengths, ragged) and values; for
// Unique, which takes integers and bytes only (a float's equality is not
// its bytes': NaN, -0).
void AppendKey(const Tensor& t, const std::string& name, std::string* key) {
  if (t.dtype() == DType::kFloat32 || t.dtype() == DType::kFloat64) {
    throw Error(fmt::format(
        "Unique: component '{}' is {}; as tf.data's unique, it compares "
        "integers and bytes only",
        name, DTypeName(t.dtype())));
  }
  t.CheckHost("Unique");
  auto u64 = [key](uint64_t v) {
    key->append(reinterpret_cast<const char*>(&v), sizeof v);
  };
  u64(static_cast<uint64_t>(t.dtype()));
  u64(static_cast<uint64_t>(t.shape().rank()));
  for (int64_t d : t.shape().dims()) u64(static_cast<uint64_t>(d));
  if (t.ragged()) {
    u64(1);
    AppendKey(t.row_lengths(), name, key);
    AppendKey(t.FlatValues(), name, key);
    return;
  }
  u64(0);
  if (t.dtype() == DType::kBytes) {
    for (int64_t k = 0; k < t.num_elements(); ++k) {
      const std::string_view v = t.bytes(k);
      u64(v.size());
      key->append(v);
    }
    return;
  }
  // An empty tensor may have no storage: nothing to append.
  if (t.byte_size() > 0) key->append(t.raw_data(), t.byte_size());
}

// tf.data's unique: each distinct element once, where it first comes.
class UniqueDataset final : public UnaryDataset {
 public:
  explicit UniqueDataset(DatasetPtr input) : UnaryDataset(std::move(input)) {}
  std::string Label() const override { return "Unique()"; }
  std::string StageName() const override { return "unique"; }
  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    return std::make_unique<It>(input_->MakeIterator(ctx, salt));
  }

 private:
  class It final : public IteratorBase {
   public:
    explicit It(std::unique_ptr<IteratorBase> in) : in_(std::move(in)) {}
    bool GetNext(Element* out) override {
      while (in_->GetNext(out)) {
        std::string key;
        for (const auto& c : out->components) {
          key.append(c.name);
          key.push_back('\0');
          AppendKey(c.tensor, c.name, &key);
        }
        if (seen_.insert(std::move(key)).second) return true;
      }
      return false;
    }
    // The keys seen, sorted: the same position saves the same bytes.
    void Save(StateWriter* w) override {
      w->BeginStage("unique");
      std::vector<const std::string*> keys;
      keys.reserve(seen_.size());
      for (const auto& k : seen_) keys.push_back(&k);
      std::sort(
          keys.begin(), keys.end(),
          [](const std::string* a, const std::string* b) { return *a < *b; });
      w->U64(keys.size());
      for (const std::string* k : keys) w->String(*k);
      in_->Save(w);
    }
    void Restore(StateReader* r) override {
      r->BeginStage("unique");
      const uint64_t n = r->U64();
      seen_.clear();
      // Each key is at least its length's 8 bytes: a count past the
      // blob's end fails on the first missing key, not in a reserve.
      for (uint64_t i = 0; i < n; ++i) seen_.insert(r->String());
      in_->Restore(r);
    }

   private:
    std::unique_ptr<IteratorBase> in_;
    std::unordered_set<std::string> seen_;
  };
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

// Take (keep the first `count`), Skip (drop them) and AssertCardinality
// (pass them all, an Error when there are more or fewer than `count`):
// the elements counted so far are their state.
class CountDataset final : public UnaryDataset {
 public:
  enum class Kind { kTake, kSkip, kAssert };
  CountDataset(DatasetPtr input, int64_t count, Kind kind)
      : UnaryDataset(std::move(input)), count_(count), kind_(kind) {}
  std::string Label() const override {
    if (kind_ == Kind::kAssert) {
      return fmt::format("AssertCardinality({})",
                         count_ == kInfiniteCardinality
                             ? std::string("infinite")
                             : fmt::format("{}", count_));
    }
    return fmt::format("{}({})", kind_ == Kind::kTake ? "Take" : "Skip",
                       count_);
  }
  std::string StageName() const override {
    switch (kind_) {
      case Kind::kTake:
        return "take";
      case Kind::kSkip:
        return "skip";
      case Kind::kAssert:
        break;
    }
    return "assert_cardinality";
  }
  int64_t Cardinality() const override {
    if (kind_ == Kind::kAssert) return count_;
    const int64_t n = input_->Cardinality();
    if (kind_ == Kind::kTake) {
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
  bool DescribeForFusion(FusableStage* out) const override {
    if (kind_ == Kind::kAssert) return false;
    out->kind = kind_ == Kind::kTake ? FusableStage::Kind::kTake
                                     : FusableStage::Kind::kSkip;
    out->input = input_;
    out->count = count_;
    return true;
  }

 private:
  // tf.data's wording, after the stage's label.
  std::string Expected() const {
    return fmt::format(
        "{}: the input was expected to contain {} but contained", Label(),
        count_ == kInfiniteCardinality
            ? std::string("an infinite number of elements")
            : fmt::format("{} element{}", count_, count_ == 1 ? "" : "s"));
  }

  class It final : public IteratorBase {
   public:
    It(const CountDataset* d, std::unique_ptr<IteratorBase> in)
        : d_(d), in_(std::move(in)) {}
    bool GetNext(Element* out) override {
      switch (d_->kind_) {
        case Kind::kTake:
          if (d_->count_ >= 0 && seen_ >= d_->count_) return false;
          if (!in_->GetNext(out)) return false;
          ++seen_;
          return true;
        case Kind::kSkip:
          while (d_->count_ < 0 || seen_ < d_->count_) {
            if (!in_->GetNext(out)) return false;
            ++seen_;
          }
          if (d_->count_ < 0) return false;  // Skip(-1) skips everything
          return in_->GetNext(out);
        case Kind::kAssert:
          break;
      }
      if (!in_->GetNext(out)) {
        if (seen_ != d_->count_) {
          throw Error(fmt::format("{} only {}", d_->Expected(), seen_));
        }
        return false;
      }
      ++seen_;
      if (d_->count_ >= 0 && seen_ > d_->count_) {
        // The first element too many, where a file says where.
        throw Error(fmt::format("{} at least {}{}", d_->Expected(), seen_,
                                out->origin.file
                                    ? fmt::format(" (the first past them: {})",
                                                  out->origin.ToString())
                                    : std::string()));
      }
      return true;
    }
    void Save(StateWriter* w) override {
      SaveCounted(w, d_->StageName(), seen_);
      in_->Save(w);
    }
    void Restore(StateReader* r) override {
      seen_ = RestoreCounted(r, d_->StageName(), d_->count_, d_->Label());
      in_->Restore(r);
    }

   private:
    const CountDataset* d_;
    std::unique_ptr<IteratorBase> in_;
    int64_t seen_ = 0;
  };

  int64_t count_;
  Kind kind_;
};

class RejectionResampleDataset final : public UnaryDataset {
 public:
  // Each class's count begins here when the input's distribution is
  // estimated (tf.data's smoothing constant).
  static constexpr int64_t kSmoothing = 10;

  RejectionResampleDataset(DatasetPtr input, Dataset::KeyFn class_func,
                           ResampleOptions options)
      : UnaryDataset(std::move(input)),
        class_func_(std::move(class_func)),
        o_(std::move(options)) {}
  std::string Label() const override {
    return fmt::format(
        "RejectionResample({}, target_dist=[{}], initial_dist={}, seed={})",
        o_.class_name, fmt::join(o_.target_dist, ", "),
        o_.initial_dist.empty()
            ? std::string("estimated")
            : fmt::format("[{}]", fmt::join(o_.initial_dist, ", ")),
        o_.seed ? fmt::format("{}", *o_.seed) : "none");
  }
  std::string StageName() const override { return "rejection_resample"; }
  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    // Each epoch draws afresh.
    return std::make_unique<It>(this, input_->MakeIterator(ctx, salt),
                                StageSeed(*this, o_.seed, *ctx, salt, true));
  }

 private:
  class It final : public IteratorBase {
   public:
    It(const RejectionResampleDataset* d, std::unique_ptr<IteratorBase> in,
       uint64_t seed)
        : d_(d), in_(std::move(in)), rng_(seed) {
      const size_t classes = d->o_.target_dist.size();
      if (d->o_.initial_dist.empty()) {
        counts_.assign(classes, kSmoothing);
        Estimate();
      } else {
        Accept(d->o_.initial_dist);
      }
    }
    bool GetNext(Element* out) override {
      const bool whatever_class = Uniform() < original_;
      while (in_->GetNext(out)) {
        const int64_t element = seen_++;
        const int64_t c = d_->class_func_(*out);
        if (c < 0 || c >= static_cast<int64_t>(accept_.size())) {
          throw Error(fmt::format("{}: element {}: class {} is not in [0, {})",
                                  d_->Label(), element, c, accept_.size()));
        }
        if (!counts_.empty()) {
          ++counts_[static_cast<size_t>(c)];
          Estimate();
        }
        if (whatever_class || Uniform() < accept_[static_cast<size_t>(c)]) {
          return true;
        }
      }
      return false;
    }
    void Save(StateWriter* w) override {
      w->BeginStage("rejection_resample");
      w->U64(rng_.state());
      w->I64(seen_);
      w->U64(counts_.size());
      for (int64_t n : counts_) w->I64(n);
      in_->Save(w);
    }
    void Restore(StateReader* r) override {
      r->BeginStage("rejection_resample");
      rng_.set_state(r->U64());
      seen_ = r->I64();
      const uint64_t n = r->U64();
      if (seen_ < 0 || n != counts_.size()) {
        r->Fail(fmt::format("{} elements seen, {} class counts, by {}", seen_,
                            n, d_->Label()));
      }
      // Every count begins at kSmoothing; together they grew by at most
      // the elements seen.
      __int128 grown = 0;
      for (int64_t& c : counts_) {
        c = r->I64();
        if (c < kSmoothing) {
          r->Fail(fmt::format("a class count of {} by {}", c, d_->Label()));
        }
        grown += c - kSmoothing;
      }
      if (grown > seen_) {
        r->Fail(fmt::format("{} classes counted of {} elements seen by {}",
                            static_cast<int64_t>(grown), seen_, d_->Label()));
      }
      if (!counts_.empty()) Estimate();
      in_->Restore(r);
    }

   private:
    double Uniform() {
      return static_cast<double>(rng_.Next() >> 11) * 0x1.0p-53;
    }
    void Estimate() {
      double total = 0;
      for (int64_t c : counts_) total += static_cast<double>(c);
      initial_.resize(counts_.size());
      for (size_t i = 0; i < counts_.size(); ++i) {
        initial_[i] = static_cast<double>(counts_[i]) / total;
      }
      Accept(initial_);
    }
    // tf.data's mixing: r_i = target_i / initial_i (a class never seen
    // divides by the least positive double), m = min r, M = max r.
    void Accept(const std::vector<double>& initial) {
      const std::vector<double>& target = d_->o_.target_dist;
      accept_.resize(target.size());
      double lo = std::numeric_limits<double>::infinity(), hi = 0;
      for (size_t i = 0; i < target.size(); ++i) {
        accept_[i] =
            target[i] / (initial[i] + std::numeric_limits<double>::min());
        lo = std::min(lo, accept_[i]);
        hi = std::max(hi, accept_[i]);
      }
      if (!(hi > lo)) {  // the same distribution: every element passes
        original_ = 1;
        return;
      }
      for (double& a : accept_) a = (a - lo) / (hi - lo);
      original_ = lo;
    }

    const RejectionResampleDataset* d_;
    std::unique_ptr<IteratorBase> in_;
    Rng rng_;
    int64_t seen_ = 0;
    std::vector<int64_t> counts_;  // estimating: each class's, from 10
    std::vector<double> initial_;  // the estimate
    std::vector<double> accept_;   // each class's acceptance
    double original_ = 1;          // the chance of the next element, any class
  };

  Dataset::KeyFn class_func_;
  ResampleOptions o_;
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
  bool DescribeForFusion(FusableStage* out) const override {
    out->kind = FusableStage::Kind::kShard;
    out->input = input_;
    out->count = n_;
    out->shard_index = index_;
    return true;
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
      SaveCounted(w, "shard", next_index_);
      in_->Save(w);
    }
    void Restore(StateReader* r) override {
      next_index_ = RestoreCounted(r, "shard", -1, d_->Label());
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

void SaveCounted(StateWriter* w, std::string_view stage, int64_t counted) {
  w->BeginStage(stage);
  w->I64(counted);
}

int64_t RestoreCounted(StateReader* r, std::string_view stage, int64_t most,
                       std::string_view label) {
  r->BeginStage(stage);
  const int64_t counted = r->I64();
  if (counted < 0 || (most >= 0 && counted > most)) {
    r->Fail(fmt::format("{} elements counted by {}", counted, label));
  }
  return counted;
}

DatasetPtr Filter(DatasetPtr input, PredicateFn fn, std::string name) {
  return std::make_shared<PredicateDataset>(std::move(input), std::move(fn),
                                            std::move(name), false);
}
DatasetPtr TakeWhile(DatasetPtr input, PredicateFn fn, std::string name) {
  return std::make_shared<PredicateDataset>(std::move(input), std::move(fn),
                                            std::move(name), true);
}
DatasetPtr Scan(DatasetPtr input, Element initial, Dataset::ScanFn fn,
                std::string name) {
  return std::make_shared<ScanDataset>(std::move(input), std::move(initial),
                                       std::move(fn), std::move(name));
}
DatasetPtr Unique(DatasetPtr input) {
  return std::make_shared<UniqueDataset>(std::move(input));
}
DatasetPtr Repeat(DatasetPtr input, int64_t count) {
  return std::make_shared<RepeatDataset>(std::move(input), count);
}
DatasetPtr Take(DatasetPtr input, int64_t count) {
  return std::make_shared<CountDataset>(std::move(input), count,
                                        CountDataset::Kind::kTake);
}
DatasetPtr AssertCardinality(DatasetPtr input, int64_t expected) {
  return std::make_shared<CountDataset>(std::move(input), expected,
                                        CountDataset::Kind::kAssert);
}
DatasetPtr RejectionResample(DatasetPtr input, Dataset::KeyFn class_func,
                             ResampleOptions options) {
  return std::make_shared<RejectionResampleDataset>(
      std::move(input), std::move(class_func), std::move(options));
}
DatasetPtr Skip(DatasetPtr input, int64_t count) {
  return std::make_shared<CountDataset>(std::move(input), count,
                                        CountDataset::Kind::kSkip);
}
DatasetPtr Shard(DatasetPtr input, int64_t num_shards, int64_t index) {
  return std::make_shared<ShardDataset>(std::move(input), num_shards, index);
}
DatasetPtr IgnoreErrors(DatasetPtr input) {
  return std::make_shared<IgnoreErrorsDataset>(std::move(input));
}

}  // namespace recflow::pipeline::stages
