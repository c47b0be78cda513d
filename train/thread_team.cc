#include "train/thread_team.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace recflow::train {
namespace {

inline void Pause() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

}  // namespace

ThreadTeam::ThreadTeam(int threads, std::chrono::microseconds spin)
    : spin_(spin) {
  for (int i = 1; i < threads; ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

ThreadTeam::~ThreadTeam() {
  if (workers_.empty()) return;
  stop_.store(true, std::memory_order_seq_cst);
  epoch_.fetch_add(1, std::memory_order_seq_cst);
  epoch_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadTeam::RunJob(int64_t tasks, Call call, const void* fn) {
  const uint32_t job = ++jobs_;
  call_.store(call, std::memory_order_relaxed);
  fn_.store(fn, std::memory_order_relaxed);
  tasks_.store(uint64_t{job} << 32 | static_cast<uint64_t>(tasks),
               std::memory_order_release);
  completed_.store(0, std::memory_order_relaxed);
  next_.store(uint64_t{job} << 32, std::memory_order_release);
  // seq_cst on both sides (here: epoch then sleepers; a worker: sleepers
  // then epoch in wait) so that a worker about to sleep either sees the
  // new job or is counted and woken.
  epoch_.store(job, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) epoch_.notify_all();
  Work();
  for (int spins = 0; completed_.load(std::memory_order_acquire) < tasks;) {
    // A worker descheduled mid-task (more threads than free cores) gets
    // the core back sooner when the caller yields.
    if (++spins < 4096) {
      Pause();
    } else {
      std::this_thread::yield();
    }
  }
  if (error_) {
    std::exception_ptr e = std::move(error_);
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void ThreadTeam::Work() {
  for (;;) {
    uint64_t at = next_.load(std::memory_order_acquire);
    // The task count is checked against the job that `at` belongs to: the
    // caller writes the next job's count while next_ still holds this
    // one's (all taken), and a count from one job with an index from
    // another would let a stale value be taken.
    const uint64_t count = tasks_.load(std::memory_order_acquire);
    if ((count >> 32) != (at >> 32) ||
        (at & 0xffffffffu) >= (count & 0xffffffffu)) {
      return;
    }
    const int64_t task = static_cast<int64_t>(at & 0xffffffffu);
    // Fails when another thread took this task or a new job began after
    // `at` was read; either way, look again.
    if (!next_.compare_exchange_weak(at, at + 1, std::memory_order_acq_rel)) {
      continue;
    }
    // The job cannot change before this task completes: its fields are the
    // ones published with the value just taken.
    const Call call = call_.load(std::memory_order_relaxed);
    const void* fn = fn_.load(std::memory_order_relaxed);
    try {
      call(fn, task);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu_);
      if (!error_) error_ = std::current_exception();
    }
    completed_.fetch_add(1, std::memory_order_release);
  }
}

void ThreadTeam::WorkerLoop() {
  uint32_t seen = 0;
  for (;;) {
    uint32_t now = epoch_.load(std::memory_order_acquire);
    if (now == seen) {
      auto until = std::chrono::steady_clock::now() + spin_;
      for (int spins = 0; now == seen;
           now = epoch_.load(std::memory_order_acquire)) {
        Pause();
        if ((++spins & 63) == 0 && std::chrono::steady_clock::now() > until) {
          sleepers_.fetch_add(1, std::memory_order_seq_cst);
          epoch_.wait(seen, std::memory_order_seq_cst);
          sleepers_.fetch_sub(1, std::memory_order_seq_cst);
          until = std::chrono::steady_clock::now() + spin_;
          spins = 0;
        }
      }
    }
    seen = now;
    if (stop_.load(std::memory_order_acquire)) return;
    Work();
  }
}

}  // namespace recflow::train
