// Random access to the records of TFRecord files: a map-style dataset.
//
//   TFRecordDataSource source(records::ExpandRecordPaths({"data/"}), spec);
//   source.size();                                  // every record
//   const uint64_t rows[] = {17, 3, 99};
//   Element batch = source.Get(rows, /*batched=*/true);
//
// Record i is the i-th of the files taken one after another, in the order
// given.  This is what PyTorch's map-style Dataset (len, [i]) and Grain's
// data sources offer, and what a sampler of the caller's own needs (a
// DistributedSampler, a weighted one, an evaluation of chosen records).
// The pipeline's global shuffle (FromTFRecordsGlobalShuffle) is the
// streaming form of the same reads.
//
// Indexes: each file's FILE.idx when it exists (checked to reach the end
// of the file), else one built by reading the file once, when the source
// is made (the log says so; `recflow index` writes one).  Uncompressed
// files and recflow's ZSTD files can be read at random; ZLIB and GZIP
// streams cannot be entered in the middle (Error naming the file).
//
// Reads: the records of one Get in uncompressed files are read with every
// read in flight at once (ReadRanges: one io_uring submission on the
// calling thread, or a pread each where io_uring is unavailable); records
// that lie near one another in a file (a run of neighbours, a repeat, gaps
// of up to 4 KiB) share one read, so a slice reads as fast as a stream.  A ZSTD
// record decodes its frame (the last frame decoded in each file is kept,
// so records read in file order decode each frame once).  Both CRCs are
// checked on every read, as every reader of recflow checks them.
// Files are opened at their first read and stay open while the source
// lives (one descriptor each).
//
// Thread safety: every method may be called from any number of threads at
// once (ZSTD reads of one file take turns).
#ifndef RECFLOW_PIPELINE_DATA_SOURCE_H_
#define RECFLOW_PIPELINE_DATA_SOURCE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "pipeline/tensor.h"
#include "records/feature_spec.h"
#include "records/file.h"

namespace recflow::pipeline {

namespace stages {
struct ParseInfo;  // stages.h
}  // namespace stages

class TFRecordDataSource {
 public:
  // `files`: record files as given (expand globs and directories first
  // with records::ExpandRecordPaths).  With `spec`, Get parses the records
  // (tf.io.parse_example) and returns their features; without it, the
  // serialized records, as the bytes component "record".
  // Throws records::IoError (a file that cannot be opened, or is not a
  // regular file), records::RecordError (a damaged file being indexed),
  // records::Error (an index that does not match its file, a ZLIB or GZIP
  // file) and pipeline::Error (no files).
  explicit TFRecordDataSource(
      std::vector<std::string> files,
      std::optional<records::FeatureSpec> spec = std::nullopt);
  ~TFRecordDataSource();
  TFRecordDataSource(const TFRecordDataSource&) = delete;
  TFRecordDataSource& operator=(const TFRecordDataSource&) = delete;

  // Records in all the files.
  uint64_t size() const { return total_; }
  const std::vector<std::string>& files() const { return files_; }
  const std::optional<records::FeatureSpec>& spec() const { return spec_; }

  // Where record i lies: the file (its number in files()), the record's
  // number in that file and the byte offset of its frame (uncompressed:
  // in the file; ZSTD: in its zstd frame's decoded content).  Throws
  // std::out_of_range for i >= size().
  struct Location {
    size_t file = 0;
    uint64_t record = 0;
    uint64_t offset = 0;
  };
  Location Locate(uint64_t i) const;

  // Records `indices`, in that order (repeats allowed).  batched: one
  // element whose components have the records as their first dimension
  // ([n], a parsed batch as Batch then Parse would give it, ragged for
  // VarLen features), and whose batch_origins name each record's file,
  // offset and number there; n may be 0.  Not batched: `indices` holds one
  // record, and the element is that record alone (as Parse gives one),
  // its origin set.  Throws std::out_of_range for an index >= size(),
  // records::RecordError naming the file, offset and record when its bytes
  // are not that record (damage, or a file changed since it was indexed),
  // records::IoError, records::ParseError naming the record and feature,
  // and pipeline::Error for `indices` not of one record when not batched.
  Element Get(std::span<const uint64_t> indices, bool batched) const;

 private:
  struct File;
  // Opens file `file` once (any thread): its ReadableFile, or null for a
  // ZSTD file, whose IndexedReader (File::zstd) it makes instead.
  const records::ReadableFile* Open(size_t file) const;
  // The payloads of `indices` into `*views`, kept alive by `*owner`.
  void Read(std::span<const uint64_t> indices,
            std::vector<std::string_view>* views,
            std::vector<BatchOrigins::Row>* rows,
            std::shared_ptr<const void>* owner) const;

  std::vector<std::string> files_;
  std::shared_ptr<const BatchOrigins::Files> names_;
  std::vector<std::unique_ptr<File>> file_state_;
  std::vector<uint64_t> starts_;  // record number of each file's first
  uint64_t total_ = 0;
  std::optional<records::FeatureSpec> spec_;
  std::shared_ptr<const stages::ParseInfo> parse_;
};

}  // namespace recflow::pipeline

#endif  // RECFLOW_PIPELINE_DATA_SOURCE_H_
