// The stages behind Dataset's methods (one .cc file each); dataset.cc
// calls these.  Internal to pipeline/.
#ifndef RECFLOW_PIPELINE_STAGES_H_
#define RECFLOW_PIPELINE_STAGES_H_

#include <string>
#include <vector>

#include "pipeline/dataset.h"

namespace recflow::pipeline::stages {

// A dataset with one input; Describe() appends "." + Label() to the
// input's description.
class UnaryDataset : public DatasetBase {
 public:
  explicit UnaryDataset(DatasetPtr input) : input_(std::move(input)) {}
  std::string Describe() const override {
    return input_->Describe() + "." + Label();
  }
  virtual std::string Label() const = 0;
  const DatasetPtr& input() const { return input_; }

 protected:
  DatasetPtr input_;
};

// records::ExpandRecordPaths, its errors as Errors prefixed with `who`.
std::vector<std::string> ExpandFiles(const std::vector<std::string>& paths,
                                     std::string_view who);
// A fingerprint of a file list, for descriptions.
uint64_t FilesFingerprint(const std::vector<std::string>& files);
// Makes `out` the element {"record": record} from `path` at `offset`, the
// `index`-th record of its file (reusing out's component vector).
void SetRecord(Element* out, Tensor record,
               const std::shared_ptr<const std::string>& path, uint64_t offset,
               uint64_t index);

// Copies records into shared 1 MiB chunks: one allocation per chunk, not
// per record.  Records over a quarter chunk get their own buffer.
class RecordArena {
 public:
  Tensor Copy(std::string_view r);

 private:
  static constexpr size_t kChunkBytes = size_t{1} << 20;
  std::shared_ptr<records::AlignedVector<char>> chunk_;
  size_t used_ = 0;
};

// sources.cc
DatasetPtr TensorSlices(Element arrays);
DatasetPtr Range(int64_t start, int64_t stop, int64_t step);
DatasetPtr Generator(GeneratorFn fn, std::string name);
DatasetPtr Csv(std::vector<std::string> files, CsvOptions options);

// tfrecord_dataset.cc
DatasetPtr TFRecord(std::vector<std::string> files, TFRecordOptions options);
// Non-null when `d` is a TFRecord source with at least `num_shards` files:
// the source reading files index, index + num_shards, ...
DatasetPtr ShardTFRecordFiles(const DatasetPtr& d, int64_t num_shards,
                              int64_t index);

// global_shuffle.cc
DatasetPtr GlobalShuffle(std::vector<std::string> files,
                         GlobalShuffleOptions options);

// map.cc
DatasetPtr Map(DatasetPtr input, MapFn fn, MapOptions options);

// parse.cc
DatasetPtr Parse(DatasetPtr input, records::FeatureSpec spec,
                 ParseOptions options);

// transforms.cc
DatasetPtr Filter(DatasetPtr input, PredicateFn fn, std::string name);
DatasetPtr Repeat(DatasetPtr input, int64_t count);
DatasetPtr Take(DatasetPtr input, int64_t count);
DatasetPtr Skip(DatasetPtr input, int64_t count);
DatasetPtr Shard(DatasetPtr input, int64_t num_shards, int64_t index);
DatasetPtr IgnoreErrors(DatasetPtr input);

// batch.cc
DatasetPtr Batch(DatasetPtr input, int64_t batch_size, bool drop_remainder);
DatasetPtr PaddedBatch(DatasetPtr input, int64_t batch_size,
                       PaddedBatchOptions options);
DatasetPtr Unbatch(DatasetPtr input);

// shuffle.cc
DatasetPtr Shuffle(DatasetPtr input, int64_t buffer_size,
                   std::optional<uint64_t> seed, bool reshuffle);

// interleave.cc
DatasetPtr Interleave(DatasetPtr input, InterleaveFn fn, int64_t cycle_length,
                      int64_t block_length, std::string name);

// prefetch.cc
DatasetPtr Prefetch(DatasetPtr input, int64_t buffer_size, uint64_t max_bytes);

// cache.cc
DatasetPtr Cache(DatasetPtr input, std::string filename);

// A seed given, or a random one.
uint64_t SeedOrRandom(const std::optional<uint64_t>& seed);

}  // namespace recflow::pipeline::stages

#endif  // RECFLOW_PIPELINE_STAGES_H_
