// Checkpoint restore: a checkpoint file's bytes (train::ParseCheckpoint)
// and, with the first byte odd, the `checkpoint` state file's text
// (train::ParseCheckpointState).  train::Error / records::Error are correct
// answers.
#include <cstdint>
#include <string>

#include "fuzz_data.h"
#include "fuzz_util.h"
#include "records/errors.h"
#include "train/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  recflow::fuzz::Input in(data, size);
  const uint8_t mode = in.Byte();
  try {
    if ((mode & 1) != 0) {
      recflow::train::ParseCheckpointState(in.Rest(), "fuzz/checkpoint");
    } else {
      // Mostly with the entries' CRCs made right, so that changes reach
      // the checks behind them.
      const std::string bytes =
          (mode & 2) != 0 ? std::string(in.Rest())
                          : recflow::fuzz::WithCheckpointCrcs(in.Rest());
      const auto tensors =
          recflow::train::ParseCheckpoint(bytes, "fuzz/model.ckpt-1");
      // Every tensor read must fit in the input.
      size_t total = 0;
      for (const auto& [name, t] : tensors) total += t.byte_size();
      if (total > size) __builtin_trap();
    }
  } catch (const recflow::Error&) {  // a training or a records error
  }
  return 0;
}
