// A seam through which tests make the operating system misbehave: every
// read, write, fsync and rename that records/ (ReadableFile, WritableFile)
// and pipeline/ (the pread and io_uring block readers) issue first asks the
// installed IoFaultInjector, which may fail the call with an errno or let
// it transfer fewer bytes than asked (a short read or write, which callers
// must complete, not mistake for the end).
//
// With no injector installed (always, outside tests) the cost is one relaxed
// atomic load per system call.  Installing and removing an injector is
// thread-safe; the injector itself must be safe to call from the threads
// that do I/O.  The caller keeps the injector alive while it is installed
// (ScopedIoFaults does both).
#ifndef RECFLOW_RECORDS_IO_FAULTS_H_
#define RECFLOW_RECORDS_IO_FAULTS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

namespace recflow::records {

enum class IoOp { kRead, kWrite, kSync, kRename };

std::string_view IoOpName(IoOp op);

// What an injector decided for one call.
struct IoFault {
  int error = 0;  // nonzero: the call fails with this errno
  // Otherwise at most this many bytes are transferred (reads and writes).
  size_t max_bytes = std::numeric_limits<size_t>::max();
};

class IoFaultInjector {
 public:
  virtual ~IoFaultInjector() = default;
  // Called before the operation on `path` that would transfer `bytes`.
  virtual IoFault Before(IoOp op, std::string_view path, size_t bytes) = 0;
};

namespace internal {
extern std::atomic<IoFaultInjector*> io_fault_injector;
}

// Installs `injector` (nullptr removes it); returns the previous one.
IoFaultInjector* SetIoFaultInjector(IoFaultInjector* injector);

// What the installed injector says about this call; no fault when none is.
inline IoFault CheckIoFault(IoOp op, std::string_view path, size_t bytes) {
  IoFaultInjector* injector =
      internal::io_fault_injector.load(std::memory_order_acquire);
  if (injector == nullptr) return {};
  return injector->Before(op, path, bytes);
}

// The injector tests use: every `every`-th call of kind `op` (counting from
// the `every`-th) on a path containing `path_filter` fails with `error`, or,
// when `error` is 0, transfers at most `short_bytes`.  Counts are shared
// by all threads; `calls()` and `faults()` say how often it was asked and
// how often it struck.
class NthCallFaults final : public IoFaultInjector {
 public:
  NthCallFaults(IoOp op, uint64_t every, int error, size_t short_bytes = 1,
                std::string path_filter = "")
      : op_(op),
        every_(every == 0 ? 1 : every),
        error_(error),
        short_bytes_(short_bytes),
        filter_(std::move(path_filter)) {}

  IoFault Before(IoOp op, std::string_view path, size_t /*bytes*/) override {
    if (op != op_) return {};
    if (!filter_.empty() && path.find(filter_) == std::string_view::npos) {
      return {};
    }
    const uint64_t n = calls_.fetch_add(1) + 1;
    if (n % every_ != 0) return {};
    faults_.fetch_add(1);
    if (error_ != 0) return {.error = error_};
    return {.max_bytes = short_bytes_};
  }
  uint64_t calls() const { return calls_.load(); }
  uint64_t faults() const { return faults_.load(); }

 private:
  const IoOp op_;
  const uint64_t every_;
  const int error_;
  const size_t short_bytes_;
  const std::string filter_;
  std::atomic<uint64_t> calls_{0};
  std::atomic<uint64_t> faults_{0};
};

// Installs an injector for the lifetime of this object, then restores the
// previous one.
class ScopedIoFaults {
 public:
  explicit ScopedIoFaults(IoFaultInjector* injector)
      : previous_(SetIoFaultInjector(injector)) {}
  ~ScopedIoFaults() { SetIoFaultInjector(previous_); }
  ScopedIoFaults(const ScopedIoFaults&) = delete;
  ScopedIoFaults& operator=(const ScopedIoFaults&) = delete;

 private:
  IoFaultInjector* previous_;
};

}  // namespace recflow::records

#endif  // RECFLOW_RECORDS_IO_FAULTS_H_
