// A fixed team of threads that runs one parallel loop at a time: what the
// CPU backend splits a training step's operations over.
//
// A step is hundreds of short operations (a 128x784x256 product takes
// ~0.3 ms, a bias pass a few microseconds), so waking pool threads per
// operation, as a general task pool does, costs as much as the work.  The
// team keeps its workers warm instead: the caller takes part in every
// loop, and between loops the workers spin for `spin` (default 100 us)
// before they sleep on a futex, so the operations of one step follow each
// other without a wake-up while an idle team costs no CPU.  OpenMP's
// parallel regions work the same way (KMP_BLOCKTIME).
//
// Determinism: Run(tasks, fn) calls fn once per task index whatever thread
// runs it, so work split by task index (and partial results combined in
// task order) gives the same numbers on every run with the same team size.
//
// Thread safety: one caller at a time (the training thread); fn runs on the
// caller and on workers concurrently and must not call back into the team.
// An exception thrown by fn is rethrown to the caller after every task has
// finished (the first one thrown; later ones are dropped).
#ifndef RECFLOW_TRAIN_THREAD_TEAM_H_
#define RECFLOW_TRAIN_THREAD_TEAM_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace recflow::train {

class ThreadTeam {
 public:
  // `threads` >= 1 (the caller counts as one: threads - 1 workers).
  explicit ThreadTeam(int threads, std::chrono::microseconds spin =
                                       std::chrono::microseconds(100));
  ~ThreadTeam();
  ThreadTeam(const ThreadTeam&) = delete;
  ThreadTeam& operator=(const ThreadTeam&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(task) for every task in [0, tasks) and returns when all have
  // run.  One task runs on the caller alone.
  template <typename Fn>
  void Run(int64_t tasks, const Fn& fn) {
    if (tasks <= 0) return;
    if (tasks == 1 || workers_.empty() || tasks > 0xffffffff) {
      for (int64_t t = 0; t < tasks; ++t) fn(t);
      return;
    }
    RunJob(tasks, &Invoke<Fn>, &fn);
  }

  // Splits [0, n) into at most size() contiguous ranges of at least
  // `grain` items each (the same ranges for the same n, grain and team
  // size) and calls fn(begin, end) for each; small n runs on the caller.
  template <typename Fn>
  void For(int64_t n, int64_t grain, const Fn& fn) {
    const int64_t tasks = Tasks(n, grain);
    if (tasks <= 1) {
      if (n > 0) fn(int64_t{0}, n);
      return;
    }
    const int64_t chunk = (n + tasks - 1) / tasks;
    Run(tasks, [&](int64_t t) {
      const int64_t begin = t * chunk;
      const int64_t end = std::min(n, begin + chunk);
      if (begin < end) fn(begin, end);
    });
  }

  // How many ranges For(n, grain, ...) uses.
  int64_t Tasks(int64_t n, int64_t grain) const {
    if (n <= 0) return 0;
    const int64_t g = grain < 1 ? 1 : grain;
    const int64_t by_grain = (n + g - 1) / g;
    return by_grain < size() ? by_grain : size();
  }

 private:
  using Call = void (*)(const void* fn, int64_t task);
  template <typename Fn>
  static void Invoke(const void* fn, int64_t task) {
    (*static_cast<const Fn*>(fn))(task);
  }

  void RunJob(int64_t tasks, Call call, const void* fn);
  // Takes tasks of the current job until none are left.
  void Work();
  void WorkerLoop();

  std::vector<std::thread> workers_;
  const std::chrono::microseconds spin_;

  // The current job.  next_ holds the job's number (high 32 bits) and the
  // next task index (low 32); a thread takes a task only by a
  // compare-exchange on the value it loaded and reads the job's function
  // after it, so a worker that wakes late can neither run an old job's
  // function nor take a task of the new one without seeing its fields.
  // The caller waits for its tasks to complete, never for workers that
  // took none (a sleeping worker costs a loop nothing).
  std::atomic<Call> call_{nullptr};
  std::atomic<const void*> fn_{nullptr};
  std::atomic<uint64_t> tasks_{0};  // job number << 32 | task count
  std::atomic<uint64_t> next_{0};
  std::atomic<int64_t> completed_{0};
  uint32_t jobs_ = 0;               // caller only
  std::atomic<uint32_t> epoch_{0};  // the job number workers wait on
  std::atomic<int> sleepers_{0};    // workers blocked in epoch_.wait
  std::atomic<bool> stop_{false};
  std::mutex error_mu_;
  std::exception_ptr error_;
};

}  // namespace recflow::train

#endif  // RECFLOW_TRAIN_THREAD_TEAM_H_
