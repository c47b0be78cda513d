// Data the fuzz targets and their seed writer (make_seeds) share: small
// record files and pipelines over files at a fixed path, so that iterator
// states saved by make_seeds restore in the fuzzers; and CRC fixers, so
// that mutations of a state or a checkpoint get past the checksum to the
// code behind it.
#ifndef RECFLOW_FUZZ_FUZZ_DATA_H_
#define RECFLOW_FUZZ_FUZZ_DATA_H_

#include <string>
#include <string_view>
#include <vector>

#include "pipeline/dataset.h"

namespace recflow::fuzz {

// A directory whose path is the same for every process of this user (under
// /dev/shm or the temporary directory), holding files that are written
// identically by whoever comes first (atomically, so concurrent fuzzers
// agree).
const std::string& FixedDataDir();

// 20 records of 0, 7, 14, ... bytes; ZSTD with 64-byte frames when `zstd`.
// Returns the path (in FixedDataDir()).
std::string SmallRecordFile(bool zstd);

// The pipelines of the iterator-state fuzzer, over three indexed files of
// Examples in FixedDataDir().
std::vector<pipeline::Dataset> StatePipelines();

// A checkpoint with each entry's CRC recomputed, as far as its structure
// can be followed.
std::string WithCheckpointCrcs(std::string_view checkpoint);

}  // namespace recflow::fuzz

#endif  // RECFLOW_FUZZ_FUZZ_DATA_H_
