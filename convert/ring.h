// Internal to convert/: the shape its parallel passes share (the job's rows
// into Examples, JSON Lines' typing pass), a oneTBB parallel_pipeline of
// three stages over a ring of reused items.
#ifndef RECFLOW_CONVERT_RING_H_
#define RECFLOW_CONVERT_RING_H_

#include <tbb/parallel_pipeline.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "records/tsan.h"

namespace recflow::convert {

// ThreadSanitizer does not see the order parallel_pipeline keeps
// (records/tsan.h), so RunRing states it at these places.  They are not a
// run's own: a stage's first read of its captures must already come after
// the set-up.  Runs at once share them, which may order one run's calls
// after another's, but never two calls that overlap.
namespace ring_order {
inline char setup, filling, draining, end;
}  // namespace ring_order

// Runs items through three stages on oneTBB's threads: `fill(Item&) ->
// bool` on one thread at a time, in turn; `work(Item&)` on as many items
// at once as there are threads; `drain(Item&)` on one thread at a time, in
// the order the items were filled.  Blocks until fill returns false (that
// slot's content is then ignored) and every filled item has been drained.
//
// Items are `slots` reused slots owned here: at most `slots` are in flight,
// and an item's slot is filled again only after its drain returned, so
// what `slots` items hold bounds the memory of the run, and a slot keeps
// what its last item left (strings' storage: fill resets what it uses).
// Calls of fill, and of drain, never overlap their own kind; work calls
// overlap each other and the other stages, on other items, so what work
// touches besides its item must be thread-safe.  The stages may capture
// the caller's state by reference: the order is stated to ThreadSanitizer
// (records/tsan.h) from the caller to every call, from a call to the same
// item's next stage and to the next call of fill or drain, and from every
// call to the caller once RunRing returns or throws.
//
// An exception from a stage cancels the run: items in flight go no
// further, and RunRing rethrows the first once every call has ended.
template <typename Item, typename Fill, typename Work, typename Drain>
void RunRing(size_t slots, Fill&& fill, Work&& work, Drain&& drain) {
  using records::HappensAfter;
  using records::HappensBefore;
  using records::StageCall;
  namespace o = ring_order;
  // Items travel between the stages as raw pointers (when an error cancels
  // the pipeline, oneTBB drops the items in flight without destroying
  // them).  parallel_pipeline starts an item only while fewer than
  // `slots` are in flight, and they leave the last (in-order) stage in
  // order, so item i's slot is free once item i - slots has been drained.
  std::vector<Item> ring(slots);
  uint64_t filled = 0;
  auto fill_stage = [&](tbb::flow_control& fc) -> Item* {
    StageCall call(&o::setup, &o::filling, &o::end);
    Item* item = &ring[filled % ring.size()];
    HappensAfter(item);
    if (!fill(*item)) {
      fc.stop();
      return nullptr;
    }
    ++filled;
    HappensBefore(item);
    return item;
  };
  auto work_stage = [&](Item* item) -> Item* {
    StageCall call(&o::setup, nullptr, &o::end);
    HappensAfter(item);
    work(*item);
    HappensBefore(item);
    return item;
  };
  auto drain_stage = [&](Item* item) {
    StageCall call(&o::setup, &o::draining, &o::end);
    HappensAfter(item);
    drain(*item);
    HappensBefore(item);  // its slot's next filling
  };
  HappensBefore(&o::setup);
  try {
    tbb::parallel_pipeline(
        ring.size(), tbb::make_filter<void, Item*>(
                         tbb::filter_mode::serial_in_order, fill_stage) &
                         tbb::make_filter<Item*, Item*>(
                             tbb::filter_mode::parallel, work_stage) &
                         tbb::make_filter<Item*, void>(
                             tbb::filter_mode::serial_in_order, drain_stage));
  } catch (...) {
    HappensAfter(&o::end);
    throw;
  }
  HappensAfter(&o::end);
}

}  // namespace recflow::convert

#endif  // RECFLOW_CONVERT_RING_H_
