// Combining datasets: Zip, Concatenate, and Enumerate (which zips an
// element with its index).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "pipeline/stages.h"

namespace recflow::pipeline::stages {
namespace {

std::vector<std::string> Names(const Element& e) {
  std::vector<std::string> names;
  for (const auto& c : e.components) names.push_back(c.name);
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
          if (!first_names_) first_names_ = Names(*out);
          return true;
        }
        Switch();
      }
      if (!in_->GetNext(out)) return false;
      if (first_names_) {
        // Same components as the first input's (tf.data requires a
        // compatible structure); checked once, on the first element.
        std::vector<std::string> names = Names(*out), want = *first_names_;
        std::sort(names.begin(), names.end());
        std::sort(want.begin(), want.end());
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
    // The names of the first input's first element, until the second
    // input's first element is checked against them.
    std::optional<std::vector<std::string>> first_names_;
  };

  DatasetPtr first_, second_;
};

class EnumerateDataset final : public UnaryDataset {
 public:
  EnumerateDataset(DatasetPtr input, int64_t start, std::string name)
      : UnaryDataset(std::move(input)), start_(start), name_(std::move(name)) {}
  std::string Label() const override {
    return fmt::format("Enumerate({}, {})", start_, name_);
  }
  std::string StageName() const override { return "enumerate"; }
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

DatasetPtr Zip(std::vector<DatasetPtr> inputs) {
  return std::make_shared<ZipDataset>(std::move(inputs));
}
DatasetPtr Concatenate(DatasetPtr first, DatasetPtr second) {
  return std::make_shared<ConcatenateDataset>(std::move(first),
                                              std::move(second));
}
DatasetPtr Enumerate(DatasetPtr input, int64_t start, std::string name) {
  return std::make_shared<EnumerateDataset>(std::move(input), start,
                                            std::move(name));
}

}  // namespace recflow::pipeline::stages
