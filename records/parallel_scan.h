// Counting and verifying a whole file on several cores.
//
// One core cannot check CRCs as fast as the kernel copies a file out of the
// page cache, and handing blocks read on one core to another costs more
// than it saves (docs/PERFORMANCE.md).  So each thread reads and verifies a
// segment of the file itself.  A segment after the first starts at the
// first offset past its nominal start whose record header and data check
// (a synchronisation point); the thread before it stops when its own chain
// of records lands exactly on that point.  Only the chain from byte 0 is
// trusted: a segment whose synchronisation point the previous chain
// overshoots (a false match inside a payload) is discarded and that chain
// reads on, so the result is always exactly what one sequential reader
// gives.
#ifndef RECFLOW_RECORDS_PARALLEL_SCAN_H_
#define RECFLOW_RECORDS_PARALLEL_SCAN_H_

#include <cstdint>
#include <string>

#include "records/tfrecord_reader.h"

namespace recflow::records {

struct ScanResult {
  uint64_t records = 0;
  uint64_t payload_bytes = 0;
  uint64_t stream_bytes = 0;
  uint64_t file_bytes = 0;  // bytes read from the file (a pipe has no size)
  Compression compression = Compression::kNone;
  int threads = 1;  // threads that took part
};

// Reads every record of `path` as TFRecordReader(path, options) would and
// counts them.  Uncompressed regular files of at least `min_segment_bytes`
// per thread, with verification on and salvage off, are read by up to
// `threads` threads (0: one per core); everything else on the calling
// thread.  Throws the RecordError a sequential reader would throw first
// (same offset, index, kind), and IoError.
ScanResult ScanFile(const std::string& path, const ReaderOptions& options,
                    int threads = 0,
                    uint64_t min_segment_bytes = uint64_t{64} << 20);

}  // namespace recflow::records

#endif  // RECFLOW_RECORDS_PARALLEL_SCAN_H_
