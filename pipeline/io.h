// Reading files as a stream of large blocks, with several reads in flight.
//
// The io_uring reader (liburing) first tries each block with a
// non-blocking read (preadv2 RWF_NOWAIT): data in the page cache is copied
// at once, block by block, so blocks stay in the CPU cache until they are
// framed.  A read that would wait goes through the ring; with O_DIRECT the
// ring then keeps `read_ahead` block reads queued at the device, submitted
// in batches, into buffers reused from a pool; buffered files instead ask
// the kernel to read ahead, which its page cache does faster than the
// ring's kernel workers (measured in docs/PERFORMANCE.md).  The pread reader
// asks the kernel to read ahead (posix_fadvise WILLNEED) and reads one
// block at a time.  Both give the same blocks.  Where io_uring
// cannot be set up (an old kernel, a seccomp filter, a container that
// forbids it) kAuto falls back to pread and says so once on the log.
//
// Blocks are handed out by reference: a Block keeps its buffer out of the
// pool until the last reference (a record viewing it) is dropped.
// A BlockReader is not thread-safe; Blocks may be used from any thread.
#ifndef RECFLOW_PIPELINE_IO_H_
#define RECFLOW_PIPELINE_IO_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "records/file.h"

namespace recflow::pipeline {

enum class IoBackend { kAuto, kIoUring, kPread };
std::string_view IoBackendName(IoBackend b);  // "auto", "io_uring", "pread"

// Why the pipeline's sources refuse a pipe or device (with
// records::RequireRegularFiles, when they are made).
inline constexpr std::string_view kSourcesNeedRegularFiles =
    "the pipeline reads each file at offsets, on several threads and again "
    "on every repetition";

struct IoOptions {
  IoBackend backend = IoBackend::kAuto;
  // Size of each read (a multiple of 4096 with `direct`).  128 KiB blocks
  // stay in the CPU's cache between the copy and the CRC check; 1 MiB ones
  // do not, which costs 2-3x on cached files (docs/PERFORMANCE.md).
  size_t block_bytes = size_t{128} << 10;
  // Reads in flight per file (io_uring, once uncached) / blocks advised
  // ahead (pread).
  int read_ahead = 8;
  // O_DIRECT: bypass the page cache, for datasets larger than memory.
  // Where the filesystem refuses it (tmpfs), reads go through the cache
  // and the log says so once.
  bool direct = false;
};

struct Block {
  std::shared_ptr<const char> owner;  // keeps the buffer out of the pool
  const char* data = nullptr;
  size_t size = 0;
  uint64_t offset = 0;  // file offset of data[0]
};

class BlockReader {
 public:
  virtual ~BlockReader() = default;
  // The next block in file order; false at the end of the file.  Blocks
  // are block_bytes long except the first (from start_offset to a block
  // boundary with `direct`) and the last.  Throws records::IoError naming
  // the file.
  virtual bool Next(Block* block) = 0;
  // The backend actually used.
  virtual IoBackend backend() const = 0;
  // The file's size when it was opened.
  virtual uint64_t file_size() const = 0;
};

// Reads [start_offset, end) of `path`, where end is the file's size when
// opened, or `end_offset` where that is smaller (one range of a file read
// by several readers; file_size() is still the file's).  Blocks then start
// at start_offset (except with `direct`), so that a range's blocks are
// whole but its last: blocks split at the file's block_bytes boundaries
// would leave a range two part-filled blocks, and records viewing them
// keep whole blocks alive.  Throws records::IoError when the file cannot
// be opened or is not a regular file (found by the fstat after the open:
// a named pipe's open waits for a writer, so the sources refuse one by
// name before, records::RequireRegularFiles).
std::unique_ptr<BlockReader> OpenBlockReader(const std::string& path,
                                             uint64_t start_offset,
                                             const IoOptions& options,
                                             uint64_t end_offset = UINT64_MAX);

// One range of ReadRanges: `length` bytes at `offset` of `file` into
// `dst`; `done` is set to the bytes read (fewer only where the file ends).
struct RangeRead {
  const records::ReadableFile* file = nullptr;
  uint64_t offset = 0;
  size_t length = 0;
  char* dst = nullptr;
  size_t done = 0;
};

// Reads every range with all of them in flight at once: one submission to
// the calling thread's io_uring ring (set up at the thread's first call and
// kept for its life), so that a batch of random reads of uncached data
// queues at the device together, and cached data costs one system call per
// batch instead of one per read.  Where io_uring cannot be used, pread one
// range at a time.  Short reads are completed.  Thread-safe (the ring is
// the thread's own).  Throws records::IoError naming the file.
void ReadRanges(std::span<RangeRead> reads);

// Whether io_uring can be used in this process (probed once).
bool IoUringAvailable();
// Rings the io_uring readers of this process have set up so far: one per
// open file whose reads had to wait (or went direct); a file read wholly
// from the page cache sets up none.  Diagnostics and tests; thread-safe.
uint64_t IoUringRingsSetUp();
// Tests: make IoUringAvailable() false, as on a kernel without io_uring.
void DisableIoUringForTesting(bool disabled);

}  // namespace recflow::pipeline

#endif  // RECFLOW_PIPELINE_IO_H_
