// MpiWorld(): the Collective over MPI_COMM_WORLD (train/collective.h).
#include <fmt/format.h>
#include <mpi.h>

#include <cstdlib>
#include <mutex>

#include "train/collective.h"
#include "train/error.h"

namespace recflow::train {
namespace {

MPI_Op OpOf(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return MPI_SUM;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
  }
  return MPI_SUM;
}

// MPI counts are ints: large buffers go in slices.
constexpr size_t kMaxCount = size_t{1} << 30;

template <typename T>
void AllReduceIn(std::span<T> data, MPI_Datatype type, ReduceOp op) {
  for (size_t at = 0; at < data.size(); at += kMaxCount) {
    const int n = static_cast<int>(std::min(kMaxCount, data.size() - at));
    MPI_Allreduce(MPI_IN_PLACE, data.data() + at, n, type, OpOf(op),
                  MPI_COMM_WORLD);
  }
}

void FinalizeAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

class Mpi final : public Collective {
 public:
  Mpi() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      // A rank waiting in a collective yields its core instead of spinning
      // on it: the rank's input pipeline threads share that core, and a
      // spinning wait starved them for whole scheduler slices (2 ranks
      // bound to a core each: 2.2x the step time of one, 1.3x yielding).
      // An explicit setting in the environment wins (OpenMPI's MCA).
      setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
      if (provided < MPI_THREAD_SERIALIZED) {
        throw Error(
            fmt::format("MPI provides thread level {}; recflow needs "
                        "MPI_THREAD_SERIALIZED ({})",
                        provided, MPI_THREAD_SERIALIZED));
      }
      std::atexit(FinalizeAtExit);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    // The ranks that share this host's memory: the local rank picks the GPU.
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_,
                        MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local_rank_);
    MPI_Comm_size(node, &local_size_);
    MPI_Comm_free(&node);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string name() const override { return "mpi"; }
  bool launched() const override { return true; }

  void AllReduce(std::span<float> data, ReduceOp op) override {
    AllReduceIn(data, MPI_FLOAT, op);
  }
  void AllReduce(std::span<double> data, ReduceOp op) override {
    AllReduceIn(data, MPI_DOUBLE, op);
  }
  void AllReduce(std::span<int64_t> data, ReduceOp op) override {
    AllReduceIn(data, MPI_INT64_T, op);
  }

  void Broadcast(std::string& data, int root) override {
    if (root < 0 || root >= size_) {
      throw Error(fmt::format("broadcast from rank {} of {}", root, size_));
    }
    int64_t n = static_cast<int64_t>(data.size());
    MPI_Bcast(&n, 1, MPI_INT64_T, root, MPI_COMM_WORLD);
    if (rank_ != root) data.resize(static_cast<size_t>(n));
    for (int64_t at = 0; at < n; at += static_cast<int64_t>(kMaxCount)) {
      const int count = static_cast<int>(std::min<int64_t>(kMaxCount, n - at));
      MPI_Bcast(data.data() + at, count, MPI_BYTE, root, MPI_COMM_WORLD);
    }
  }

  void Barrier() override { MPI_Barrier(MPI_COMM_WORLD); }

  void Abort(int code) override { MPI_Abort(MPI_COMM_WORLD, code); }

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
};

}  // namespace

bool MpiBuilt() { return true; }

std::shared_ptr<Collective> MpiWorld() {
  static std::mutex mu;
  static std::shared_ptr<Collective> world;
  std::lock_guard lock(mu);
  if (!world) world = std::make_shared<Mpi>();
  return world;
}

}  // namespace recflow::train
