// The CUDA entry points of a build without the CUDA backend
// (RECFLOW_CUDA=OFF, or no CUDA toolkit with cuDNN at configure time):
// asking for a GPU says so in one line.
#include <fmt/format.h>

#include "train/backend.h"

namespace recflow::train {

bool CudaBuilt() { return false; }
bool NcclBuilt() { return false; }

std::unique_ptr<Backend> MakeCudaBackend(int index, bool, bool) {
  throw CudaUnavailable(fmt::format(
      "cannot train on cuda:{}: this recflow was built without the CUDA "
      "backend (configure with the CUDA toolkit and cuDNN present, or "
      "-DRECFLOW_CUDA=ON)",
      index));
}

}  // namespace recflow::train
