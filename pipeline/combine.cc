// Combining datasets: Zip, Concatenate, SampleFrom and ChooseFrom (which
// draw each element from one of their inputs), and Enumerate (which zips
// an element with its index).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <optional>

#include "pipeline/stages.h"

namespace recflow::pipeline::stages {
namespace {

// The names of `e`'s components, sorted: what Concatenate and the
// mixtures compare between inputs (the same names in any order).
std::vector<std::string> SortedNames(const Element& e) {
  std::vector<std::string> names;
  for (const auto& c : e.components) names.push_back(c.name);
  std::sort(names.begin(), names.end());
  return names;
}

class ZipDataset final : public DatasetBase {
 public:
  explicit ZipDataset(std::vector<DatasetPtr> inputs)
      : inputs_(std::move(inputs)) {}
  std::string Describe() const override {
    std::vector<std::string> parts;
    for (const auto& in : inputs_) parts.push_back(in->Describe());
    return fmt::format("Zip({})", fmt::join(parts, ", "));
  }
  std::string StageName() const override { return "zip"; }
  // The shortest input's, infinite ones aside.
  int64_t Cardinality() const override {
    int64_t n = kInfiniteCardinality;
    for (const auto& in : inputs_) {
      const int64_t c = in->Cardinality();
      if (c == kUnknownCardinality) return c;
      if (c != kInfiniteCardinality && (n == kInfiniteCardinality || c < n)) {
        n = c;
      }
    }
    return n;
  }
  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    std::vector<std::unique_ptr<IteratorBase>> its;
    // The same salt for every input: as in tf.data, two shuffles with the
    // same seed (in the same epoch) give the same order; unseeded ones
    // draw their own seeds.
    for (const auto& in : inputs_) its.push_back(in->MakeIterator(ctx, salt));
    return std::make_unique<It>(std::move(its));
  }

 private:
  class It final : public IteratorBase {
   public:
    explicit It(std::vector<std::unique_ptr<IteratorBase>> in)
        : in_(std::move(in)) {}
    bool GetNext(Element* out) override {
      if (ended_) return false;
      Element first;
      if (!in_[0]->GetNext(&first)) return End();
      for (size_t i = 1; i < in_.size(); ++i) {
        Element next;
        if (!in_[i]->GetNext(&next)) return End();
        for (auto& c : next.components) {
          if (first.Find(c.name) != nullptr) {
            throw Error(fmt::format(
                "Zip: input {} has a component '{}', as an input before it "
                "does; rename one (Map) so that each name is one input's",
                i, c.name));
          }
          first.components.push_back(std::move(c));
        }
      }
      // The origin (the first input's) stays: the order digest and a
      // record's place in errors follow the first input.
      *out = std::move(first);
      return true;
    }
    void Save(StateWriter* w) override {
      w->BeginStage("zip");
      w->Bool(ended_);
      for (auto& in : in_) in->Save(w);
    }
    void Restore(StateReader* r) override {
      r->BeginStage("zip");
      ended_ = r->Bool();
      for (auto& in : in_) in->Restore(r);
    }

   private:
    // The shortest input ended: so does the zip, for good (the others are
    // not read further, as tf.data's).
    bool End() {
      ended_ = true;
      return false;
    }
    std::vector<std::unique_ptr<IteratorBase>> in_;
    bool ended_ = false;
  };

  std::vector<DatasetPtr> inputs_;
};

class ConcatenateDataset final : public DatasetBase {
 public:
  ConcatenateDataset(DatasetPtr first, DatasetPtr second)
      : first_(std::move(first)), second_(std::move(second)) {}
  std::string Describe() const override {
    return fmt::format("{}.Concatenate({})", first_->Describe(),
                       second_->Describe());
  }
  std::string StageName() const override { return "concatenate"; }
  int64_t Cardinality() const override {
    const int64_t a = first_->Cardinality(), b = second_->Cardinality();
    if (a == kInfiniteCardinality || b == kInfiniteCardinality) {
      return kInfiniteCardinality;
    }
    if (a == kUnknownCardinality || b == kUnknownCardinality) {
      return kUnknownCardinality;
    }
    return a + b;
  }
  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    return std::make_unique<It>(this, ctx, salt);
  }

 private:
  class It final : public IteratorBase {
   public:
    It(const ConcatenateDataset* d, IteratorContext* ctx, uint64_t salt)
        : d_(d),
          ctx_(ctx),
          salt_(salt),
          in_(d->first_->MakeIterator(ctx, salt)) {}
    bool GetNext(Element* out) override {
      if (!second_) {
        if (in_->GetNext(out)) {
          // Once, not a vector of names per element on the way.
          if (!first_names_) first_names_ = SortedNames(*out);
          return true;
        }
        Switch();
      }
      if (!in_->GetNext(out)) return false;
      if (first_names_) {
        // Same components as the first input's (tf.data requires a
        // compatible structure); checked once, on the first element.
        const std::vector<std::string> names = SortedNames(*out);
        const std::vector<std::string>& want = *first_names_;
        if (names != want) {
          throw Error(fmt::format(
              "Concatenate: the second input's elements have components "
              "[{}], the first's [{}]",
              fmt::join(names, ", "), fmt::join(want, ", ")));
        }
        first_names_.reset();
      }
      return true;
    }
    void Save(StateWriter* w) override {
      w->BeginStage("concatenate");
      w->Bool(second_);
      in_->Save(w);
    }
    void Restore(StateReader* r) override {
      r->BeginStage("concatenate");
      if (r->Bool()) Switch();
      in_->Restore(r);
    }

   private:
    void Switch() {
      in_ = d_->second_->MakeIterator(ctx_, salt_);
      second_ = true;
    }
    const ConcatenateDataset* d_;
    IteratorContext* ctx_;
    uint64_t salt_;
    std::unique_ptr<IteratorBase> in_;
    bool second_ = false;
    // The sorted names of the first input's first element, until the second
    // input's first element is checked against them.
    std::optional<std::vector<std::string>> first_names_;
  };

  DatasetPtr first_, second_;
};

// What SampleFrom and ChooseFrom share (tf.data's directed interleave):
// the inputs, which of them have ended (MixEnds), and the check that their
// elements have the same component names.  Pick() says which input gives
// the next element.
class MixIterator : public IteratorBase {
 public:
  MixIterator(std::string_view stage,
              std::vector<std::unique_ptr<IteratorBase>> in, bool stop_on_empty)
      : stage_(stage),
        in_(std::move(in)),
        ends_(in_.size(), stop_on_empty),
        checked_(in_.size(), false) {}

  bool GetNext(Element* out) final {
    return ends_.Next([this] { return Pick(); },
                      [this, out](size_t i) {
                        if (!in_[i]->GetNext(out)) return false;
                        if (!checked_[i]) Check(i, *out);
                        return true;
                      },
                      [this] { InputsChanged(); });
  }
  void Save(StateWriter* w) final {
    ends_.SaveStage(
        w, stage_, [this](StateWriter* pw) { SavePicker(pw); }, in_);
  }
  void Restore(StateReader* r) final {
    ends_.RestoreStage(
        r, stage_, [this] { InputsChanged(); },
        [this](StateReader* pr) { RestorePicker(pr); }, in_);
  }

 protected:
  // The input of the next element; nullopt: the stream ends.  An
  // exception it throws is that element's error (the pick is used up).
  virtual std::optional<size_t> Pick() = 0;
  // After an input has ended or a Restore.
  virtual void InputsChanged() {}
  virtual void SavePicker(StateWriter* w) = 0;
  virtual void RestorePicker(StateReader* r) = 0;
  const std::vector<bool>& input_ended() const { return ends_.input_ended(); }
  size_t num_inputs() const { return in_.size(); }

 private:
  // An input's first element: its component names against the first
  // element this iterator delivered (tf.data requires one structure).
  // Once per input and iterator, so a restored iterator checks again.
  void Check(size_t i, const Element& e) {
    std::vector<std::string> names = SortedNames(e);
    if (!names_) {
      names_ = std::move(names);
      names_from_ = i;
    } else if (names != *names_) {
      throw Error(fmt::format(
          "{}: input {}'s elements have components [{}], input {}'s [{}]; "
          "every input must give the same names",
          stage_, i, fmt::join(names, ", "), names_from_,
          fmt::join(*names_, ", ")));
    }
    checked_[i] = true;
  }

  std::string stage_;
  std::vector<std::unique_ptr<IteratorBase>> in_;
  MixEnds ends_;
  std::vector<bool> checked_;
  std::optional<std::vector<std::string>> names_;
  size_t names_from_ = 0;
};

std::vector<std::unique_ptr<IteratorBase>> MakeAll(
    const std::vector<DatasetPtr>& inputs, IteratorContext* ctx,
    uint64_t salt) {
  std::vector<std::unique_ptr<IteratorBase>> its;
  for (const auto& in : inputs) its.push_back(in->MakeIterator(ctx, salt));
  return its;
}

std::string DescribeAll(const std::vector<DatasetPtr>& inputs) {
  std::vector<std::string> parts;
  for (const auto& in : inputs) parts.push_back(in->Describe());
  return fmt::format("{}", fmt::join(parts, ", "));
}

class SampleFromDataset final : public DatasetBase {
 public:
  SampleFromDataset(std::vector<DatasetPtr> inputs, SampleOptions options)
      : inputs_(std::move(inputs)), options_(std::move(options)) {}
  std::string Describe() const override {
    return fmt::format(
        "SampleFromDatasets([{}], weights=[{}], seed={}, "
        "stop_on_empty_dataset={}, rerandomize_each_iteration={})",
        DescribeAll(inputs_), fmt::join(options_.weights, ", "),
        options_.seed ? fmt::format("{}", *options_.seed) : "none",
        options_.stop_on_empty_dataset, options_.rerandomize_each_iteration);
  }
  std::string StageName() const override { return "sample_from_datasets"; }
  // Going on to the end: every input of weight > 0 in full.  Stopping at
  // the first that ends: known only when none ends.
  int64_t Cardinality() const override {
    int64_t n = 0;
    bool unknown = false, finite = false;
    for (size_t i = 0; i < inputs_.size(); ++i) {
      if (!(options_.weights[i] > 0)) continue;
      const int64_t c = inputs_[i]->Cardinality();
      if (c == kInfiniteCardinality) {
        if (!options_.stop_on_empty_dataset) return c;
        continue;
      }
      finite = true;
      if (c == kUnknownCardinality) unknown = true;
      n += c;
    }
    if (options_.stop_on_empty_dataset) {
      return finite ? kUnknownCardinality : kInfiniteCardinality;
    }
    return unknown ? kUnknownCardinality : n;
  }
  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    // The inputs get the salt as Zip's do.
    return std::make_unique<It>(this, MakeAll(inputs_, ctx, salt),
                                SeedFor(ctx, salt));
  }
  bool DescribeForFusion(FusableStage* out) const override {
    out->kind = FusableStage::Kind::kSample;
    out->inputs = inputs_;
    out->weights = &options_.weights;
    out->stop_on_empty = options_.stop_on_empty_dataset;
    out->shuffle_seed = [this](IteratorContext* ctx, uint64_t salt) {
      return SeedFor(ctx, salt);
    };
    return true;
  }

 private:
  // The draws' seed for an iterator made with `salt`, as Shuffle's:
  // unseeded, the iterator's random seed told apart per stage.
  uint64_t SeedFor(IteratorContext* ctx, uint64_t salt) const {
    return StageSeed(*this, options_.seed, *ctx, salt,
                     options_.rerandomize_each_iteration);
  }

  class It final : public MixIterator {
   public:
    It(const SampleFromDataset* d,
       std::vector<std::unique_ptr<IteratorBase>> in, uint64_t seed)
        : MixIterator("sample_from_datasets", std::move(in),
                      d->options_.stop_on_empty_dataset),
          draws_(d->options_.weights, seed) {}

   private:
    std::optional<size_t> Pick() override { return draws_.Pick(); }
    void InputsChanged() override { draws_.SetEnded(input_ended()); }
    void SavePicker(StateWriter* w) override { w->U64(draws_.state()); }
    void RestorePicker(StateReader* r) override { draws_.set_state(r->U64()); }

    WeightedDraws draws_;
  };

  std::vector<DatasetPtr> inputs_;
  SampleOptions options_;
};

class ChooseFromDataset final : public DatasetBase {
 public:
  ChooseFromDataset(std::vector<DatasetPtr> inputs, DatasetPtr choices,
                    bool stop_on_empty)
      : inputs_(std::move(inputs)),
        choices_(std::move(choices)),
        stop_on_empty_(stop_on_empty) {}
  std::string Describe() const override {
    return fmt::format("ChooseFromDatasets([{}], {}, stop_on_empty_dataset={})",
                       DescribeAll(inputs_), choices_->Describe(),
                       stop_on_empty_);
  }
  std::string StageName() const override { return "choose_from_datasets"; }
  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    return std::make_unique<It>(this, MakeAll(inputs_, ctx, salt),
                                choices_->MakeIterator(ctx, salt));
  }
  bool DescribeForFusion(FusableStage* out) const override {
    out->kind = FusableStage::Kind::kChoose;
    out->inputs = inputs_;
    out->choices = choices_;
    out->stop_on_empty = stop_on_empty_;
    return true;
  }

 private:
  class It final : public MixIterator {
   public:
    It(const ChooseFromDataset* d,
       std::vector<std::unique_ptr<IteratorBase>> in,
       std::unique_ptr<IteratorBase> choices)
        : MixIterator("choose_from_datasets", std::move(in), d->stop_on_empty_),
          picker_(std::move(choices), num_inputs()) {}

   private:
    std::optional<size_t> Pick() override { return picker_.Pick(); }
    void SavePicker(StateWriter* w) override { picker_.Save(w); }
    void RestorePicker(StateReader* r) override { picker_.Restore(r); }

    ChoicePicker picker_;
  };

  std::vector<DatasetPtr> inputs_;
  DatasetPtr choices_;
  bool stop_on_empty_;
};

class EnumerateDataset final : public UnaryDataset {
 public:
  EnumerateDataset(DatasetPtr input, int64_t start, std::string name)
      : UnaryDataset(std::move(input)), start_(start), name_(std::move(name)) {}
  std::string Label() const override {
    return fmt::format("Enumerate({}, {})", start_, name_);
  }
  std::string StageName() const override { return "enumerate"; }
  int64_t Cardinality() const override { return input_->Cardinality(); }
  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    return std::make_unique<It>(this, input_->MakeIterator(ctx, salt));
  }

 private:
  class It final : public IteratorBase {
   public:
    It(const EnumerateDataset* d, std::unique_ptr<IteratorBase> in)
        : d_(d), in_(std::move(in)), next_(d->start_) {}
    bool GetNext(Element* out) override {
      if (!in_->GetNext(out)) return false;
      if (out->Find(d_->name_) != nullptr) {
        throw Error(fmt::format(
            "Enumerate: the elements already have a component '{}'; give "
            "the index another name",
            d_->name_));
      }
      out->components.push_back({d_->name_, Tensor::Scalar<int64_t>(next_)});
      ++next_;
      return true;
    }
    void Save(StateWriter* w) override {
      w->BeginStage("enumerate");
      w->I64(next_);
      in_->Save(w);
    }
    void Restore(StateReader* r) override {
      r->BeginStage("enumerate");
      next_ = r->I64();
      if (next_ < d_->start_) {
        r->Fail(
            fmt::format("index {} before the start of {}", next_, d_->Label()));
      }
      in_->Restore(r);
    }

   private:
    const EnumerateDataset* d_;
    std::unique_ptr<IteratorBase> in_;
    int64_t next_;
  };

  int64_t start_;
  std::string name_;
};

}  // namespace

WeightedDraws::WeightedDraws(std::vector<double> weights, uint64_t seed)
    : weights_(std::move(weights)), rng_(seed), ends_(weights_.size()) {
  SetEnded(std::vector<bool>(weights_.size(), false));
}

std::optional<size_t> WeightedDraws::Pick() { return PickWith(rng_); }

std::optional<size_t> WeightedDraws::Peek(uint64_t ahead) const {
  Rng at(rng_.state() + ahead);
  return PickWith(at);
}

// u uniform in [0, total), the input whose share of [0, total) holds it.
// Inputs of weight 0 (or ended) have empty shares.
std::optional<size_t> WeightedDraws::PickWith(Rng& rng) const {
  if (!(total_ > 0)) return std::nullopt;
  const double u = static_cast<double>(rng.Next() >> 11) * 0x1.0p-53 * total_;
  const size_t i = static_cast<size_t>(
      std::upper_bound(ends_.begin(), ends_.end(), u) - ends_.begin());
  // u rounded up to the total: the last input with a share.
  return i < ends_.size() ? i : last_;
}

void WeightedDraws::SetEnded(const std::vector<bool>& ended) {
  double sum = 0;
  for (size_t i = 0; i < ends_.size(); ++i) {
    const double w = ended[i] ? 0.0 : weights_[i];
    if (w > 0) last_ = i;
    sum += w;
    ends_[i] = sum;
  }
  total_ = sum;
}

std::optional<size_t> ChoicePicker::Pick() {
  Element c;
  if (!choices_->GetNext(&c)) return std::nullopt;
  const int64_t at = read_++;
  const Tensor* t =
      c.components.size() == 1 ? &c.components[0].tensor : nullptr;
  if (t == nullptr || t->shape().rank() != 0 ||
      (t->dtype() != DType::kInt64 && t->dtype() != DType::kInt32)) {
    std::vector<std::string> parts;
    for (const auto& comp : c.components) {
      parts.push_back(fmt::format("{}: {} {}", comp.name,
                                  DTypeName(comp.tensor.dtype()),
                                  comp.tensor.shape().ToString()));
    }
    throw Error(fmt::format(
        "ChooseFromDatasets: choice {} is [{}]; each element of the "
        "choice dataset must be one int64 or int32 scalar",
        at, fmt::join(parts, ", ")));
  }
  const int64_t i = t->dtype() == DType::kInt64 ? t->scalar<int64_t>()
                                                : int64_t{t->scalar<int32_t>()};
  if (i < 0 || static_cast<uint64_t>(i) >= inputs_) {
    throw Error(
        fmt::format("ChooseFromDatasets: choice {} is {}, not in [0, {}) (the "
                    "datasets given)",
                    at, i, inputs_));
  }
  return static_cast<size_t>(i);
}

void ChoicePicker::Save(StateWriter* w) {
  w->I64(read_);
  choices_->Save(w);
}

void ChoicePicker::Restore(StateReader* r) {
  read_ = r->I64();
  if (read_ < 0) r->Fail(fmt::format("{} choices read", read_));
  choices_->Restore(r);
}

void MixEnds::Save(StateWriter* w) const {
  w->Bool(ended_);
  for (const bool ended : input_ended_) w->Bool(ended);
}

void MixEnds::Restore(StateReader* r) {
  ended_ = r->Bool();
  inputs_ended_ = 0;
  for (size_t i = 0; i < input_ended_.size(); ++i) {
    input_ended_[i] = r->Bool();
    inputs_ended_ += input_ended_[i];
  }
}

DatasetPtr Zip(std::vector<DatasetPtr> inputs) {
  return std::make_shared<ZipDataset>(std::move(inputs));
}
DatasetPtr Concatenate(DatasetPtr first, DatasetPtr second) {
  return std::make_shared<ConcatenateDataset>(std::move(first),
                                              std::move(second));
}
DatasetPtr SampleFrom(std::vector<DatasetPtr> inputs, SampleOptions options) {
  return std::make_shared<SampleFromDataset>(std::move(inputs),
                                             std::move(options));
}
DatasetPtr ChooseFrom(std::vector<DatasetPtr> inputs, DatasetPtr choices,
                      bool stop_on_empty_dataset) {
  return std::make_shared<ChooseFromDataset>(
      std::move(inputs), std::move(choices), stop_on_empty_dataset);
}
DatasetPtr Enumerate(DatasetPtr input, int64_t start, std::string name) {
  return std::make_shared<EnumerateDataset>(std::move(input), start,
                                            std::move(name));
}

}  // namespace recflow::pipeline::stages
