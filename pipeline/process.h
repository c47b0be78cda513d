// Process-wide settings of the pipeline: where its one-off notices go, and
// the allocator tuning that programs (not the library) may opt into.
// Thread-safe.
#ifndef RECFLOW_PIPELINE_PROCESS_H_
#define RECFLOW_PIPELINE_PROCESS_H_

#include <functional>
#include <string_view>

namespace recflow::pipeline {

// Where the pipeline's one-off notices go (such as io_uring being
// unavailable, or a global shuffle building missing indexes): stderr by
// default, one line each; null restores stderr.
void SetLogSink(std::function<void(std::string_view)> sink);
void LogLine(std::string_view line);

// glibc gives blocks over its mmap threshold back to the kernel when they
// are freed, so a pipeline that hands out a fresh batch-sized buffer per
// batch pays page faults on every batch (half the time of a parse-only
// pipeline, docs/PERFORMANCE.md).  This raises the thresholds (64 MiB mmap,
// 256 MiB trim) so freed batches are reused.  It changes the whole
// process's allocator, so the library never calls it; programs (recflow,
// the benchmarks) do, and training programs may.
void TuneAllocatorForBatches();

}  // namespace recflow::pipeline

#endif  // RECFLOW_PIPELINE_PROCESS_H_
