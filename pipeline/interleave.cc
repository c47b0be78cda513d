// Interleave: tf.data's algorithm, cycle_length input elements' datasets
// open at once, block_length elements from each in turn.
//
// Parallel (num_parallel_calls > 1): each open input's iterator is wrapped
// in a ReadAhead, whose thread reads it ahead into a bounded buffer, and
// when fewer calls than inputs may run at once, in a GatedIterator that
// holds one of num_parallel_calls tokens while inside the input's GetNext.
// The consumer takes from the slots in the same turns as the sequential
// loop, so the elements, their order and the errors' places are the same.
// To start reading early, empty slots are given their next inputs at once
// (FillEmptySlots) rather than when their turns come: the inputs still go
// to the slots in the same order, because the sequential loop fills empty
// slots in the order its turns reach them, which is the cycle's order from
// the current turn (a slot that empties later is reached again only after
// a whole cycle); an error of the input met while filling early is kept in
// its slot, thrown when its turn comes, and the slots after it wait.
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <iterator>
#include <mutex>
#include <optional>
#include <thread>

#include "pipeline/stages.h"

namespace recflow::pipeline::stages {
namespace {

// At most `tokens` callers between Enter and Leave at once.  A wait ends
// with Cancelled when the Iterator is destroyed.  Thread-safe; outlives
// every GatedIterator that points to it.
class CallGate {
 public:
  CallGate(IteratorContext* ctx, int tokens) : ctx_(ctx), free_(tokens) {
    wake_up_id_ = ctx_->AddWakeUp([this] {
      std::lock_guard<std::mutex> lock(mu_);
      cv_.notify_all();
    });
  }
  ~CallGate() { ctx_->RemoveWakeUp(wake_up_id_); }
  CallGate(const CallGate&) = delete;
  CallGate& operator=(const CallGate&) = delete;

  void Enter() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return free_ > 0 || ctx_->cancelled(); });
    if (free_ == 0) throw Cancelled();
    --free_;
  }
  void Leave() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++free_;
    }
    cv_.notify_one();
  }

 private:
  IteratorContext* ctx_;
  uint64_t wake_up_id_;
  std::mutex mu_;
  std::condition_variable cv_;
  int free_;
};

// An input's iterator whose GetNext holds one of the gate's tokens.
class GatedIterator final : public IteratorBase {
 public:
  GatedIterator(std::unique_ptr<IteratorBase> input, CallGate* gate)
      : input_(std::move(input)), gate_(gate) {}
  bool GetNext(Element* out) override {
    gate_->Enter();
    struct Leave {
      CallGate* gate;
      ~Leave() { gate->Leave(); }
    } leave{gate_};
    return input_->GetNext(out);
  }
  void Save(StateWriter* w) override { input_->Save(w); }
  void Restore(StateReader* r) override { input_->Restore(r); }

 private:
  std::unique_ptr<IteratorBase> input_;
  CallGate* gate_;
};

// InterleaveOptions::buffer_output_elements kAutotune's count.
constexpr size_t kAutotuneReadAheadElements = 1024;

// An input read ahead on a thread of its own into a bounded buffer of
// results (elements, errors, the end).  Made for small elements (a text
// line) as much as for large: the reader hands its results over in runs
// and the consumer takes a whole run at once, so that most reads and
// takes touch no lock and no shared line; each wakes the other by the
// wake rule (stages.h; a reader that filled the buffer waits until half
// of it is taken); and the elements the consumer is done with go back to
// the reader (Retire), to be freed on the thread whose malloc arena they
// came from.  (Handing over each element under a lock, as Prefetch's
// AsyncIterator does, was 3-5x slower than one thread for 50-byte lines.)
//
// Bounds: at most max_elements results held (read and not yet taken), and
// the reader stops while they hold max_bytes (0: no bound) or more.
// GetNext, Retire, WhatIsReady, Save and Restore are the consumer's (one
// thread); Restore before Start.
class ReadAhead final : public IteratorBase {
 public:
  enum class Readiness { kNothing, kElement, kEnd };  // kElement: or error

  ReadAhead(IteratorContext* ctx, std::unique_ptr<IteratorBase> input,
            size_t max_elements, uint64_t max_bytes, ReadySignal* signal)
      : ctx_(ctx),
        nesting_(CounterNesting::Current()),
        input_(std::move(input)),
        max_elements_(max_elements),
        max_bytes_(max_bytes),
        signal_(signal) {
    wake_up_id_ = ctx_->AddWakeUp([this] {
      std::lock_guard<std::mutex> lock(mu_);
      consumer_cv_.notify_all();
      reader_cv_.notify_all();
    });
  }
  ~ReadAhead() override {
    ctx_->RemoveWakeUp(wake_up_id_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    reader_cv_.notify_all();
    if (reader_.joinable()) reader_.join();
  }

  void Start() {
    if (!reader_.joinable()) reader_ = std::thread([this] { ReaderLoop(); });
  }

  bool GetNext(Element* out) override {
    if (RunLeft() == 0 && !TakeRun()) throw Cancelled();
    Result& r = run_[run_pos_];
    if (r.end) return false;  // stays, so that later calls end too
    std::exception_ptr error = std::move(r.error);
    if (!error) *out = std::move(r.element);
    taken_bytes_ += r.bytes;
    ++taken_;
    ++run_pos_;
    if (taken_ >= kGiveBackEvery || RunLeft() == 0) GiveBackRoom();
    if (error) std::rethrow_exception(error);
    return true;
  }

  // An element this input gave, which the consumer is done with.
  void Retire(Element&& spent) { spent_.push_back(std::move(spent)); }

  Readiness WhatIsReady() {
    if (RunLeft() == 0) {
      std::lock_guard<std::mutex> lock(mu_);
      if (shared_.empty()) return Readiness::kNothing;
      SwapRunLocked();
    }
    return run_[run_pos_].end ? Readiness::kEnd : Readiness::kElement;
  }

  void Save(StateWriter* w) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (reader_.joinable()) {
      pause_ = true;
      pause_requested_.store(true);
      reader_cv_.notify_all();
      consumer_cv_.wait(lock, [this] { return paused_ || stop_; });
    }
    w->BeginStage("interleave_ahead");
    w->Bool(input_end_);
    w->U64(RunLeft() + shared_.size());
    for (size_t i = run_pos_; i < run_.size(); ++i) {
      WriteResult(w, run_[i].end, run_[i].error, run_[i].element);
    }
    for (const Result& r : shared_) WriteResult(w, r.end, r.error, r.element);
    // The reader is paused outside the input, with nothing of its own
    // unpublished; saving it may take the context's lock, never taken
    // while holding a stage's.
    lock.unlock();
    input_->Save(w);
    lock.lock();
    pause_ = false;
    pause_requested_.store(false);
    reader_cv_.notify_all();
  }

  void Restore(StateReader* r) override {
    if (reader_.joinable()) {
      throw Error("cannot restore an interleave input read ahead");
    }
    r->BeginStage("interleave_ahead");
    run_.clear();
    run_pos_ = 0;
    shared_.clear();
    uint64_t bytes = 0;
    input_end_ =
        ReadResults(r, max_elements_,
                    [&](bool end, std::exception_ptr error, Element element) {
                      Result result;
                      result.end = end;
                      result.error = std::move(error);
                      result.element = std::move(element);
                      if (!result.end && !result.error && max_bytes_ != 0) {
                        result.bytes = result.element.byte_size();
                      }
                      bytes += result.bytes;
                      run_.push_back(std::move(result));
                    });
    held_.store(run_.size());
    held_bytes_.store(bytes);
    input_->Restore(r);
  }

 private:
  struct Result {
    Element element;
    std::exception_ptr error;
    bool end = false;
    uint64_t bytes = 0;
  };
  // The consumer gives room back to the reader every so many takes.
  static constexpr size_t kGiveBackEvery = 16;

  // Whether the results held (published and not given back, held_ and
  // held_bytes_, plus the reader's unpublished `extra`) leave room.
  bool HasRoom(size_t extra, uint64_t extra_bytes) const {
    return held_.load() + extra < max_elements_ &&
           (max_bytes_ == 0 || held_bytes_.load() + extra_bytes < max_bytes_);
  }

  void GiveBackRoom() {
    const size_t held = held_.fetch_sub(taken_) - taken_;
    const uint64_t bytes = held_bytes_.fetch_sub(taken_bytes_) - taken_bytes_;
    taken_ = 0;
    taken_bytes_ = 0;
    if ((held <= max_elements_ / 2 ||
         (max_bytes_ != 0 && bytes <= max_bytes_ / 2)) &&
        reader_waits_.load()) {
      std::lock_guard<std::mutex> lock(mu_);
      reader_cv_.notify_one();
    }
  }

  size_t RunLeft() const { return run_.size() - run_pos_; }

  // Under mu_ and with the run taken: the shared results become the
  // consumer's run (the two vectors change places, so that neither
  // allocates once grown), and the spent elements go to the reader.
  void SwapRunLocked() {
    run_.clear();
    run_pos_ = 0;
    run_.swap(shared_);
    if (!spent_.empty() && reader_spent_.empty()) reader_spent_.swap(spent_);
  }

  // Under mu_: whether the consumer waiting wakes now: the shared results
  // make the run it waits for, or they end with the input's end or an
  // error, or fill the buffer.
  bool RunReadyLocked() const {
    return !shared_.empty() &&
           (shared_.size() >= consumer_wants_.load() || input_end_ ||
            shared_.back().error != nullptr || !HasRoom(0, 0));
  }

  // Moves the shared results into run_, waiting for them (the wake rule);
  // false when the Iterator is being destroyed.
  bool TakeRun() {
    std::unique_lock<std::mutex> lock(mu_);
    if (shared_.empty()) {
      // The consumer waits on its input: the interleave's wait, not work.
      WaitScope wait(nesting_.parent);
      WaitForRun(
          lock, consumer_cv_, consumer_wants_, *ctx_,
          [this] { return RunReadyLocked(); },
          [this] { return !shared_.empty(); });
      if (shared_.empty()) return false;
    }
    SwapRunLocked();
    return true;
  }

  void ReaderLoop() {
    // The input's stages count under the interleave, as where it was made.
    CounterNesting nesting(nesting_);
    std::vector<Result> unpublished;
    uint64_t unpublished_bytes = 0;
    std::vector<Element> to_free;
    std::unique_lock<std::mutex> lock(mu_);
    const auto can_read = [&] {
      return stop_ || pause_ ||
             (!input_end_ && HasRoom(unpublished.size(), unpublished_bytes));
    };
    while (true) {
      if (!can_read()) {
        // reader_waits_ set before the room is looked at again (both
        // sequentially consistent), against GiveBackRoom's (held_ before
        // reader_waits_): one of the two sees the other.
        reader_waits_.store(true);
        reader_cv_.wait(lock, can_read);
        reader_waits_.store(false);
      }
      if (stop_) return;
      if (pause_) {
        paused_ = true;
        consumer_cv_.notify_all();
        reader_cv_.wait(lock, [this] { return stop_ || !pause_; });
        paused_ = false;
        continue;
      }
      to_free.swap(reader_spent_);
      lock.unlock();
      to_free.clear();  // on this thread, where they were made
      // Reads a run: up to kWakeRun results, fewer when the buffer fills,
      // the input ends or errs, the consumer waits (for a run: it gets
      // one now), or a Save asks.
      do {
        Result result;
        bool got = false;
        try {
          got = input_->GetNext(&result.element);
        } catch (...) {
          result.error = std::current_exception();
        }
        result.end = !got && !result.error;
        if (got && max_bytes_ != 0) result.bytes = result.element.byte_size();
        unpublished_bytes += result.bytes;
        unpublished.push_back(std::move(result));
        if (!got) break;
      } while (unpublished.size() < kWakeRun &&
               HasRoom(unpublished.size(), unpublished_bytes) &&
               consumer_wants_.load() != 1 &&
               !(signal_ && signal_->wants_any.load()) &&
               !pause_requested_.load());
      lock.lock();
      Publish(&unpublished, &unpublished_bytes);
    }
  }

  // Under mu_: the reader's results join the shared ones.
  void Publish(std::vector<Result>* results, uint64_t* bytes) {
    input_end_ = results->back().end;
    held_.fetch_add(results->size());
    held_bytes_.fetch_add(*bytes);
    std::move(results->begin(), results->end(), std::back_inserter(shared_));
    results->clear();
    *bytes = 0;
    if (consumer_wants_.load() > 0 && RunReadyLocked()) {
      consumer_cv_.notify_one();
    }
    if (signal_) signal_->Notify();
  }

  IteratorContext* ctx_;
  // Made under the interleave's CounterNesting: its parent is the
  // interleave's counter.
  const CounterNesting::Frame nesting_;
  std::unique_ptr<IteratorBase> input_;
  const size_t max_elements_;
  const uint64_t max_bytes_;
  ReadySignal* signal_;
  uint64_t wake_up_id_;
  // Each group on cache lines of its own, so that what one thread writes
  // per element does not take from the other the line it reads per
  // element.
  // The consumer's: its run, the takes not yet given back as room, and
  // the elements it retired since its last swap.
  alignas(64) std::vector<Result> run_;
  size_t run_pos_ = 0;  // run_[run_pos_...] are still to take
  size_t taken_ = 0;
  uint64_t taken_bytes_ = 0;
  std::vector<Element> spent_;
  // Results held (published, not given back) and their bytes.
  alignas(64) std::atomic<size_t> held_{0};
  std::atomic<uint64_t> held_bytes_{0};
  alignas(64) std::atomic<bool> reader_waits_{false};
  // > 0: the consumer waits for that many shared results.
  std::atomic<size_t> consumer_wants_{0};
  std::atomic<bool> pause_requested_{false};
  alignas(64) std::mutex mu_;
  std::condition_variable consumer_cv_;
  std::condition_variable reader_cv_;
  // Guarded by mu_.
  std::vector<Result> shared_;
  std::vector<Element> reader_spent_;  // for the reader to free
  bool input_end_ = false;
  bool stop_ = false;
  bool pause_ = false;
  bool paused_ = false;
  std::thread reader_;
};

class InterleaveDataset final : public UnaryDataset {
 public:
  InterleaveDataset(DatasetPtr input, InterleaveFn fn, int64_t cycle_length,
                    InterleaveOptions options,
                    std::optional<InterleavedFiles> files)
      : UnaryDataset(std::move(input)),
        fn_(std::move(fn)),
        cycle_length_(cycle_length),
        options_(std::move(options)),
        files_(std::move(files)) {}

  std::string Label() const override {
    // The parallel form's state holds the inputs' read-ahead buffers:
    // the label tells it apart, so that neither form restores the other's.
    return fmt::format(
        "Interleave({}, cycle_length={}, block_length={}{}{})", options_.name,
        cycle_length_, options_.block_length,
        parallel() ? fmt::format(", num_parallel_calls={}",
                                 options_.num_parallel_calls)
                   : "",
        files_ ? fmt::format(", files {:016x}", files_->fingerprint) : "");
  }
  std::string StageName() const override {
    return "interleave:" + options_.name;
  }
  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    return std::make_unique<It>(this, ctx, salt);
  }
  DatasetPtr ShardByFiles(int64_t num_shards, int64_t index) const override {
    return files_ ? files_->shard(num_shards, index) : nullptr;
  }

 private:
  bool parallel() const { return options_.num_parallel_calls > 1; }

  class It final : public IteratorBase {
   public:
    It(const InterleaveDataset* d, IteratorContext* ctx, uint64_t salt)
        : d_(d),
          ctx_(ctx),
          salt_(salt),
          input_(d->input_->MakeIterator(ctx, salt)),
          counter_(ctx->Counter(d, d->StageName(), d->Parallelism(*ctx))),
          slots_(static_cast<size_t>(d->cycle_length_)) {
      if (d_->parallel() &&
          d_->options_.num_parallel_calls < d->cycle_length_) {
        gate_ =
            std::make_unique<CallGate>(ctx, d_->options_.num_parallel_calls);
      }
      if (d_->parallel() && !d_->options_.deterministic) {
        signal_ = std::make_unique<ReadySignal>();
        signal_wake_up_ = ctx_->AddWakeUp([s = signal_.get()] { s->Wake(); });
      }
    }
    ~It() override {
      if (signal_) ctx_->RemoveWakeUp(signal_wake_up_);
    }

    bool GetNext(Element* out) override {
      if (d_->parallel() && !ahead_started_) {
        ahead_started_ = true;
        for (Slot& slot : slots_) {
          if (slot.ahead) slot.ahead->Start();
        }
        FillEmptySlots();
      }
      while (!end_of_input_ || open_ > 0) {
        Slot& slot = slots_[cycle_];
        if (slot.pending) {
          // As the sequential loop: the input's error at this turn, which
          // then asks the input again.
          std::exception_ptr error = std::move(slot.pending);
          slot.pending = nullptr;
          std::rethrow_exception(error);
        }
        if (slot.iterator) {
          if (signal_ && TakeOutOfTurn(slot, out)) return true;
          bool got;
          try {
            got = TakeFrom(slot, out);
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
          if (slot.ahead == last_ahead_) last_ahead_ = nullptr;
          slot = Slot{};
          --open_;
          AdvanceToNextInCycle();
          if (d_->parallel()) FillEmptySlots();
        } else if (!end_of_input_) {
          if (d_->parallel()) {
            FillEmptySlots();
            continue;
          }
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
        if (!slot.iterator) {
          if (d_->parallel()) {
            w->Bool(slot.pending != nullptr);
            if (slot.pending) WriteResult(w, false, slot.pending, Element{});
          }
          continue;
        }
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
      if (block_index_ < 0 || block_index_ >= d_->options_.block_length) {
        r->Fail(fmt::format("element {} of blocks of {}", block_index_,
                            d_->options_.block_length));
      }
      open_ = 0;
      ahead_started_ = false;
      last_ahead_ = nullptr;
      for (Slot& slot : slots_) {
        slot = Slot{};
        if (!r->Bool()) {
          if (d_->parallel() && r->Bool()) {
            bool end = false;
            Element unused;
            ReadResult(r, &end, &slot.pending, &unused);
            if (!slot.pending) r->Fail("a slot's kept error that is none");
          }
          continue;
        }
        const uint64_t number = r->U64();
        Open(slot, r->ReadElement(), number);
        CounterNesting nesting(InputsNesting());
        slot.iterator->Restore(r);
      }
      input_->Restore(r);
    }

   private:
    struct Slot {
      DatasetPtr dataset;  // outlives its iterator, which points into it
      std::unique_ptr<IteratorBase> iterator;
      // Parallel: `iterator` itself, which reads the input ahead.
      ReadAhead* ahead = nullptr;
      Element input;  // what made it, for the state
      uint64_t input_number = 0;
      // Parallel: the input's error met when this empty slot was refilled
      // early, thrown at its turn.
      std::exception_ptr pending;
    };

    // Where the inputs' stages count: under this stage, on as many
    // threads at once as read inputs (CounterNesting).
    CounterNesting::Frame InputsNesting() const {
      const int at_once =
          d_->parallel() ? static_cast<int>(std::min<int64_t>(
                               d_->options_.num_parallel_calls, slots_.size()))
                         : 1;
      return {ctx_, counter_, at_once * counter_->parallelism};
    }

    void Open(Slot& slot, Element input, uint64_t number) {
      slot.dataset = d_->fn_(input).base();
      CounterNesting nesting(InputsNesting());
      std::unique_ptr<IteratorBase> iterator =
          slot.dataset->MakeIterator(ctx_, MixSeed(salt_, number));
      if (d_->parallel()) {
        if (gate_) {
          iterator =
              std::make_unique<GatedIterator>(std::move(iterator), gate_.get());
        }
        const int64_t buffer = d_->options_.buffer_output_elements;
        auto ahead = std::make_unique<ReadAhead>(
            ctx_, std::move(iterator),
            buffer == kAutotune ? kAutotuneReadAheadElements
                                : static_cast<size_t>(buffer),
            buffer == kAutotune
                ? std::max<uint64_t>(kAutotunePrefetchBytes / slots_.size(), 1)
                : 0,
            signal_.get());
        slot.ahead = ahead.get();
        iterator = std::move(ahead);
        if (ahead_started_) slot.ahead->Start();
      }
      slot.iterator = std::move(iterator);
      slot.input = std::move(input);
      slot.input_number = number;
      ++open_;
    }
    // Parallel: opens the empty slots from the current turn on, in the
    // order the sequential loop will reach them, so that their reading
    // starts now.  Stops at a slot keeping an error (those after it wait,
    // as the sequential loop would give them the inputs after the error)
    // and at the end of the input.
    void FillEmptySlots() {
      for (size_t i = 0; i < slots_.size() && !end_of_input_; ++i) {
        Slot& slot = slots_[(cycle_ + i) % slots_.size()];
        if (slot.pending) return;
        if (slot.iterator) continue;
        try {
          Element e;
          if (!input_->GetNext(&e)) {
            end_of_input_ = true;
            return;
          }
          Open(slot, std::move(e), inputs_seen_++);
        } catch (const Cancelled&) {
          throw;
        } catch (...) {
          slot = Slot{};
          slot.pending = std::current_exception();
          return;
        }
      }
    }
    // Not deterministic, `turn` the open slot whose turn it is: waits
    // until it or another open input has a result.  false: `turn` has one
    // (the caller takes it in turn); true: *out is an element another
    // input had ready (or its error is thrown), from the next slot on;
    // the turns stay as they were.
    bool TakeOutOfTurn(Slot& turn, Element* out) {
      ReadySignal::Waiter waiter(signal_.get(), ctx_);
      while (true) {
        const uint64_t seen = signal_->count();
        if (turn.ahead->WhatIsReady() != ReadAhead::Readiness::kNothing) {
          return false;
        }
        for (size_t i = 1; i < slots_.size(); ++i) {
          Slot& slot = slots_[(cycle_ + i) % slots_.size()];
          if (slot.ahead &&
              slot.ahead->WhatIsReady() == ReadAhead::Readiness::kElement) {
            return TakeFrom(slot, out);
          }
        }
        if (ctx_->cancelled()) throw Cancelled();
        WaitScope wait(counter_);
        waiter.Wait(seen);
      }
    }
    // The slot's next element into *out.  Parallel: the element *out held
    // goes back to the input that gave it (ReadAhead::Retire), to be
    // freed on its reader's thread.
    bool TakeFrom(Slot& slot, Element* out) {
      if (!slot.ahead) {
        CounterNesting nesting(InputsNesting());
        return slot.iterator->GetNext(out);
      }
      Element next;
      if (!slot.ahead->GetNext(&next)) return false;
      if (last_ahead_) last_ahead_->Retire(std::move(*out));
      *out = std::move(next);
      last_ahead_ = slot.ahead;
      return true;
    }
    void AdvanceToNextInCycle() {
      block_index_ = 0;
      cycle_ = (cycle_ + 1) % slots_.size();
    }
    void AdvancePosition() {
      if (++block_index_ == d_->options_.block_length) AdvanceToNextInCycle();
    }

    const InterleaveDataset* d_;
    IteratorContext* ctx_;
    uint64_t salt_;
    std::unique_ptr<IteratorBase> input_;
    StageCounter* counter_;  // this stage's
    // Before slots_: destroyed after the iterators that use them.
    std::unique_ptr<CallGate> gate_;
    std::unique_ptr<ReadySignal> signal_;  // parallel, not deterministic
    uint64_t signal_wake_up_ = 0;
    std::vector<Slot> slots_;
    size_t cycle_ = 0;
    int64_t block_index_ = 0;
    bool end_of_input_ = false;
    uint64_t inputs_seen_ = 0;
    size_t open_ = 0;
    bool ahead_started_ = false;
    // Parallel: the input that gave the element last delivered.
    ReadAhead* last_ahead_ = nullptr;
  };

  InterleaveFn fn_;
  int64_t cycle_length_;
  InterleaveOptions options_;
  std::optional<InterleavedFiles> files_;
};

}  // namespace

DatasetPtr Interleave(DatasetPtr input, InterleaveFn fn, int64_t cycle_length,
                      InterleaveOptions options,
                      std::optional<InterleavedFiles> files) {
  return std::make_shared<InterleaveDataset>(std::move(input), std::move(fn),
                                             cycle_length, std::move(options),
                                             std::move(files));
}

}  // namespace recflow::pipeline::stages
