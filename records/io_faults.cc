#include "records/io_faults.h"

namespace recflow::records {
namespace internal {
std::atomic<IoFaultInjector*> io_fault_injector{nullptr};
}  // namespace internal

std::string_view IoOpName(IoOp op) {
  switch (op) {
    case IoOp::kRead:
      return "read";
    case IoOp::kWrite:
      return "write";
    case IoOp::kSync:
      return "fsync";
    case IoOp::kRename:
      return "rename";
  }
  return "?";
}

IoFaultInjector* SetIoFaultInjector(IoFaultInjector* injector) {
  return internal::io_fault_injector.exchange(injector,
                                              std::memory_order_acq_rel);
}

}  // namespace recflow::records
