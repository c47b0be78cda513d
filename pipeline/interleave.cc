// Interleave: tf.data's algorithm, cycle_length input elements' datasets
// open at once, block_length elements from each in turn.
#include <fmt/format.h>

#include "pipeline/stages.h"

namespace recflow::pipeline::stages {
namespace {

class InterleaveDataset final : public UnaryDataset {
 public:
  InterleaveDataset(DatasetPtr input, InterleaveFn fn, int64_t cycle_length,
                    int64_t block_length, std::string name)
      : UnaryDataset(std::move(input)),
        fn_(std::move(fn)),
        cycle_length_(cycle_length),
        block_length_(block_length),
        name_(std::move(name)) {}

  std::string Label() const override {
    return fmt::format("Interleave({}, cycle_length={}, block_length={})",
                       name_, cycle_length_, block_length_);
  }
  std::string StageName() const override { return "interleave:" + name_; }
  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    return std::make_unique<It>(this, ctx, salt);
  }

 private:
  class It final : public IteratorBase {
   public:
    It(const InterleaveDataset* d, IteratorContext* ctx, uint64_t salt)
        : d_(d),
          ctx_(ctx),
          salt_(salt),
          input_(d->input_->MakeIterator(ctx, salt)),
          slots_(static_cast<size_t>(d->cycle_length_)) {}

    bool GetNext(Element* out) override {
      while (!end_of_input_ || open_ > 0) {
        Slot& slot = slots_[cycle_];
        if (slot.iterator) {
          bool got;
          try {
            got = slot.iterator->GetNext(out);
          } catch (const Cancelled&) {
            throw;
          } catch (...) {
            // As tf.data: the error is this element's; the slot goes on.
            AdvancePosition();
            throw;
          }
          if (got) {
            AdvancePosition();
            return true;
          }
          slot.iterator.reset();
          slot = Slot{};
          --open_;
          AdvanceToNextInCycle();
        } else if (!end_of_input_) {
          Element e;
          if (!input_->GetNext(&e)) {
            end_of_input_ = true;
            continue;
          }
          Open(slot, std::move(e), inputs_seen_++);
        } else {
          AdvanceToNextInCycle();
        }
      }
      return false;
    }

    void Save(StateWriter* w) override {
      w->BeginStage("interleave");
      w->U64(cycle_);
      w->I64(block_index_);
      w->Bool(end_of_input_);
      w->U64(inputs_seen_);
      for (const Slot& slot : slots_) {
        w->Bool(slot.iterator != nullptr);
        if (!slot.iterator) continue;
        w->U64(slot.input_number);
        w->WriteElement(slot.input);
        slot.iterator->Save(w);
      }
      input_->Save(w);
    }

    void Restore(StateReader* r) override {
      r->BeginStage("interleave");
      cycle_ = r->U64();
      block_index_ = r->I64();
      end_of_input_ = r->Bool();
      inputs_seen_ = r->U64();
      if (cycle_ >= slots_.size()) throw Error("interleave state: bad cycle");
      if (block_index_ < 0 || block_index_ >= d_->block_length_) {
        r->Fail(fmt::format("element {} of blocks of {}", block_index_,
                            d_->block_length_));
      }
      open_ = 0;
      for (Slot& slot : slots_) {
        slot.iterator.reset();
        slot = Slot{};
        if (!r->Bool()) continue;
        const uint64_t number = r->U64();
        Open(slot, r->ReadElement(), number);
        slot.iterator->Restore(r);
      }
      input_->Restore(r);
    }

   private:
    struct Slot {
      DatasetPtr dataset;  // outlives its iterator, which points into it
      std::unique_ptr<IteratorBase> iterator;
      Element input;  // what made it, for the state
      uint64_t input_number = 0;
    };

    void Open(Slot& slot, Element input, uint64_t number) {
      slot.dataset = d_->fn_(input).base();
      slot.iterator =
          slot.dataset->MakeIteratorInternal(ctx_, MixSeed(salt_, number));
      slot.input = std::move(input);
      slot.input_number = number;
      ++open_;
    }
    void AdvanceToNextInCycle() {
      block_index_ = 0;
      cycle_ = (cycle_ + 1) % slots_.size();
    }
    void AdvancePosition() {
      if (++block_index_ == d_->block_length_) AdvanceToNextInCycle();
    }

    const InterleaveDataset* d_;
    IteratorContext* ctx_;
    uint64_t salt_;
    std::unique_ptr<IteratorBase> input_;
    std::vector<Slot> slots_;
    size_t cycle_ = 0;
    int64_t block_index_ = 0;
    bool end_of_input_ = false;
    uint64_t inputs_seen_ = 0;
    size_t open_ = 0;
  };

  InterleaveFn fn_;
  int64_t cycle_length_;
  int64_t block_length_;
  std::string name_;
};

}  // namespace

DatasetPtr Interleave(DatasetPtr input, InterleaveFn fn, int64_t cycle_length,
                      int64_t block_length, std::string name) {
  return std::make_shared<InterleaveDataset>(std::move(input), std::move(fn),
                                             cycle_length, block_length,
                                             std::move(name));
}

}  // namespace recflow::pipeline::stages
