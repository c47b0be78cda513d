// recflow::convert: datasets (CSV, JSON Lines, NumPy .npy/.npz, IDX,
// image folders, or any pipeline::Dataset) into sharded TFRecord files of
// tf.train.Example, for any C++ program, the `recflow convert` command and
// the Python module.
//
//   convert::ConvertJob job;
//   job.format = "csv";
//   job.inputs.files = {"people.csv"};
//   job.output = "out/people";            // out/people-00000-of-00004.tfrecord
//   job.shards = 4;
//   job.writer.build_index = true;        // out/people-...tfrecord.idx
//   convert::ConvertSummary s = convert::Convert(job);
//
// Contract of a conversion (Convert):
// - Threads: one thread reads the input; Examples are built on every core
//   (oneTBB) and the shards written side by side by up to `threads`
//   threads.  The typing pass of CSV and JSON Lines, before, reads on one
//   thread and types the rows on every core.  Convert itself is called
//   from one thread; separate jobs may run at once.
// - Atomicity: every shard, its index and the images' labels file are
//   written under temporary names and appear together when the job
//   succeeds; on any error none appears and no temporary file is left.
// - Order: rows keep their input order within a shard; chunks of 256 rows
//   go round-robin to the shards.
// - Earlier files: a shard replaced under its name loses its old index
//   with it; shards of the prefix by another count or compression stay,
//   named in ConvertSummary::warnings (OtherShardsWarning).
// - Errors: ConvertError names the file and the line, row or member, and
//   what was expected.  A row-level error (one bad row) ends the job
//   unless `skip_bad`, which counts the row and skips it; an error that
//   makes the whole input unusable always ends it.  records::IoError and
//   records::Error for failing reads and writes.
#ifndef RECFLOW_CONVERT_CONVERT_H_
#define RECFLOW_CONVERT_CONVERT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "pipeline/dataset.h"
#include "records/errors.h"
#include "records/example_builder.h"
#include "records/feature_spec.h"
#include "records/tfrecord_reader.h"
#include "records/tfrecord_writer.h"

namespace recflow::convert {

// A bad input: names the file and the line, row or member, and what was
// expected.  row_level(): the error concerns one row, which `skip_bad`
// may skip.
// A sibling of records::Error under recflow::Error (records/errors.h).
class ConvertError : public recflow::Error {
 public:
  ConvertError(std::string what, bool row_level)
      : recflow::Error(std::move(what)), row_level_(row_level) {}
  bool row_level() const { return row_level_; }

 private:
  bool row_level_;
};

// One row of input on its way to an Example.  Sources whose rows are cheap
// to turn into Examples build them while reading (`built`); CSV and JSON
// Lines hand over the raw row, and Build() runs on worker threads.
struct Row {
  std::vector<std::string> fields;  // csv: the cells
  std::string text;                 // jsonl: the line
  std::string path;                 // where the row is, for errors
  uint64_t line = 0;
  bool built = false;
  std::string example;  // the serialized Example, once built
  std::string error;    // a row-level error found while reading
};

// A format's reader: rows of one input, in order.
class ExampleSource {
 public:
  virtual ~ExampleSource() = default;
  // Reads the next row, on one thread.  Returns false at the end.  A bad
  // row is returned with `error` set (the source moves past it); errors
  // that make the input unusable throw ConvertError.
  virtual bool NextRow(Row* row) = 0;
  // Turns a row that is not `built` into an Example.  Thread-safe: called
  // from several threads at once.  Throws ConvertError (row-level) for a
  // bad row.
  virtual void Build(const Row& row, records::ExampleBuilder* builder) const;
  // The number of rows, when known before reading (for balanced shards
  // and an ETA), counting rows that may turn out bad.
  virtual std::optional<uint64_t> rows() const { return std::nullopt; }
  // Bytes of input consumed so far, and in all (for progress).  Like
  // NextRow, on the reading thread: bytes_read changes as rows are read.
  virtual uint64_t bytes_read() const = 0;
  virtual uint64_t total_bytes() const = 0;
  // What the user should hear about the input that is no error (a key
  // with no value to type it by; integers a float feature rounds), each
  // naming where.  Final once the source is open (CSV and JSON Lines read
  // the whole input first, to type it).
  virtual std::vector<std::string> warnings() const { return {}; }

  // Rows whose records NextRow builds (`built`) and are longer than this
  // are row-level errors (ConvertJob::max_record_bytes, which
  // ConvertSource sets here before the first NextRow; Build()'s records
  // are checked by the job).
  void set_max_record_bytes(uint64_t n) { max_record_bytes_ = n; }
  uint64_t max_record_bytes() const { return max_record_bytes_; }

 private:
  uint64_t max_record_bytes_ = records::kDefaultMaxRecordBytes;
};

struct ConvertInputs {
  std::vector<std::string> files{};  // csv, jsonl, npy, npz, images (dir)
  std::string images{}, labels{};    // idx
  // Optional dtypes of csv columns and jsonl keys (others are inferred);
  // must outlive the source.
  const records::FeatureSpec* spec = nullptr;
  // csv: the field delimiter (records::CheckCsvDelimiter; '\t' for TSV).
  char delimiter = ',';
  // csv, jsonl: a row (a CSV record's cells and delimiters, a JSON line)
  // longer than this is an error that ends the conversion, with the file
  // read no further (records::kDefaultMaxRowBytes): a quote never closed
  // or a file without line ends would otherwise be held whole in memory.
  uint64_t max_row_bytes = records::kDefaultMaxRowBytes;
};

// The formats: "csv", "jsonl", "npy", "npz", "idx", "images".
inline constexpr std::string_view kFormats[] = {"csv", "jsonl", "npy",
                                                "npz", "idx",   "images"};

struct ConvertProgress;  // below

// Opens the source of `format` over `inputs`.  Throws ConvertError for an
// unknown format or unusable inputs, records::IoError for an input that is
// not a regular file (records::RequireRegularFiles).  `typing`, when set,
// is called during the typing pass of CSV and JSON Lines (reports with
// `typing` true, every few thousand rows, in input order, one call at a
// time, on any of oneTBB's threads).  An
// exception it throws ends the pass and leaves OpenSource.
std::unique_ptr<ExampleSource> OpenSource(
    const std::string& format, const ConvertInputs& inputs,
    const std::function<void(const ConvertProgress&)>& typing = {});

// The shard naming of TensorFlow's and Beam's writers:
// PREFIX-00003-of-00008.tfrecord plus the compression's suffix.
std::string ShardName(const std::string& prefix, uint64_t shard,
                      uint64_t shards, std::string_view suffix);
// Shards of `prefix` by another count or compression than the ones just
// written (ShardName(prefix, i, shards, suffix)): an earlier run's,
// which a glob PREFIX-* reads with the new shards.  A warning naming
// them (the first three, then how many more), or none; none too when
// the folder cannot be listed.
std::optional<std::string> OtherShardsWarning(const std::string& prefix,
                                              uint64_t shards,
                                              std::string_view suffix);
// What is wrong with `prefix` as the shards' prefix, or none: an empty one,
// or one ending in '/' (a folder), would name the shards "-00000-of-...",
// which a shell takes for an option.  Worded to follow the option's name
// ("--output is empty: ...").
std::optional<std::string> ShardPrefixProblem(const std::string& prefix,
                                              uint64_t shards);

struct ShardResult {
  std::string path;
  uint64_t records;
  uint64_t bytes;  // file bytes
};

// Where a conversion stands.  bytes_read is the source's, taken on the
// reading thread when the last chunk handed over was read: it never falls,
// and is total_bytes once the input is read to its end.
struct ConvertProgress {
  uint64_t records = 0;  // handed to the writers so far (typing: rows read)
  uint64_t bytes_read = 0;
  uint64_t total_bytes = 0;
  // true: a report of the typing pass of CSV and JSON Lines, which reads
  // every row to type the columns before any is converted.  Its reports
  // come first, within Convert()'s call (OpenSource says on which
  // threads); then the counts start again for the conversion.
  bool typing = false;
};

struct ConvertJob {
  std::string format;
  ConvertInputs inputs;
  std::string output;  // the shards' prefix (ShardName)
  uint64_t shards = 1;
  records::WriterOptions writer;  // compression; build_index: FILE.idx too
  int threads = 0;                // writer threads (0: one per core)
  // ZSTD: frames compressed at once per shard (writer.compression_threads
  // is replaced by it); 0: the cores the writer threads leave, cores /
  // min(shards, threads), at least 1.
  int compression_threads = 0;
  bool skip_bad = false;
  // A row whose record (its serialized Example) is longer than this is a
  // row-level error naming the row, which skip_bad skips: protobuf parses
  // no message of 2 GiB or more, and readers refuse longer records unless
  // told (records::ReaderOptions::max_record_bytes, the same default), so
  // such a record could be written but never read back.
  uint64_t max_record_bytes = records::kDefaultMaxRecordBytes;
  // Called after each chunk of rows is handed to the writers, in input
  // order, one call at a time, on any of the job's threads.  The source
  // reads on meanwhile, maybe on another thread: hence a snapshot, not the
  // source.  CSV and JSON Lines report their typing pass first
  // (ConvertProgress::typing).
  std::function<void(const ConvertProgress& progress)> progress;
};

struct ConvertSummary {
  uint64_t records = 0;
  uint64_t skipped = 0;
  uint64_t bytes = 0;
  // The whole conversion's: Convert() counts the source's opening too,
  // which for CSV and JSON Lines is a pass over every row to type the
  // columns.
  double seconds = 0;
  std::vector<ShardResult> shards;
  std::string first_skipped;          // the first skipped row's error
  std::string labels_file;            // images only
  std::vector<std::string> warnings;  // ExampleSource::warnings()
};

// Runs a whole conversion (the contract above).
ConvertSummary Convert(const ConvertJob& job);

// A pipeline's elements as records (ConvertDataset).
struct DatasetRecords {
  // Empty: each element becomes a tf.train.Example, a feature per
  // component, its values flattened (a ragged component's without its row
  // lengths): float32 -> float_list; float64 -> float_list (a value
  // outside float32's range is a row-level error); int32, int64, uint8 ->
  // int64_list; bytes -> bytes_list.  Batched elements make an Example
  // per batch: Unbatch first for one per row.
  // Not empty: the bytes scalar component of that name is the record,
  // written as it is (tf.data.experimental.TFRecordWriter's rule; an
  // element without one is a row-level error): "record" after
  // FromTFRecords makes a shuffled, filtered or sampled reshard.
  std::string record_key;
  // Each element as it is, an element record (pipeline::
  // EncodeElementRecord: names, dtypes, shapes, ragged rows and values,
  // exactly), which maps::DecodeElement reads back; its origin is left
  // out.  Python's Dataset.save.  Not with record_key.
  bool element_records = false;
  int threads = 0;  // the pipeline iterator's (0: every core)
};

// Runs `dataset` once and writes each element as a record into job's
// shards, with Convert's contract (atomic shards, round-robin chunks,
// skip_bad for row-level errors); a pipeline error (a damaged input file)
// ends the job, writing nothing.  job.format and job.inputs are not used.
ConvertSummary ConvertDataset(const pipeline::Dataset& dataset,
                              const DatasetRecords& records,
                              const ConvertJob& job);

// tf.data's Dataset.save / Dataset.load: a pipeline's elements kept
// exactly (names, dtypes, shapes, ragged rows) in a directory: shards
// DIR/elements-00000-of-0000N.tfrecord (plus the compression's suffix) of
// element records (DatasetRecords::element_records), each with its index,
// and DIR/dataset.json, written once every shard is in place: the format,
// the element count, the shards and the saved pipeline's description.
struct SaveOptions {
  uint64_t shards = 1;
  records::Compression compression = records::Compression::kNone;
  int level = 0;    // the compression's (0: its default)
  int threads = 0;  // the pipeline iterator's (0: every core)
  // As ConvertJob::progress; an exception it throws ends the save, which
  // then leaves nothing.
  std::function<void(const ConvertProgress& progress)> progress = {};
};
// Runs `dataset` once into `directory` (created if missing).  A directory
// that already holds a saved dataset (its dataset.json) is refused with
// ConvertError: nothing is overwritten.  An error writes no dataset.json.
ConvertSummary SaveDataset(const pipeline::Dataset& dataset,
                           const std::string& directory,
                           const SaveOptions& options = {});
// What SaveDataset kept, read back: its shards in order (with `reading`'s
// options: parallel reads, shuffled files), each record decoded
// (pipeline::maps::DecodeElement, on `num_parallel_calls` calls), with
// Cardinality() the count saved, checked as it is read
// (Dataset::AssertCardinality: a shard cut short at a record's end is an
// Error, not fewer elements).  ConvertError for a directory without a
// dataset.json, one of another format, or a shard it names that is gone.
struct LoadOptions {
  pipeline::TFRecordOptions reading = {};
  // Set: the shards read through FromTFRecordsGlobalShuffle with these
  // options instead (every element once per epoch, in a uniform random
  // order, by the indexes saved with them; `reading` is not used).  The
  // count is then checked as the dataset is made, by the indexes.
  std::optional<pipeline::GlobalShuffleOptions> global_shuffle = {};
  int num_parallel_calls = 1;
};
pipeline::Dataset LoadDataset(const std::string& directory,
                              const LoadOptions& options = {});

// For the images format: the class names in label order (sorted folder
// names), written beside the shards as PREFIX-labels.txt ("0:name" lines,
// as TF-slim writes).  Throws ConvertError.
std::vector<std::string> ImageClassNames(const std::string& directory);

}  // namespace recflow::convert

#endif  // RECFLOW_CONVERT_CONVERT_H_
