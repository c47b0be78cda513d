#include "train/collective.h"

#include <cstdlib>

#include "train/error.h"

namespace recflow::train {
namespace {

class Local final : public Collective {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::string name() const override { return "local"; }
  bool launched() const override { return false; }
  void AllReduce(std::span<float>, ReduceOp) override {}
  void AllReduce(std::span<double>, ReduceOp) override {}
  void AllReduce(std::span<int64_t>, ReduceOp) override {}
  void Broadcast(std::string&, int root) override {
    if (root != 0) throw Error("broadcast from a rank other than 0 of 1");
  }
  void Barrier() override {}
  void Abort(int) override {}
};

}  // namespace

int64_t Collective::Sum(int64_t v) {
  AllReduce(std::span(&v, 1), ReduceOp::kSum);
  return v;
}

int64_t Collective::Max(int64_t v) {
  AllReduce(std::span(&v, 1), ReduceOp::kMax);
  return v;
}

std::shared_ptr<Collective> LocalCollective() {
  return std::make_shared<Local>();
}

bool LaunchedByMpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"}) {
    if (std::getenv(var) != nullptr) return true;
  }
  return false;
}

#ifndef RECFLOW_MPI_BUILT
bool MpiBuilt() { return false; }

std::shared_ptr<Collective> MpiWorld() {
  throw Error(
      "this recflow was built without MPI (RECFLOW_MPI): install Debian's "
      "openmpi-bin and libopenmpi-dev and rebuild to train on several "
      "processes");
}
#endif

}  // namespace recflow::train
