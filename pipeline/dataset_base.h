// What a pipeline stage implements: a DatasetBase (an immutable description
// of a stage and its inputs) makes IteratorBases (the running stage).  Users
// build pipelines with Dataset (dataset.h); this header is for writing
// stages.
//
// Contracts every stage keeps:
// - GetNext() returns true and fills *out, or false at the end (and keeps
//   returning false).  Errors are exceptions; after one, the stage goes on
//   with its next element where that makes sense (as tf.data does), so
//   that IgnoreErrors can skip it.
// - Save() writes the stage's position (and its input's) so that Restore()
//   on a fresh iterator of the same dataset continues the same stream.
//   Save and Restore are called from the consumer's thread, never at the
//   same time as GetNext().
// - Iterators are used by one thread at a time; asynchronous stages
//   (Prefetch, parallel Map) run their input on their own thread and their
//   work in the context's task arena.
#ifndef RECFLOW_PIPELINE_DATASET_BASE_H_
#define RECFLOW_PIPELINE_DATASET_BASE_H_

#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <typeindex>
#include <typeinfo>
#include <utility>
#include <vector>

#include "pipeline/state.h"
#include "pipeline/tensor.h"

namespace recflow::pipeline {

namespace stages {
struct FusableStage;  // stages.h
}

struct StageStats {
  std::string name;
  uint64_t elements = 0;        // elements the stage delivered
  uint64_t bytes = 0;           // their bytes
  double busy_seconds = 0;      // its own work, summed over its threads
  double wait_seconds = 0;      // time its consumer waited on an empty buffer
  int parallelism = 1;          // threads its work may use
  int64_t buffered = -1;        // asynchronous stages: elements held now
  uint64_t errors_ignored = 0;  // IgnoreErrors: elements skipped
  // Asynchronous stages: the consumer's takes that woke the stage's
  // sleeping driver, each a system call on the consumer's thread (with
  // IteratorOptions::prefetch_polls, a prefetch's takes wake it only when
  // they empty its buffer or its next look is more than half the takes'
  // interval away; a parallel map's driver that filled its buffer is
  // woken by the take that leaves half of it).
  uint64_t wakes = 0;
};

// One stage's counters; updated from any thread.
struct StageCounter {
  std::string name;
  int parallelism = 1;
  std::atomic<uint64_t> elements{0};
  std::atomic<uint64_t> bytes{0};
  // Time in the stage clock's ticks (StageTicks()); Stats() gives seconds.
  std::atomic<uint64_t> busy_ticks{0};
  std::atomic<uint64_t> wait_ticks{0};
  std::atomic<int64_t> buffered{-1};
  std::atomic<uint64_t> errors_ignored{0};
  std::atomic<uint64_t> wakes{0};
};

class IteratorContext;

// The stages of the datasets an Interleave makes, one per input element
// (tf.data's interleave and flat_map), are counted per name under it: one
// row "interleave:NAME/STAGE" for all its inputs, not one per dataset
// made.  While a CounterNesting is alive on a thread,
// IteratorContext::Counter there (for that context) gives the counter of
// (parent, name), named "<parent's name>/<name>", its parallelism the
// stage's times `at_once` (the threads the parent's inputs run on at
// once).  Threads that run those stages for the interleave enter the
// nesting they were made under (Current()): its readers, an async stage's
// driver, a fused stage's planner task.
class CounterNesting {
 public:
  struct Frame {
    const IteratorContext* ctx = nullptr;  // null: not nested
    StageCounter* parent = nullptr;
    int at_once = 1;
  };
  explicit CounterNesting(Frame frame);
  ~CounterNesting();
  CounterNesting(const CounterNesting&) = delete;
  CounterNesting& operator=(const CounterNesting&) = delete;
  // This thread's nesting now.
  static Frame Current();

 private:
  Frame previous_;
};

struct IteratorOptions {
  // Threads of the task arena that runs parallel stages; 0 = all cores.
  // A fused Parse whose planner runs on the consumer's thread counts that
  // thread among them where they would take every core (its tasks then
  // get one worker fewer; pipeline/README.md).
  int threads = 0;
  // Runs Parse(Batch(Shuffle/Repeat/Take/Skip/Shard...(FromTFRecords or
  // FromTFRecordsGlobalShuffle))), or over a SampleFromDatasets or
  // ChooseFromDatasets of such chains, as one fused stage
  // (tf.data's map_and_batch fusion; pipeline/README.md): the same
  // elements, order and errors, with reading, checksums and parsing on
  // every thread.  false: every stage as written, for comparison.
  bool optimize = true;
  // Host memory (kHost or kPinnedHost; e.g. the pinned memory a GPU
  // backend copies input from without staging it, Backend::InputMemory)
  // that every element the Iterator delivers has its tensors in: each is
  // copied there (Tensor::CopyInto: ragged tensors and bytes of mixed
  // lengths stay where they are).  When the last stage has a thread of its
  // own (Prefetch, a parallel Map) the copy is made there, so that the
  // consumer's thread does not pay it; otherwise in Iterator::Next.
  // Null: elements stay where the stages made them.  Device memory is
  // refused (Error) when the Iterator is made.
  std::shared_ptr<Allocator> output_memory = nullptr;
  // Called once on every element the Iterator delivers, in delivery order,
  // before Next() returns it (after the copy into output_memory): on the
  // last stage's own thread where it has one that makes elements in order
  // (Prefetch's driver, as soon as each element is made, so that work
  // started there overlaps the consumer's), otherwise in Iterator::Next.
  // Elements made ahead and never delivered (buffered when the Iterator is
  // destroyed) may have been passed too.  An exception it throws is thrown
  // by the Next() of that element.  It must be safe to call on another
  // thread than the consumer's, while the consumer runs.  The GPU backend's
  // use: start each batch's copy to the device there (TF's
  // prefetch_to_device; train::Backend::InputStager).  Null: nothing.
  std::function<void(const Element&)> prepare = nullptr;
  // A Prefetch whose buffer is full looks for room on a timer (half the
  // consumer's interval between takes) instead of being woken by the
  // consumer's take, which then makes no system call unless it empties
  // the buffer: for a consumer whose own thread is the bottleneck on a
  // machine with cores to spare (a GPU's training thread, which the
  // Estimator sets it for).  false: woken by each take, so that the
  // driver's work comes while the consumer takes, not in the middle of
  // its work (on a machine whose cores the consumer's work fills, a timer
  // firing mid-step preempts it; pipeline/README.md).
  bool prefetch_polls = false;
};

// Shared by all stages of one Iterator: the task arena, statistics,
// caches, and cancellation.  Thread-safe.
class BlockSlabKeeper;  // block_arena.h
class DatasetBase;

class IteratorContext {
 public:
  explicit IteratorContext(const IteratorOptions& options);
  ~IteratorContext();

  int threads() const { return threads_; }
  bool optimize() const { return optimize_; }
  bool prefetch_polls() const { return prefetch_polls_; }
  // The seed of stages given none: random per Iterator, kept in its state.
  uint64_t seed() const { return seed_; }
  void set_seed(uint64_t seed) { seed_ = seed; }
  tbb::task_arena& arena() { return *arena_; }

  // The counter of the stage `key` (a dataset), made on first use; the
  // pointer stays valid as long as the context.  Under a CounterNesting
  // of this context: the counter of (its parent, name) instead.
  StageCounter* Counter(const void* key, std::string_view name,
                        int parallelism = 1);
  std::vector<StageStats> Stats() const;

  // Cancellation: set when the Iterator is destroyed.  Stages that block
  // register a wake-up so that their waits end promptly.
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  void Cancel();
  using WakeUp = std::function<void()>;
  uint64_t AddWakeUp(WakeUp fn);
  void RemoveWakeUp(uint64_t id);

  // State of type T shared by the iterators one dataset (`key`) makes over
  // its epochs (the memory cache, the shuffle's slot pool); made with
  // std::make_shared<T>() on first use.  Keyed by (key, T), so a slot is
  // only ever handed out as the type it was made as.  A dataset's state
  // is its own, never another's made at the address of one destroyed
  // (Interleave makes and frees one per input): for a dataset owned by a
  // shared_ptr (as every Dataset is), the state of a destroyed one is
  // dropped when the next state is made (its users hold their own
  // references).
  template <typename T>
  std::shared_ptr<T> Shared(const DatasetBase* key) {
    return std::static_pointer_cast<T>(SharedSlot(
        key, std::type_index(typeid(T)),
        [] { return std::static_pointer_cast<void>(std::make_shared<T>()); }));
  }

 private:
  std::shared_ptr<void> SharedSlot(
      const DatasetBase* key, std::type_index type,
      const std::function<std::shared_ptr<void>()>& make);
  struct SharedEntry {
    std::weak_ptr<const DatasetBase> owner;  // empty: not owned by one
    std::shared_ptr<void> state;
  };

  // First, so destroyed last: the read blocks' empty slabs stay mapped
  // while the iterator lives (block_arena.h), from epoch to epoch.
  std::unique_ptr<BlockSlabKeeper> keep_slabs_;
  int threads_;
  bool optimize_;
  bool prefetch_polls_;
  uint64_t seed_;
  std::unique_ptr<tbb::task_arena> arena_;
  mutable std::mutex mu_;
  std::vector<const StageCounter*> order_;  // Stats()'s
  std::map<const void*, std::unique_ptr<StageCounter>> counters_;
  std::map<std::pair<const StageCounter*, std::string>,
           std::unique_ptr<StageCounter>>
      nested_counters_;
  std::map<uint64_t, WakeUp> wake_ups_;
  uint64_t next_wake_up_ = 0;
  std::map<std::pair<const DatasetBase*, std::type_index>, SharedEntry> shared_;
  std::atomic<bool> cancelled_{false};
};

// Thrown by a blocked stage when its iterator is being destroyed.
class Cancelled : public Error {
 public:
  Cancelled() : Error("the iterator was destroyed") {}
};

class IteratorBase {
 public:
  virtual ~IteratorBase() = default;
  virtual bool GetNext(Element* out) = 0;
  virtual void Save(StateWriter* w) = 0;
  virtual void Restore(StateReader* r) = 0;
  // Asks the iterator to deliver every element, including those a later
  // Restore() puts back, with its tensors copied into `memory`
  // (IteratorOptions::output_memory; Element::CopyInto), where that is
  // cheaper than on the consumer's thread: on threads of its own, or
  // where the values are still in a cache.  false (the default): it does
  // not, and the caller copies.  Called once, before the first GetNext.
  virtual bool DeliverIn(std::shared_ptr<Allocator> memory) {
    (void)memory;
    return false;
  }
  // Asks the iterator to call `fn` (IteratorOptions::prepare) on every
  // element it will deliver, including those a later Restore() puts back,
  // in delivery order, on a thread of its own as soon as each is made.
  // false (the default): it does not, and the caller calls it.  Called
  // once, before the first GetNext.
  virtual bool PrepareWith(std::function<void(const Element&)> fn) {
    (void)fn;
    return false;
  }
  // Whether the iterator has read all of its input and only hands out
  // what it holds (a shuffle's buffer draining): GetNext reads nothing.
  virtual bool Draining() const { return false; }
  // Before the first GetNext: reads up to `n` of the elements its first
  // GetNext calls would read into its own buffer (a shuffle's), handing
  // out none.  Work moved earlier, nothing else: the same elements in the
  // same order, the same state once those calls have run, and an error
  // it meets is thrown by the GetNext that would have met it.  Repeat
  // calls it on the next epoch's iterator while the current one drains.
  // Iterators without such a buffer do nothing (the default).
  virtual void FillAhead(size_t n) { (void)n; }
};

// DatasetBase::Cardinality's answers besides a count (tf.data's
// INFINITE_CARDINALITY and UNKNOWN_CARDINALITY).
inline constexpr int64_t kInfiniteCardinality = -1;
inline constexpr int64_t kUnknownCardinality = -2;

class DatasetBase : public std::enable_shared_from_this<DatasetBase> {
 public:
  virtual ~DatasetBase() = default;

  // The elements one iteration gives, where that is known without running
  // it (tf.data's cardinality, by its rules): a count, kInfiniteCardinality
  // or kUnknownCardinality (the default: filters, files, generators).
  virtual int64_t Cardinality() const { return kUnknownCardinality; }

  // An iterator over this dataset whose GetNext time and output are
  // counted under this stage.  `salt` tells apart the iterators made for
  // successive epochs (Repeat gives each its own), so stages that reshuffle
  // each iteration derive their seeds from it.
  std::unique_ptr<IteratorBase> MakeIterator(IteratorContext* ctx,
                                             uint64_t salt) const;
  // The stage's own iterator, which MakeIterator counts (each stage makes
  // its own; callers use MakeIterator).
  virtual std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const = 0;

  // A one-line description of the whole chain ending here, such as
  // "TFRecord(2 files).Shuffle(1000, seed=7).Batch(32)": the fingerprint a
  // saved state is checked against.
  virtual std::string Describe() const = 0;
  // The stage's name in statistics ("shuffle", "map:normalise").
  virtual std::string StageName() const = 0;
  // Threads the stage's work may use (for busy %).
  virtual int Parallelism(const IteratorContext&) const { return 1; }
  // Stages the fused batch-parse path can take over describe themselves
  // (internal: stages.h); the others return false.
  virtual bool DescribeForFusion(stages::FusableStage*) const { return false; }
  // Sources that can shard by files (Dataset::Shard reads whole files per
  // shard, as tf.data's auto-sharding by file) return the source of their
  // files index, index + num_shards, ...; the others, and a source with
  // fewer files than shards, return nullptr (sharded by element instead).
  virtual std::shared_ptr<const DatasetBase> ShardByFiles(
      int64_t /*num_shards*/, int64_t /*index*/) const {
    return nullptr;
  }
};

using DatasetPtr = std::shared_ptr<const DatasetBase>;

// The stage clock: cheap (the time stamp counter where there is one), in
// ticks of a rate that IteratorContext::Stats() measures.
uint64_t StageTicks();

// Work of `counter`'s stage: the time between construction and
// destruction goes to `counter->busy_ticks`, and not to the scope it is
// nested in on this thread (whose clock stops meanwhile).  Every GetNext
// runs in one for its stage; a stage that works for others (a fused stage
// reading or planning for the stages it replaced, on any thread) opens
// theirs, so each stage's busy time is its own work exactly once.
class BusyScope {
 public:
  explicit BusyScope(StageCounter* counter);
  ~BusyScope();
  BusyScope(const BusyScope&) = delete;
  BusyScope& operator=(const BusyScope&) = delete;

 private:
  friend class WaitScope;
  StageCounter* counter_;
  uint64_t resumed_;  // the stage clock's reading (dataset.cc)
  BusyScope* parent_;
};

// A blocking wait that does not count as its stage's work: the time
// between construction and destruction goes to `counter->wait_ticks` instead
// of the busy time of the stage running on this thread.
class WaitScope {
 public:
  explicit WaitScope(StageCounter* counter);
  ~WaitScope();
  WaitScope(const WaitScope&) = delete;
  WaitScope& operator=(const WaitScope&) = delete;

 private:
  StageCounter* counter_;
  uint64_t start_;  // the stage clock's reading (dataset.cc)
};

// The machine's cores (at least 1): an iterator's threads by default, and
// what kAutotune reads and interleaves at once.
inline int MachineCores() {
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// Mixes two 64-bit values into one (SplitMix64 finaliser); for seeds.
// Inline: the shuffles draw with it once or twice per record.
inline uint64_t MixSeed(uint64_t a, uint64_t b) {
  uint64_t z = a + 0x9e3779b97f4a7c15ULL * (b + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
// FNV-1a of `s`: stable across processes and builds.
uint64_t Fingerprint(std::string_view s);

// The seed an iterator of `stage` made with `salt` draws with: `seed` when
// given, else the iterator's random seed told apart per stage (by its
// description); mixed with the salt when `each_epoch`, so that each epoch
// under Repeat draws afresh.  The shuffles, the samplers and Random.
inline uint64_t StageSeed(const DatasetBase& stage,
                          const std::optional<uint64_t>& seed,
                          const IteratorContext& ctx, uint64_t salt,
                          bool each_epoch) {
  const uint64_t base =
      seed ? *seed : MixSeed(ctx.seed(), Fingerprint(stage.Describe()));
  return each_epoch ? MixSeed(base, salt) : base;
}

// A small seeded generator whose whole state is one integer, so that it
// goes into iterator states as is (SplitMix64).
class Rng {
 public:
  explicit Rng(uint64_t seed = 0) : state_(seed) {}
  uint64_t Next() { return MixSeed(state_++, 0x5851f42d4c957f2dULL); }
  // Uniform in [0, n), n > 0.
  uint64_t Below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(Next()) * n) >>
                                 64);
  }
  // What Below(n) will return `ahead` draws from now (0: the next one),
  // without drawing.
  uint64_t PeekBelow(uint64_t n, uint64_t ahead) const {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(MixSeed(
                                      state_ + ahead, 0x5851f42d4c957f2dULL)) *
                                  n) >>
                                 64);
  }
  uint64_t state() const { return state_; }
  void set_state(uint64_t s) { state_ = s; }

 private:
  uint64_t state_;
};

}  // namespace recflow::pipeline

#endif  // RECFLOW_PIPELINE_DATASET_BASE_H_
