#include "pipeline/io.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <liburing.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <new>
#include <vector>

#include "pipeline/block_arena.h"
#include "pipeline/process.h"
#include "records/errors.h"
#include "records/file_list.h"
#include "records/io_faults.h"

namespace recflow::pipeline {
namespace {

constexpr size_t kDirectAlignment = kBlockAlignment;

std::atomic<bool> io_uring_disabled{false};
std::atomic<uint64_t> io_uring_rings{0};

// Buffers of one size, reused: a block's buffer returns here when the last
// reference to it is dropped, whichever thread drops it.
class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  BufferPool(size_t bytes, size_t keep) : bytes_(bytes), keep_(keep) {}
  ~BufferPool() {
    for (char* b : free_) Free(b);
  }

  // The reader is gone: buffers still out are freed as they come back,
  // not kept for reads that will not come (a shuffle may hold a closed
  // file's blocks for a long time, and a file read by ranges has a pool
  // per range).
  void Close() {
    std::vector<char*> free;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
      free.swap(free_);
    }
    for (char* b : free) Free(b);
  }

  std::shared_ptr<char> Get() {
    char* b = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        b = free_.back();
        free_.pop_back();
      }
    }
    if (b == nullptr) b = AllocateBlock(bytes_);
    return std::shared_ptr<char>(
        b, [pool = shared_from_this()](char* p) { pool->Put(p); });
  }

 private:
  void Put(char* b) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!closed_ && free_.size() < keep_) {
        free_.push_back(b);
        return;
      }
    }
    Free(b);
  }
  void Free(char* b) { FreeBlock(b, bytes_); }

  const size_t bytes_;
  const size_t keep_;
  std::mutex mu_;
  std::vector<char*> free_;
  bool closed_ = false;
};

// An open file and the block geometry both readers share.
class FileBlocks {
 public:
  FileBlocks(const std::string& path, uint64_t start, uint64_t end,
             const IoOptions& o)
      : path_(path), options_(o) {
    if (o.block_bytes == 0 ||
        (o.direct && o.block_bytes % kDirectAlignment != 0)) {
      throw records::IoError(
          path, fmt::format("block size {} must be a positive multiple of {} "
                            "for direct I/O",
                            o.block_bytes, kDirectAlignment));
    }
    if (o.direct) {
      fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
      if (fd_ >= 0) {
        direct_ = true;
      } else if (errno == EINVAL) {
        static std::once_flag once;
        std::call_once(once, [&] {
          LogLine(
              fmt::format("recflow: {}: the filesystem refuses O_DIRECT; "
                          "reading through the page cache",
                          path));
        });
      }
    }
    if (fd_ < 0) fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw records::IoError(path, "cannot open", errno);
    struct stat st;
    if (::fstat(fd_, &st) != 0) {
      const int e = errno;
      ::close(fd_);
      throw records::IoError(path, "cannot stat", e);
    }
    if (!S_ISREG(st.st_mode)) {  // its size (0) would read as an empty file
      ::close(fd_);
      throw records::IoError(
          path, records::NotRegularFileDetail(kSourcesNeedRegularFiles));
    }
    end_ = static_cast<uint64_t>(st.st_size);
    limit_ = std::min(end, end_);
    start_ = std::min(start, limit_);
    // A range's reads start at the range (see OpenBlockReader).
    grid_ = direct_ || end == UINT64_MAX;
    // Direct reads start on an aligned offset; the bytes before `start`
    // are skipped in the first block.
    next_ = direct_ ? start_ / kDirectAlignment * kDirectAlignment : start_;
    const size_t keep = static_cast<size_t>(std::max(o.read_ahead, 1)) + 2;
    pool_ = std::make_shared<BufferPool>(o.block_bytes, keep);
  }
  ~FileBlocks() {
    pool_->Close();
    ::close(fd_);
  }

  // The next read to issue: [offset, offset + length) of the file; false
  // when everything is issued.
  bool NextRead(uint64_t* offset, size_t* length) {
    if (next_ >= limit_) return false;
    *offset = next_;
    // Reads end on block boundaries so that later ones stay aligned.
    const uint64_t boundary =
        grid_ ? (next_ / options_.block_bytes + 1) * options_.block_bytes
              : next_ + options_.block_bytes;
    const uint64_t stop = std::min(boundary, limit_);
    *length = static_cast<size_t>(stop - next_);
    if (direct_) {
      *length = (*length + kDirectAlignment - 1) / kDirectAlignment *
                kDirectAlignment;
    }
    next_ = stop;
    return true;
  }

  // Fills `block` with what a read at `offset` of `length` returned
  // (`got` bytes), completing a short read with pread; trims to
  // [start_, limit_).
  void Finish(std::shared_ptr<char> buffer, uint64_t offset, size_t length,
              size_t got, Block* block) {
    const uint64_t want = std::min<uint64_t>(length, limit_ - offset);
    while (got < want) {
      // Direct reads go on from an aligned offset, in whole sectors (a short
      // direct read from the kernel is whole sectors too; an injected one
      // is rounded up to them).
      if (direct_) got = got / kDirectAlignment * kDirectAlignment;
      const records::IoFault fault =
          records::CheckIoFault(records::IoOp::kRead, path_, length - got);
      size_t cap = std::max<size_t>(fault.max_bytes, 1);
      if (direct_ && cap < length) {
        cap =
            (cap + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
      }
      ssize_t n = -1;
      if (fault.error != 0) {
        errno = fault.error;
      } else {
        n = ::pread(fd_, buffer.get() + got, std::min(length - got, cap),
                    static_cast<off_t>(offset + got));
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        throw records::IoError(
            path_, fmt::format("read at offset {}", offset + got), errno);
      }
      if (n == 0) {
        throw records::IoError(
            path_, fmt::format("the file shrank while being read: it ends at "
                               "{}, {} bytes were expected",
                               offset + got, end_));
      }
      got += static_cast<size_t>(n);
    }
    const uint64_t skip = offset < start_ ? start_ - offset : 0;
    block->data = buffer.get() + skip;
    block->size = static_cast<size_t>(want - skip);
    block->offset = offset + skip;
    block->owner = std::move(buffer);
  }

  const std::string& path() const { return path_; }
  int fd() const { return fd_; }
  bool direct() const { return direct_; }
  uint64_t end() const { return end_; }
  uint64_t limit() const { return limit_; }
  const IoOptions& options() const { return options_; }
  BufferPool& pool() { return *pool_; }

 private:
  std::string path_;
  IoOptions options_;
  int fd_ = -1;
  bool direct_ = false;
  uint64_t start_ = 0;
  uint64_t end_ = 0;    // the file's size when opened
  uint64_t limit_ = 0;  // where reading stops: end_ or before
  bool grid_ = true;    // reads end on multiples of block_bytes
  uint64_t next_ = 0;
  std::shared_ptr<BufferPool> pool_;
};

class PreadBlockReader final : public BlockReader {
 public:
  PreadBlockReader(const std::string& path, uint64_t start, uint64_t end,
                   const IoOptions& o)
      : file_(path, start, end, o) {}

  bool Next(Block* block) override {
    uint64_t offset;
    size_t length;
    if (!file_.NextRead(&offset, &length)) return false;
    // Ask the kernel to read the following blocks while this one is used.
    const uint64_t ahead_start = offset + length;
    if (ahead_start < file_.limit() && ahead_start >= advised_) {
      const uint64_t ahead = std::min<uint64_t>(
          file_.options().block_bytes * std::max(file_.options().read_ahead, 1),
          file_.limit() - ahead_start);
      ::posix_fadvise(file_.fd(), static_cast<off_t>(ahead_start),
                      static_cast<off_t>(ahead), POSIX_FADV_WILLNEED);
      advised_ = ahead_start + ahead;
    }
    std::shared_ptr<char> buffer = file_.pool().Get();
    file_.Finish(std::move(buffer), offset, length, 0, block);
    return true;
  }
  IoBackend backend() const override { return IoBackend::kPread; }
  uint64_t file_size() const override { return file_.end(); }

 private:
  FileBlocks file_;
  uint64_t advised_ = 0;
};

class IoUringBlockReader final : public BlockReader {
 public:
  IoUringBlockReader(const std::string& path, uint64_t start, uint64_t end,
                     const IoOptions& o)
      : file_(path, start, end, o), depth_(std::max(o.read_ahead, 1)) {}

  ~IoUringBlockReader() override {
    if (!ring_ready_) return;
    // The kernel may still be writing into buffers of reads in flight.
    for (auto& read : in_flight_) {
      while (!read->done) {
        if (!Reap(/*wait=*/true)) break;
      }
    }
    io_uring_queue_exit(&ring_);
  }

  bool Next(Block* block) override {
    if (in_flight_.empty() && !uncached_) {
      // Cached data: a non-blocking read copies it at once, with no queue
      // of blocks evicting each other from the CPU cache.  The first read
      // that would wait switches the file to the ring, with read-ahead.
      uint64_t offset;
      size_t length;
      if (!file_.NextRead(&offset, &length)) return false;
      std::shared_ptr<char> buffer = file_.pool().Get();
      iovec iov{buffer.get(), length};
      // A fault injected here sends the read through the ring, as a read
      // that would wait does.
      const records::IoFault fault =
          records::CheckIoFault(records::IoOp::kRead, file_.path(), length);
      const ssize_t n = fault.error != 0 || fault.max_bytes < length
                            ? -1
                            : ::preadv2(file_.fd(), &iov, 1,
                                        static_cast<off_t>(offset), RWF_NOWAIT);
      const uint64_t want = std::min<uint64_t>(length, file_.limit() - offset);
      if (n >= 0 && static_cast<uint64_t>(n) == want) {
        file_.Finish(std::move(buffer), offset, length, want, block);
        return true;
      }
      // O_DIRECT: the ring keeps `read_ahead` reads at the device from now
      // on.  Buffered: the kernel's read-ahead (asked for, as pread does)
      // is faster than the ring's workers on this project's machines
      // (docs/PERFORMANCE.md), so this one read goes through the ring and
      // the next block is tried without waiting again.
      if (file_.direct()) {
        uncached_ = true;
      } else if (offset + length >= advised_) {
        const uint64_t ahead =
            file_.options().block_bytes * static_cast<uint64_t>(depth_);
        ::posix_fadvise(file_.fd(), static_cast<off_t>(offset + length),
                        static_cast<off_t>(ahead), POSIX_FADV_WILLNEED);
        advised_ = offset + length + ahead;
      }
      auto read = std::make_unique<Read>();
      read->buffer = std::move(buffer);
      read->offset = offset;
      read->length = length;
      Queue(std::move(read));
    }
    Submit();
    if (in_flight_.empty()) return false;
    Read& front = *in_flight_.front();
    while (!front.done) Reap(/*wait=*/true);
    std::unique_ptr<Read> read = std::move(in_flight_.front());
    in_flight_.pop_front();
    if (read->result >= 0) {
      const records::IoFault fault = records::CheckIoFault(
          records::IoOp::kRead, file_.path(), read->length);
      if (fault.error != 0) {
        read->result = -fault.error;
      } else if (static_cast<size_t>(read->result) > fault.max_bytes) {
        // Finish() completes a short read with pread.
        read->result = static_cast<int>(std::max<size_t>(fault.max_bytes, 1));
      }
    }
    if (read->result < 0) {
      throw records::IoError(file_.path(),
                             fmt::format("read at offset {}", read->offset),
                             -read->result);
    }
    file_.Finish(std::move(read->buffer), read->offset, read->length,
                 static_cast<size_t>(read->result), block);
    // Keep the queue full while the caller uses this block.
    Submit();
    return true;
  }
  IoBackend backend() const override { return IoBackend::kIoUring; }
  uint64_t file_size() const override { return file_.end(); }

 private:
  struct Read {
    std::shared_ptr<char> buffer;
    uint64_t offset = 0;
    size_t length = 0;
    int result = 0;
    bool done = false;
  };

  // Puts a read on the ring's submission queue (submitted by Submit()).
  // The ring is set up at the first read that would wait: a file read
  // wholly from the page cache never needs one, and setting up and tearing
  // down a ring (its mappings, shared with the kernel) for every open of a
  // small file cost more than reading it (docs/PERFORMANCE.md).
  void Queue(std::unique_ptr<Read> read) {
    if (!ring_ready_) {
      const int e =
          io_uring_queue_init(static_cast<unsigned>(depth_), &ring_, 0);
      if (e < 0) {
        throw records::IoError(file_.path(), "cannot set up io_uring", -e);
      }
      ring_ready_ = true;
      io_uring_rings.fetch_add(1, std::memory_order_relaxed);
    }
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    io_uring_prep_read(sqe, file_.fd(), read->buffer.get(),
                       static_cast<unsigned>(read->length), read->offset);
    io_uring_sqe_set_data(sqe, read.get());
    in_flight_.push_back(std::move(read));
    ++queued_;
  }

  // Queues reads up to the depth and submits them in one system call.
  void Submit() {
    while (uncached_ && static_cast<int>(in_flight_.size()) < depth_) {
      uint64_t offset;
      size_t length;
      if (!file_.NextRead(&offset, &length)) break;
      auto read = std::make_unique<Read>();
      read->buffer = file_.pool().Get();
      read->offset = offset;
      read->length = length;
      Queue(std::move(read));
    }
    if (queued_ == 0) return;
    queued_ = 0;
    int e;
    do {
      e = io_uring_submit(&ring_);
    } while (e == -EINTR);
    if (e < 0) throw records::IoError(file_.path(), "io_uring submit", -e);
  }

  // Takes one completion; returns false when none could be had.
  bool Reap(bool wait) {
    io_uring_cqe* cqe = nullptr;
    int e;
    do {
      e = wait ? io_uring_wait_cqe(&ring_, &cqe)
               : io_uring_peek_cqe(&ring_, &cqe);
    } while (e == -EINTR);
    if (e < 0 || cqe == nullptr) return false;
    auto* read = static_cast<Read*>(io_uring_cqe_get_data(cqe));
    read->result = cqe->res;
    read->done = true;
    io_uring_cqe_seen(&ring_, cqe);
    return true;
  }

  FileBlocks file_;
  const int depth_;
  bool uncached_ = false;  // direct I/O that would wait: keep the ring full
  uint64_t advised_ = 0;   // buffered: read-ahead asked for up to here
  unsigned queued_ = 0;    // reads queued, not yet submitted
  bool ring_ready_ = false;
  io_uring ring_{};
  std::deque<std::unique_ptr<Read>> in_flight_;
};

bool ProbeIoUring() {
  io_uring ring;
  const int e = io_uring_queue_init(2, &ring, 0);
  if (e < 0) {
    LogLine(
        fmt::format("recflow: io_uring is not available ({}); reading "
                    "with pread and read-ahead",
                    std::strerror(-e)));
    return false;
  }
  io_uring_queue_exit(&ring);
  return true;
}

}  // namespace

std::string_view IoBackendName(IoBackend b) {
  switch (b) {
    case IoBackend::kAuto:
      return "auto";
    case IoBackend::kIoUring:
      return "io_uring";
    case IoBackend::kPread:
      return "pread";
  }
  return "?";
}

namespace {

// Forks of this process and its parents since the first ring was set up
// (pthread_atfork's child handler counts them).  A ring set up before a
// fork is the parent's: its queues are memory both processes map, so a
// child submitting on it races the parent and every other child, and its
// reads fill the memory of the process that set it up.  The child's thread
// (a DataLoader worker's, forked from a process that read through a
// TFRecordDataSource) sets up a ring of its own instead.
std::atomic<uint64_t> forks{0};

void CountFork() { forks.fetch_add(1, std::memory_order_relaxed); }

// The calling thread's ring for ReadRanges, set up at its first batch.
class ThreadRing {
 public:
  static constexpr unsigned kEntries = 256;
  ~ThreadRing() {
    if (ready_) io_uring_queue_exit(&ring_);
  }
  // The ring, or null where it cannot be set up (then pread is used).
  io_uring* Get() {
    static const bool counting =
        pthread_atfork(nullptr, nullptr, CountFork) == 0;
    const uint64_t generation = forks.load(std::memory_order_relaxed);
    if (ready_ && generation != generation_) {
      // Unmaps this process's view of the parent's ring and closes its
      // copy of the descriptor; the parent's ring is untouched.
      io_uring_queue_exit(&ring_);
      ready_ = false;
    }
    if (!ready_ && !failed_) {
      if (!counting || io_uring_queue_init(kEntries, &ring_, 0) < 0) {
        failed_ = true;
      } else {
        ready_ = true;
        generation_ = generation;
        io_uring_rings.fetch_add(1, std::memory_order_relaxed);
      }
    }
    return ready_ ? &ring_ : nullptr;
  }
  // After a submission or a wait failed, reads may still be queued: the
  // ring is torn down, so that none of them goes out with a later batch,
  // and this thread reads with pread from then on.
  void Discard() {
    if (ready_) io_uring_queue_exit(&ring_);
    ready_ = false;
    failed_ = true;
  }

 private:
  io_uring ring_{};
  bool ready_ = false;
  bool failed_ = false;
  uint64_t generation_ = 0;  // forks when the ring was set up
};

[[noreturn]] void ThrowReadError(const RangeRead& r, int error) {
  throw records::IoError(
      r.file->path(),
      fmt::format("read of {} bytes at byte {} failed", r.length, r.offset),
      error);
}

// Submits `reads` (at most kEntries) on the thread's ring and reaps every
// completion before reporting the first error.
void RingBatch(ThreadRing& thread_ring, std::span<RangeRead> reads) {
  io_uring* ring = thread_ring.Get();
  // The test seam, as for every read, before anything is queued: an
  // injected error fails the batch, a short read is completed later.
  size_t lengths[ThreadRing::kEntries];
  for (size_t k = 0; k < reads.size(); ++k) {
    RangeRead& r = reads[k];
    r.done = 0;
    const records::IoFault f =
        records::CheckIoFault(records::IoOp::kRead, r.file->path(), r.length);
    if (f.error != 0) ThrowReadError(r, f.error);
    lengths[k] = std::min(r.length, std::max<size_t>(f.max_bytes, 1));
  }
  for (size_t k = 0; k < reads.size(); ++k) {
    io_uring_sqe* sqe = io_uring_get_sqe(ring);
    io_uring_prep_read(sqe, reads[k].file->fd(), reads[k].dst,
                       static_cast<unsigned>(lengths[k]), reads[k].offset);
    io_uring_sqe_set_data64(sqe, k);
  }
  size_t submitted = 0;
  while (submitted < reads.size()) {
    const int e = io_uring_submit(ring);
    if (e == -EINTR) continue;
    if (e <= 0) {
      // Nothing may stay queued for a later batch: the ring goes.
      thread_ring.Discard();
      throw records::IoError(reads[0].file->path(), "io_uring submit",
                             e < 0 ? -e : EIO);
    }
    submitted += static_cast<size_t>(e);
  }
  int e = 0;
  int error = 0;
  size_t failed = 0;
  for (size_t k = 0; k < reads.size(); ++k) {
    io_uring_cqe* cqe = nullptr;
    do {
      e = io_uring_wait_cqe(ring, &cqe);
    } while (e == -EINTR);
    if (e < 0) {
      // The ring is not trusted again (its state is unknown).
      thread_ring.Discard();
      throw records::IoError(reads[0].file->path(), "io_uring wait", -e);
    }
    const size_t i = static_cast<size_t>(io_uring_cqe_get_data64(cqe));
    if (cqe->res < 0 && error == 0) {
      error = -cqe->res;
      failed = i;
    } else if (cqe->res >= 0) {
      reads[i].done = static_cast<size_t>(cqe->res);
    }
    io_uring_cqe_seen(ring, cqe);
  }
  if (error != 0) ThrowReadError(reads[failed], error);
}

}  // namespace

void ReadRanges(std::span<RangeRead> reads) {
  thread_local ThreadRing ring;
  io_uring* r = IoUringAvailable() ? ring.Get() : nullptr;
  if (r != nullptr) {
    for (size_t first = 0; first < reads.size();
         first += ThreadRing::kEntries) {
      RingBatch(ring,
                reads.subspan(first, std::min<size_t>(ThreadRing::kEntries,
                                                      reads.size() - first)));
    }
  }
  // pread where there is no ring; the rest of short reads either way.
  for (RangeRead& read : reads) {
    if (r != nullptr && read.done == read.length) continue;
    const size_t at = r != nullptr ? read.done : 0;
    read.done = at + read.file->ReadAt(read.offset + at, read.dst + at,
                                       read.length - at);
  }
}

bool IoUringAvailable() {
  if (io_uring_disabled.load()) return false;
  static const bool available = ProbeIoUring();
  return available;
}

void DisableIoUringForTesting(bool disabled) { io_uring_disabled = disabled; }

uint64_t IoUringRingsSetUp() {
  return io_uring_rings.load(std::memory_order_relaxed);
}

std::unique_ptr<BlockReader> OpenBlockReader(const std::string& path,
                                             uint64_t start_offset,
                                             const IoOptions& options,
                                             uint64_t end_offset) {
  IoBackend backend = options.backend;
  if (backend == IoBackend::kAuto) {
    backend = IoUringAvailable() ? IoBackend::kIoUring : IoBackend::kPread;
  } else if (backend == IoBackend::kIoUring && io_uring_disabled.load()) {
    throw records::IoError(path, "io_uring was asked for but is disabled");
  }
  if (backend == IoBackend::kIoUring) {
    return std::make_unique<IoUringBlockReader>(path, start_offset, end_offset,
                                                options);
  }
  return std::make_unique<PreadBlockReader>(path, start_offset, end_offset,
                                            options);
}

}  // namespace recflow::pipeline
