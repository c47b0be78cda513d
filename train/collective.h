// Collective: the operations data-parallel training needs between the
// ranks of one job, Horovod's model — every rank runs the same training
// loop on its own share of the input, and the ranks meet in collectives:
// the gradients' all-reduce each step, the stop decision, the restored
// checkpoint's broadcast, the evaluation metrics' reduction.
//
//   mpirun -np 4 recflow train ...        (tools/, one rank per process)
//   auto world = MpiWorld();              (C++: MPI_Init on first use)
//   Estimator est(model_fn, config, {.collective = world});
//
// Implementations: LocalCollective() (a world of one: every operation
// returns its input) and MpiWorld() (MPI_COMM_WORLD of the processes
// mpirun launched; MPI's own all-reduce and broadcast, no home-made
// protocol).  The NCCL implementation for the CUDA backend takes device
// memory (docs/DISTRIBUTED.md).
//
// Contract: a collective is entered by every rank of the world, in the
// same order, with the same sizes; a rank that would leave the others
// waiting (an exception in its loop) calls Abort(), which ends the whole
// job.  The buffers are host memory here.  Calls come from one thread at a
// time (MPI is initialised with MPI_THREAD_SERIALIZED).  Errors in MPI end
// the job (MPI_ERRORS_ARE_FATAL): when a rank dies, mpirun ends the others.
#ifndef RECFLOW_TRAIN_COLLECTIVE_H_
#define RECFLOW_TRAIN_COLLECTIVE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace recflow::train {

enum class ReduceOp : uint8_t { kSum, kMax, kMin };

class Collective {
 public:
  virtual ~Collective() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // This rank's index among the ranks on its host (one GPU per local rank),
  // and how many ranks share the host (and its cores).
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;
  // "local" or "mpi".
  virtual std::string name() const = 0;
  // Whether this is the world of a job a launcher started (MPI's), whose
  // gradients go through the all-reduce even with one rank (mpirun -np 1
  // runs the path a job of many runs); false for a process alone
  // (LocalCollective).
  virtual bool launched() const = 0;
  // The chief writes checkpoints and summaries, as TF's chief worker.
  bool is_chief() const { return rank() == 0; }

  // Element-wise over the ranks, in place; every rank gets the result.
  virtual void AllReduce(std::span<float> data, ReduceOp op) = 0;
  virtual void AllReduce(std::span<double> data, ReduceOp op) = 0;
  virtual void AllReduce(std::span<int64_t> data, ReduceOp op) = 0;
  // `root`'s bytes replace `data` on every other rank (any length).
  virtual void Broadcast(std::string& data, int root) = 0;
  virtual void Barrier() = 0;
  // Ends every rank of the job with `code` (MPI_Abort); for a rank whose
  // error would leave the others waiting in a collective.  Returns only
  // in a world of one (nothing to end).
  virtual void Abort(int code) = 0;

  // Helpers over AllReduce.
  int64_t Sum(int64_t v);
  int64_t Max(int64_t v);
  bool Any(bool v) { return Max(v ? 1 : 0) != 0; }
};

// A world of one: rank 0 of 1; every operation leaves its input as it is.
std::shared_ptr<Collective> LocalCollective();

// True when this build has MPI (RECFLOW_MPI), and true when this process
// was started by an MPI launcher (mpirun/mpiexec set its rank in the
// environment: OMPI_COMM_WORLD_SIZE, PMIX_RANK or PMI_SIZE).
bool MpiBuilt();
bool LaunchedByMpi();

// MPI_COMM_WORLD, initialising MPI on the first call (and finalising it at
// exit); the same object afterwards.  Throws Error in a build without MPI.
std::shared_ptr<Collective> MpiWorld();

}  // namespace recflow::train

#endif  // RECFLOW_TRAIN_COLLECTIVE_H_
