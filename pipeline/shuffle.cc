// Shuffle: TensorFlow's buffered shuffle.
#include <fmt/format.h>

#include "pipeline/stages.h"

namespace recflow::pipeline::stages {
namespace {

class ShuffleDataset final : public UnaryDataset {
 public:
  ShuffleDataset(DatasetPtr input, int64_t buffer_size,
                 std::optional<uint64_t> seed, bool reshuffle)
      : UnaryDataset(std::move(input)),
        buffer_size_(buffer_size),
        seed_(seed),
        reshuffle_(reshuffle) {}

  std::string Label() const override {
    return fmt::format("Shuffle({}, seed={}, reshuffle_each_iteration={})",
                       buffer_size_, seed_ ? fmt::format("{}", *seed_) : "none",
                       reshuffle_);
  }
  std::string StageName() const override { return "shuffle"; }

  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    // Unseeded: the iterator's random seed, told apart per stage.
    const uint64_t base =
        seed_ ? *seed_ : MixSeed(ctx->seed(), Fingerprint(Describe()));
    const uint64_t seed = reshuffle_ ? MixSeed(base, salt) : base;
    return std::make_unique<It>(this, input_->MakeIterator(ctx, salt), seed,
                                ctx->Counter(this, StageName()));
  }

 private:
  // The buffer is filled to buffer_size; each call delivers a uniformly
  // chosen buffered element and the next input takes its place.  Buffered
  // elements are compacted so that they do not keep whole read blocks
  // alive.
  class It final : public IteratorBase {
   public:
    It(const ShuffleDataset* d, std::unique_ptr<IteratorBase> in, uint64_t seed,
       StageCounter* counter)
        : d_(d), in_(std::move(in)), rng_(seed), counter_(counter) {
      buffer_.reserve(static_cast<size_t>(
          std::min<int64_t>(d->buffer_size_, int64_t{1} << 20)));
    }

    bool GetNext(Element* out) override {
      while (!input_end_ &&
             static_cast<int64_t>(buffer_.size()) < d_->buffer_size_) {
        Element e;
        if (!in_->GetNext(&e)) {
          input_end_ = true;
          break;
        }
        for (auto& c : e.components) c.tensor = c.tensor.Compact();
        buffer_.push_back(std::move(e));
      }
      if (buffer_.empty()) return false;
      const size_t i = static_cast<size_t>(rng_.Below(buffer_.size()));
      *out = std::move(buffer_[i]);
      if (i + 1 != buffer_.size()) buffer_[i] = std::move(buffer_.back());
      buffer_.pop_back();
      counter_->buffered.store(static_cast<int64_t>(buffer_.size()),
                               std::memory_order_relaxed);
      return true;
    }

    // The buffered elements go into the state (tf.data does the same);
    // for states of O(1) size use the global shuffle.
    void Save(StateWriter* w) override {
      w->BeginStage("shuffle");
      w->U64(rng_.state());
      w->Bool(input_end_);
      w->U64(buffer_.size());
      for (const auto& e : buffer_) w->WriteElement(e);
      in_->Save(w);
    }
    void Restore(StateReader* r) override {
      r->BeginStage("shuffle");
      rng_.set_state(r->U64());
      input_end_ = r->Bool();
      const uint64_t n = r->U64();
      if (n > static_cast<uint64_t>(d_->buffer_size_)) {
        throw Error(
            fmt::format("shuffle state holds {} elements, more than "
                        "its buffer of {}",
                        n, d_->buffer_size_));
      }
      buffer_.clear();
      for (uint64_t i = 0; i < n; ++i) buffer_.push_back(r->ReadElement());
      in_->Restore(r);
    }

   private:
    const ShuffleDataset* d_;
    std::unique_ptr<IteratorBase> in_;
    Rng rng_;
    StageCounter* counter_;
    std::vector<Element> buffer_;
    bool input_end_ = false;
  };

  int64_t buffer_size_;
  std::optional<uint64_t> seed_;
  bool reshuffle_;
};

}  // namespace

DatasetPtr Shuffle(DatasetPtr input, int64_t buffer_size,
                   std::optional<uint64_t> seed, bool reshuffle) {
  return std::make_shared<ShuffleDataset>(std::move(input), buffer_size, seed,
                                          reshuffle);
}

}  // namespace recflow::pipeline::stages
