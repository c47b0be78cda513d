// Checkpoints: named tensors (variables, optimizer slots, the global step,
// the input iterator's state) in one file, and TensorFlow's `checkpoint`
// state file naming the latest and the kept ones.
//
// File format (docs/FORMATS.md): magic "RFCKPT01", a little-endian u64
// entry count, entries (name, dtype, shape, values, each followed by the
// masked CRC-32C of the entry), and a footer "RFCKEND!" + the count again,
// so that truncation and any flipped bit are found.  Files are written
// atomically: a temporary name, fsync, rename, fsync of the directory.
// A crash at any point leaves the previous checkpoint and state intact.
//
// Not thread-safe; one trainer owns a model_dir.
#ifndef RECFLOW_TRAIN_CHECKPOINT_H_
#define RECFLOW_TRAIN_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pipeline/tensor.h"
#include "train/error.h"

namespace recflow::train {

using TensorMap = std::map<std::string, pipeline::Tensor>;

// Numeric tensors only (float32, float64, int32, int64, uint8).  Throws
// records::IoError (disk) or Error (a bytes tensor).
void WriteCheckpoint(const std::string& path, const TensorMap& tensors);
// Verifies every CRC.  Throws records::IoError, or Error naming the file,
// the byte offset and the entry of the first damage.  `bytes` (optional)
// receives the file's bytes as read (what a chief sends other ranks).
TensorMap ReadCheckpoint(const std::string& path, std::string* bytes = nullptr);
// The same from a checkpoint's bytes; `path` is for messages.
TensorMap ParseCheckpoint(std::string_view data, const std::string& path);

// The checkpoint names in a `checkpoint` state file's text, oldest first
// (the latest last).  Throws Error naming `path` and the line for anything
// that is not TensorFlow's format, so a damaged state file is never taken
// for "no checkpoints" (which would start training afresh).
std::vector<std::string> ParseCheckpointState(std::string_view text,
                                              const std::string& path);

// The checkpoints of a model_dir: "model.ckpt-<step>" files and the
// `checkpoint` state file in TensorFlow's text format:
//   model_checkpoint_path: "model.ckpt-2000"
//   all_model_checkpoint_paths: "model.ckpt-1000"
//   all_model_checkpoint_paths: "model.ckpt-2000"
class CheckpointManager {
 public:
  // keep_max <= 0 keeps all.
  CheckpointManager(std::string model_dir, int keep_max);

  // Writes model.ckpt-<step>, then the state file, then removes the
  // oldest beyond keep_max.  Returns the checkpoint's path.
  std::string Save(int64_t step, const TensorMap& tensors);
  // Kept checkpoints, oldest first, as paths (from the state file; empty
  // when there is none).
  std::vector<std::string> Checkpoints() const;
  std::optional<std::string> Latest() const;

  struct Restored {
    std::string path;
    TensorMap tensors;
  };
  // The newest checkpoint that reads back intact; each damaged or missing
  // newer one is reported through `warn` and skipped.  nullopt when there
  // are none; Error when there are some but none is readable.  `bytes`
  // (optional) receives the restored file's bytes (ReadCheckpoint).
  std::optional<Restored> RestoreLatest(
      const std::function<void(std::string_view)>& warn,
      std::string* bytes = nullptr) const;

  const std::string& model_dir() const { return dir_; }

 private:
  void WriteState(const std::vector<std::string>& names) const;
  std::vector<std::string> ReadState() const;  // file names, oldest first

  std::string dir_;
  int keep_max_;
};

// The step of "model.ckpt-<step>", or -1.
int64_t CheckpointStep(std::string_view path);

}  // namespace recflow::train

#endif  // RECFLOW_TRAIN_CHECKPOINT_H_
