// Happens-before edges stated to ThreadSanitizer, where the order comes from
// oneTBB code TSan cannot see.
//
// oneTBB's scheduler (task handoff, parallel_for's join, parallel_pipeline's
// stages) lives in libtbb.so, which Debian does not build with TSan: work
// it runs on a worker looks unordered with what its caller did before and
// after, and TSan reports every such access.  Where our code relies on that
// order, it says so: HappensBefore(sync) on one side, HappensAfter(sync) on
// the other, on any address as the synchronisation object (an acquire of
// every release before it on that address).  Under TSan these are
// __tsan_release / __tsan_acquire; otherwise they are empty and inline to
// nothing.  Accesses that may truly overlap must stay unordered: state only
// the edges the scheduler guarantees.
#ifndef RECFLOW_RECORDS_TSAN_H_
#define RECFLOW_RECORDS_TSAN_H_

#if defined(__SANITIZE_THREAD__)
#define RECFLOW_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RECFLOW_TSAN 1
#endif
#endif

#ifdef RECFLOW_TSAN
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace recflow::records {

#ifdef RECFLOW_TSAN
inline void HappensBefore(const void* sync) {
  __tsan_release(const_cast<void*>(sync));
}
inline void HappensAfter(const void* sync) {
  __tsan_acquire(const_cast<void*>(sync));
}
#else
inline void HappensBefore(const void*) {}
inline void HappensAfter(const void*) {}
#endif

// One call of a oneTBB parallel_pipeline stage, placed in the order the
// pipeline keeps: after the set-up (`setup`, which the caller marks
// HappensBefore before starting the pipeline) and after its own stage's
// previous call (`stage`: serial stages only, nullptr for a parallel one);
// before the stage's next call and the end (`end`, which the caller marks
// HappensAfter once the pipeline returns or throws), also when the call
// throws.  The places are any addresses; an item handed between stages
// states its own edge (HappensBefore(item) at the end of one stage,
// HappensAfter(item) at the start of the next).
class StageCall {
 public:
  StageCall(const void* setup, const void* stage, const void* end)
      : stage_(stage), end_(end) {
    HappensAfter(setup);
    if (stage_ != nullptr) HappensAfter(stage_);
  }
  ~StageCall() {
    if (stage_ != nullptr) HappensBefore(stage_);
    HappensBefore(end_);
  }
  StageCall(const StageCall&) = delete;
  StageCall& operator=(const StageCall&) = delete;

 private:
  const void* stage_;
  const void* end_;
};

}  // namespace recflow::records

#endif  // RECFLOW_RECORDS_TSAN_H_
