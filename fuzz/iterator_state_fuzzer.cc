// Iterator::Restore() with arbitrary state blobs, for pipelines that cover
// every stage with state: TFRecord files (interleaved, read ahead in or
// out of turn, shuffled per epoch, each shuffled in a buffer of its own,
// stage by stage and fused),
// the index-based global shuffle (sharded), shuffle buffers holding
// elements, batch, repeat, take/skip, cache, prefetch, parallel map,
// window, rebatch, scan, unique, take_while, group_by_window,
// assert_cardinality, rejection_resample, counter and random, and the
// plain-file sources (text lines, fixed-length records).
// After a restore that is accepted, up to 16 elements are drawn.  Any
// records::Error (which pipeline errors derive from) is a correct answer.
#include <cstdint>

#include "fuzz_data.h"
#include "fuzz_util.h"
#include "pipeline/dataset.h"
#include "records/errors.h"
#include "test_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace recflow;
  static const std::vector<pipeline::Dataset> pipelines =
      fuzz::StatePipelines();
  fuzz::Input in(data, size);
  const uint8_t mode = in.Byte();
  const pipeline::Dataset& ds = pipelines[mode % pipelines.size()];
  // Mostly with the CRC made right, so that changes reach the stages.
  const std::string state = (mode & 0x80) != 0
                                ? std::string(in.Rest())
                                : recflow::testing::WithStateCrc(in.Rest());
  try {
    pipeline::Iterator it = ds.MakeIterator();
    it.Restore(state);
    pipeline::Element e;
    for (int i = 0; i < 16 && it.Next(&e); ++i) {
    }
    it.Save();
  } catch (const recflow::Error&) {  // a pipeline or a records error
  }
  return 0;
}
