// The engine of Prefetch and parallel Map: a driver thread pulls the input
// ahead of the consumer into an ordered, bounded buffer; with a function,
// each pulled element is transformed by a oneTBB flow graph node of
// concurrency `parallel_calls` in the iterator's task arena.
//
//   driver thread:  input.GetNext ──▶ slot (in input order) ──▶ map node
//   flow graph:     map node (parallel_calls at once) ──▶ slot ready
//   consumer:       GetNext takes the first slot (deterministic) or the
//                   first ready one, and frees room for the driver
//
// Bounds: at most `max_elements` slots exist at once (pulled and not yet
// taken), and the driver stops pulling while their bytes exceed
// `max_bytes` (0: no byte bound); so memory stays bounded and a slow
// consumer stops the driver (back-pressure).  A map's driver that found
// its buffer full pulls again once half of it is taken.  Graph tasks
// never block.
//
// Errors travel in their slot and are thrown to the consumer at that
// element's place in the order.  As the last stage of an Iterator with
// IteratorOptions::output_memory, it copies each element there on its
// own threads (DeliverIn), so that the consumer's thread does not.  Save()
// pauses the driver, waits for the graph to finish its tasks, and writes the
// buffered results followed by the input's state.
#ifndef RECFLOW_PIPELINE_ASYNC_ITERATOR_H_
#define RECFLOW_PIPELINE_ASYNC_ITERATOR_H_

#include <tbb/flow_graph.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "pipeline/dataset.h"

namespace recflow::pipeline {

// A prefetch driver's timer (IteratorOptions::prefetch_polls), as
// functions of what the driver knows: how long its next look for room
// waits, half the interval between the consumer's takes (clamped to
// 10 us-1 ms; 100 us while no interval is known), doubled for each idle
// look in a row before it (at most 100 ms); and whether a look was idle:
// fewer than two takes so far, or none for two intervals.  (A look that
// merely saw no take is not idle: at half the interval every other look
// sees none, and waits doubled on that outlasted half an interval, so
// that every other take had to wake the driver.)
std::chrono::nanoseconds PrefetchLookWait(int64_t pop_interval_ns,
                                          int idle_looks);
bool PrefetchConsumerIdle(uint64_t pops, int64_t pop_interval_ns,
                          std::chrono::nanoseconds since_last_pop);

class AsyncIterator final : public IteratorBase {
 public:
  struct Config {
    std::string stage;  // the name in states
    size_t max_elements = 1;
    uint64_t max_bytes = 0;
    // Autotuned buffer (Prefetch(kAutotune)): the limit starts at one
    // element and doubles, up to max_elements, each time the consumer
    // finds the buffer empty after the driver had filled it to the limit:
    // the producer is bursty and a deeper buffer would have hidden the
    // burst (tf.data's PrefetchAutotuner).  A steady producer slower than
    // the consumer never fills it, so it stays small.
    bool autotune = false;
    MapFn fn;  // null: prefetch only
    int parallel_calls = 1;
    bool deterministic = true;
  };
  AsyncIterator(IteratorContext* ctx, std::unique_ptr<IteratorBase> input,
                StageCounter* counter, Config config);
  ~AsyncIterator() override;

  bool GetNext(Element* out) override;
  void Save(StateWriter* w) override;
  void Restore(StateReader* r) override;
  // A map copies each result in its task; a prefetch asks its input to
  // deliver in `memory` (a fused batch-parse copies each batch in its
  // parse task, while the values are in cache), else copies on the driver
  // thread.
  bool DeliverIn(std::shared_ptr<Allocator> memory) override;
  // A prefetch calls `fn` on its driver thread on each element as it is
  // pulled, before buffering it (and on the elements Restore() puts back,
  // there); a map does not (its results are made on many threads, out of
  // order).
  bool PrepareWith(std::function<void(const Element&)> fn) override;

 private:
  struct Slot {
    Element element;
    std::exception_ptr error;
    bool end = false;
    bool ready = false;
    size_t bytes = 0;
    AsyncIterator* owner = nullptr;
    // Set (release) by the driver before it hands the slot to the graph,
    // read (acquire) first by the node's body: oneTBB orders the two, but
    // inside libtbb.so, where ThreadSanitizer cannot see it; this pair
    // states the hand-off of the slot (and of the iterator it points to) in
    // a form TSan checks.
    std::atomic<bool> submitted{false};
  };

  void Start();
  void DriverLoop();
  void RunTask(Slot* slot);
  bool HasRoom() const;
  // Under mu_: whether the driver has an element to pull and room for it:
  // HasRoom(), and for a map's driver that found its buffer full, at most
  // resume_at_ slots left.
  bool DriverMayPull() const;
  // Under mu_, the driver of a full prefetch buffer: waits until `ready`
  // or about half a take's interval has passed (longer, doubling, after
  // each look that found no take since: an idle consumer; at most
  // 100 ms, and a take wakes a driver that would look later than it needs).
  template <typename Ready>
  void WaitForRoom(std::unique_lock<std::mutex>& lock, Ready ready);
  // The driver's next slot: one the consumer gave back (RecycledSlot
  // destroys the elements they hold first), or a new one.
  std::unique_ptr<Slot> RecycledSlot();
  // The slot GetNext should take, or end() when none is ready.
  std::deque<std::unique_ptr<Slot>>::iterator Takeable();

  IteratorContext* ctx_;
  const CounterNesting::Frame nesting_;  // where it was made
  std::unique_ptr<IteratorBase> input_;
  StageCounter* counter_;
  const Config config_;
  // Guarded by mu_: the buffer's current limit (config_.max_elements
  // unless autotuned), and whether the buffer reached it since it last
  // grew.
  size_t limit_;
  bool filled_ = false;
  const bool polls_;  // a prefetch, IteratorOptions::prefetch_polls
  uint64_t wake_up_id_;
  // Set before the driver starts (DeliverIn); read-only after.
  std::shared_ptr<Allocator> output_memory_;
  bool input_delivers_ = false;  // input_ copies into output_memory_
  std::function<void(const Element&)> prepare_;  // PrepareWith's

  std::mutex mu_;
  std::condition_variable consumer_cv_;
  std::condition_variable driver_cv_;
  std::deque<std::unique_ptr<Slot>> slots_;
  // Slots taken, each holding the element the take replaced in the
  // consumer's *out (guarded by mu_); the driver's own once it swapped
  // them out (driver_retired_), and its slots to use again.
  std::vector<std::unique_ptr<Slot>> retired_;
  std::vector<std::unique_ptr<Slot>> driver_retired_;
  std::vector<std::unique_ptr<Slot>> spare_slots_;
  uint64_t bytes_ = 0;
  int in_flight_ = 0;  // slots in the graph
  // Guarded by mu_: a map's driver that found its buffer full pulls again
  // once at most this many slots are left (half the buffer: each take
  // would otherwise wake it to pull one element, a system call on the
  // consumer's thread and a hand-over per element); SIZE_MAX otherwise.
  size_t resume_at_ = SIZE_MAX;
  // Guarded by mu_: a take woke the map's sleeping driver, which has not
  // run since (it clears this each time it wakes); later takes leave it.
  bool driver_notified_ = false;
  // The consumer waits on consumer_cv_ (GetNext or Save): a finished task
  // notifies it only then, and only when the wait can end.
  bool consumer_waiting_ = false;
  bool in_input_ = false;  // the driver is inside input_->GetNext
  bool input_end_ = false;
  bool stop_ = false;
  bool pause_ = false;
  bool paused_ = false;
  bool started_ = false;
  // A prefetch's driver waits for room on a timer (driver_polls_, until
  // poll_until_), every half of the interval between the consumer's takes
  // (pop_interval_ns_, averaged): a take that leaves an element buffered
  // then need not wake it, a system call (on a VM, an interrupt to the
  // driver's idle core) on the thread that trains.  All guarded by mu_.
  bool driver_polls_ = false;
  // The driver waits on driver_cv_ (timed or not): a take that notifies it
  // then makes a system call (counted in StageCounter::wakes).
  bool driver_asleep_ = false;
  std::chrono::steady_clock::time_point poll_until_{};
  std::chrono::steady_clock::time_point last_pop_{};
  uint64_t pops_ = 0;
  int64_t pop_interval_ns_ = 0;
  std::thread driver_;

  std::unique_ptr<tbb::flow::graph> graph_;
  std::unique_ptr<tbb::flow::function_node<Slot*, tbb::flow::continue_msg>>
      node_;
};

}  // namespace recflow::pipeline

#endif  // RECFLOW_PIPELINE_ASYNC_ITERATOR_H_
