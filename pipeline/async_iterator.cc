#include "pipeline/async_iterator.h"

#include <fmt/format.h>
#include <sys/prctl.h>

#include <algorithm>
#include <chrono>

namespace recflow::pipeline {

AsyncIterator::AsyncIterator(IteratorContext* ctx,
                             std::unique_ptr<IteratorBase> input,
                             StageCounter* counter, Config config)
    : ctx_(ctx),
      nesting_(CounterNesting::Current()),
      input_(std::move(input)),
      counter_(counter),
      config_(std::move(config)),
      limit_(config_.autotune ? 1 : config_.max_elements),
      polls_(!config_.fn && ctx_->prefetch_polls()) {
  wake_up_id_ = ctx_->AddWakeUp([this] {
    std::lock_guard<std::mutex> lock(mu_);
    consumer_cv_.notify_all();
    driver_cv_.notify_all();
  });
  if (config_.fn) {
    ctx_->arena().execute([this] {
      graph_ = std::make_unique<tbb::flow::graph>();
      node_ = std::make_unique<
          tbb::flow::function_node<Slot*, tbb::flow::continue_msg>>(
          *graph_, static_cast<size_t>(config_.parallel_calls),
          // No capture: the body reaches the iterator through the slot,
          // after the acquire that orders the hand-off (Slot::submitted).
          [](Slot* slot) {
            slot->submitted.load(std::memory_order_acquire);
            slot->owner->RunTask(slot);
            return tbb::flow::continue_msg();
          });
    });
  }
  counter_->buffered.store(0);
}

AsyncIterator::~AsyncIterator() {
  ctx_->RemoveWakeUp(wake_up_id_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  driver_cv_.notify_all();
  if (driver_.joinable()) driver_.join();
  if (graph_) graph_->wait_for_all();
  // Every task's last touch of a slot is under mu_: taking it once more
  // orders those before the slots are freed, in a way ThreadSanitizer sees
  // (wait_for_all() orders them too, inside libtbb.so).
  std::lock_guard<std::mutex> lock(mu_);
}

void AsyncIterator::Start() {
  started_ = true;
  driver_ = std::thread([this] {
    // Its timed waits for room (WaitForRoom) end when they say, not up to
    // the default 50 us later: half a take's interval may be 50 us.
    if (polls_) prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
    CounterNesting nesting(nesting_);  // the input's, where it was made
    DriverLoop();
  });
}

bool AsyncIterator::HasRoom() const {
  if (slots_.size() >= limit_) return false;
  return config_.max_bytes == 0 || slots_.empty() || bytes_ < config_.max_bytes;
}

bool AsyncIterator::DriverMayPull() const {
  return !input_end_ && HasRoom() && slots_.size() <= resume_at_;
}

std::chrono::nanoseconds PrefetchLookWait(int64_t pop_interval_ns,
                                          int idle_looks) {
  using std::chrono::microseconds;
  using std::chrono::nanoseconds;
  const nanoseconds half = pop_interval_ns > 0
                               ? nanoseconds(pop_interval_ns / 2)
                               : nanoseconds(microseconds(100));
  return std::min<nanoseconds>(
      std::clamp<nanoseconds>(half, microseconds(10), microseconds(1000)) *
          (int64_t{1} << std::min(idle_looks, 7)),
      microseconds(100000));
}

bool PrefetchConsumerIdle(uint64_t pops, int64_t pop_interval_ns,
                          std::chrono::nanoseconds since_last_pop) {
  return pops < 2 ||
         since_last_pop > 2 * std::chrono::nanoseconds(pop_interval_ns);
}

template <typename Ready>
void AsyncIterator::WaitForRoom(std::unique_lock<std::mutex>& lock,
                                Ready ready) {
  int idle_looks = 0;
  while (!ready()) {
    const std::chrono::nanoseconds wait =
        PrefetchLookWait(pop_interval_ns_, idle_looks);
    driver_polls_ = true;
    driver_asleep_ = true;
    poll_until_ = std::chrono::steady_clock::now() + wait;
    driver_cv_.wait_for(lock, wait, ready);
    driver_polls_ = false;
    driver_asleep_ = false;
    // (Idle looks counted by whether a look saw no take had every other
    // take wake the driver at 130-400 us between takes: a system call on
    // the training thread, 4.6-7.9 us a take on the 2-vCPU VM against
    // 0.5-1.9 now; pipeline_bench's PrefetchPop.)
    const bool idle = PrefetchConsumerIdle(
        pops_, pop_interval_ns_, std::chrono::steady_clock::now() - last_pop_);
    idle_looks = idle ? idle_looks + 1 : 0;
  }
}

void AsyncIterator::DriverLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  const auto ready = [this] { return stop_ || pause_ || DriverMayPull(); };
  while (true) {
    // A full prefetch buffer (no map: a map's tasks keep being handed out
    // as results are taken) is looked at on a timer where the Iterator
    // asks for it (IteratorOptions::prefetch_polls); else woken.
    if (polls_ && !input_end_ && !ready()) WaitForRoom(lock, ready);
    // A map's full buffer is filled again once half of it is taken.
    if (config_.fn && !input_end_ && slots_.size() >= limit_) {
      resume_at_ = limit_ / 2;
    }
    driver_asleep_ = true;
    while (!ready()) {
      driver_cv_.wait(lock);
      driver_notified_ = false;
    }
    driver_asleep_ = false;
    resume_at_ = SIZE_MAX;
    if (stop_) return;
    if (pause_) {
      paused_ = true;
      consumer_cv_.notify_all();
      driver_cv_.wait(lock, [this] { return stop_ || !pause_; });
      paused_ = false;
      continue;
    }
    driver_retired_.swap(retired_);
    in_input_ = true;
    lock.unlock();
    std::unique_ptr<Slot> slot = RecycledSlot();
    slot->owner = this;
    bool got = false;
    try {
      got = input_->GetNext(&slot->element);
      // A map copies in its task; a prefetch here, off the consumer's
      // thread, unless its input delivers there.
      if (got && output_memory_ && !config_.fn && !input_delivers_) {
        const uint64_t start = StageTicks();
        slot->element.CopyInto(output_memory_);
        counter_->busy_ticks += StageTicks() - start;
      }
      if (got && prepare_) {
        const uint64_t start = StageTicks();
        prepare_(slot->element);
        counter_->busy_ticks += StageTicks() - start;
      }
    } catch (...) {
      slot->error = std::current_exception();
    }
    lock.lock();
    in_input_ = false;
    if (slot->error || !got) {
      slot->end = !slot->error;
      input_end_ = slot->end;
      slot->ready = true;
    } else {
      slot->bytes = slot->element.byte_size();
      slot->ready = !config_.fn;
    }
    Slot* raw = slot.get();
    bytes_ += raw->bytes;
    slots_.push_back(std::move(slot));
    if (slots_.size() >= limit_) filled_ = true;
    counter_->buffered.store(static_cast<int64_t>(slots_.size()),
                             std::memory_order_relaxed);
    if (!raw->ready) {
      ++in_flight_;
      raw->submitted.store(true, std::memory_order_release);
      node_->try_put(raw);
    } else {
      consumer_cv_.notify_all();
    }
  }
}

void AsyncIterator::RunTask(Slot* slot) {
  const uint64_t start = StageTicks();
  Element result;
  std::exception_ptr error;
  try {
    result = config_.fn(std::move(slot->element));
    if (output_memory_) result.CopyInto(output_memory_);
  } catch (...) {
    error = std::current_exception();
  }
  counter_->busy_ticks += StageTicks() - start;
  const size_t bytes = error ? 0 : result.byte_size();
  std::lock_guard<std::mutex> lock(mu_);
  slot->element = std::move(result);
  slot->error = std::move(error);  // no reference left here after the lock
  bytes_ = bytes_ - slot->bytes + bytes;
  slot->bytes = bytes;
  slot->ready = true;
  --in_flight_;
  // Only a consumer that can go on is woken: GetNext's once a result it
  // may take is there (in order: the first), Save's once no task is left.
  if (consumer_waiting_ && (in_flight_ == 0 || Takeable() != slots_.end())) {
    consumer_cv_.notify_all();
  }
}

std::unique_ptr<AsyncIterator::Slot> AsyncIterator::RecycledSlot() {
  // The elements the consumer's takes replaced go here, on the thread
  // that made them (their memory back to this thread's malloc cache, not
  // another thread's arena), and their slots are used again.
  for (std::unique_ptr<Slot>& slot : driver_retired_) {
    slot->element = Element{};
    slot->error = nullptr;
    slot->end = false;
    slot->ready = false;
    slot->bytes = 0;
    slot->submitted.store(false, std::memory_order_relaxed);
    spare_slots_.push_back(std::move(slot));
  }
  driver_retired_.clear();
  if (spare_slots_.empty()) return std::make_unique<Slot>();
  std::unique_ptr<Slot> slot = std::move(spare_slots_.back());
  spare_slots_.pop_back();
  return slot;
}

std::deque<std::unique_ptr<AsyncIterator::Slot>>::iterator
AsyncIterator::Takeable() {
  if (slots_.empty()) return slots_.end();
  if (config_.deterministic || !config_.fn) {
    return slots_.front()->ready ? slots_.begin() : slots_.end();
  }
  // Any finished result; the end only once everything before it is taken.
  for (auto it = slots_.begin(); it != slots_.end(); ++it) {
    if ((*it)->ready && !(*it)->end) return it;
  }
  return slots_.front()->end ? slots_.begin() : slots_.end();
}

bool AsyncIterator::GetNext(Element* out) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!started_) Start();
  auto it = Takeable();
  if (it == slots_.end()) {
    if (config_.autotune && filled_ && limit_ < config_.max_elements) {
      limit_ = std::min(limit_ * 2, config_.max_elements);
      filled_ = false;
      driver_cv_.notify_all();
    }
    WaitScope wait(counter_);
    consumer_waiting_ = true;
    consumer_cv_.wait(lock, [&] {
      it = Takeable();
      return it != slots_.end() || ctx_->cancelled();
    });
    consumer_waiting_ = false;
  }
  if (it == slots_.end()) throw Cancelled();
  Slot& slot = **it;
  if (slot.end) return false;  // stays, so that later calls end too
  std::unique_ptr<Slot> taken = std::move(*it);
  slots_.erase(it);
  bytes_ -= taken->bytes;
  counter_->buffered.store(static_cast<int64_t>(slots_.size()),
                           std::memory_order_relaxed);
  // A map's driver waits for half its buffer to be taken (DriverLoop):
  // the takes before do not wake it, a system call each, and neither do
  // those after one that did, until it has run.
  bool wake =
      !config_.fn || (driver_asleep_ && !driver_notified_ && DriverMayPull());
  if (config_.fn && wake) driver_notified_ = true;
  if (polls_) {
    const auto now = std::chrono::steady_clock::now();
    if (pops_++ > 0) {
      const int64_t interval =
          std::chrono::duration_cast<std::chrono::nanoseconds>(now - last_pop_)
              .count();
      pop_interval_ns_ =
          pop_interval_ns_ == 0
              ? interval
              : pop_interval_ns_ + (interval - pop_interval_ns_) / 8;
    }
    last_pop_ = now;
    // A driver on its timer that looks again within half a take's
    // interval refills the buffer before the next take needs it: not
    // woken, unless this take emptied the buffer.
    wake = !driver_polls_ || slots_.empty() ||
           poll_until_ - now > std::chrono::nanoseconds(pop_interval_ns_ / 2);
  }
  if (wake && driver_asleep_) {
    counter_->wakes.fetch_add(1, std::memory_order_relaxed);
  }
  // The element *out held goes back to the driver with its slot, which
  // destroys it (RecycledSlot) where a take would have paid the frees of
  // a batch made on another thread; unless the driver runs no more.
  std::exception_ptr error = std::move(taken->error);
  const bool retire = !input_end_ && !stop_;
  if (retire) {
    if (!error) std::swap(*out, taken->element);
    retired_.push_back(std::move(taken));
  }
  lock.unlock();
  // After unlocking: a driver woken under the lock would only block on it.
  if (wake) driver_cv_.notify_all();
  if (error) std::rethrow_exception(error);
  if (!retire) *out = std::move(taken->element);
  return true;
}

void AsyncIterator::Save(StateWriter* w) {
  std::unique_lock<std::mutex> lock(mu_);
  if (started_) {
    pause_ = true;
    driver_cv_.notify_all();
    consumer_waiting_ = true;
    consumer_cv_.wait(lock, [this] {
      return (paused_ || stop_) && !in_input_ && in_flight_ == 0;
    });
    consumer_waiting_ = false;
  }
  w->BeginStage(config_.stage);
  w->Bool(input_end_);
  w->U64(slots_.size());
  for (const auto& slot : slots_) {
    WriteResult(w, slot->end, slot->error, slot->element);
  }
  // The driver is paused outside input_, so the input can be saved, and
  // without the lock: saving may create iterators, which takes the
  // context's lock (never taken while holding a stage's).
  lock.unlock();
  input_->Save(w);
  lock.lock();
  pause_ = false;
  driver_cv_.notify_all();
}

// Before the driver starts (as Restore and DeliverIn).
bool AsyncIterator::PrepareWith(std::function<void(const Element&)> fn) {
  if (started_) throw Error("PrepareWith: the stage is already running");
  if (config_.fn) return false;
  std::lock_guard<std::mutex> lock(mu_);
  prepare_ = std::move(fn);
  return true;
}

// Before the driver starts (as Restore), on the consumer's thread; the
// input is asked without holding mu_, so that no lock of this stage is
// held while the stages below take theirs.
bool AsyncIterator::DeliverIn(std::shared_ptr<Allocator> memory) {
  if (started_) throw Error("DeliverIn: the stage is already running");
  const bool input_delivers = !config_.fn && input_->DeliverIn(memory);
  std::lock_guard<std::mutex> lock(mu_);
  input_delivers_ = input_delivers;
  output_memory_ = std::move(memory);
  return true;
}

// Before the driver starts, so nothing else touches the buffer.
void AsyncIterator::Restore(StateReader* r) {
  if (started_) throw Error("cannot restore a running asynchronous stage");
  r->BeginStage(config_.stage);
  slots_.clear();
  bytes_ = 0;
  input_end_ =
      ReadResults(r, config_.max_elements,
                  [this](bool end, std::exception_ptr error, Element element) {
                    auto slot = std::make_unique<Slot>();
                    slot->ready = true;
                    slot->end = end;
                    slot->error = std::move(error);
                    slot->element = std::move(element);
                    if (!slot->end && !slot->error) {
                      if (output_memory_)
                        slot->element.CopyInto(output_memory_);
                      if (prepare_) prepare_(slot->element);
                      slot->bytes = slot->element.byte_size();
                    }
                    bytes_ += slot->bytes;
                    slots_.push_back(std::move(slot));
                  });
  // An autotuned buffer resumes as deep as it was (at least).
  limit_ = std::max(limit_, slots_.size());
  input_->Restore(r);
}

}  // namespace recflow::pipeline
