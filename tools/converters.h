// The input formats of `recflow convert`: each turns its input into rows,
// each row one tf.train.Example.  Sources are read on one thread; building
// and writing the Examples is spread over the cores by convert.cc.
#ifndef RECFLOW_TOOLS_CONVERTERS_H_
#define RECFLOW_TOOLS_CONVERTERS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "records/example_builder.h"
#include "records/feature_spec.h"
#include "records/tfrecord_writer.h"
#include "tools/cli.h"

namespace recflow::tools {

// A bad input: names the file and the line, row or member, and what was
// expected.  With --skip-bad a row's error is counted and the row skipped;
// errors that make the whole input unusable are never skipped.
class ConvertError : public std::runtime_error {
 public:
  ConvertError(std::string what, bool row_level)
      : std::runtime_error(std::move(what)), row_level_(row_level) {}
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

class ExampleSource {
 public:
  virtual ~ExampleSource() = default;
  // Reads the next row, on the one reading thread.  Returns false at the
  // end.  A bad row is returned with `error` set (the source moves past
  // it); errors that make the input unusable throw ConvertError.
  virtual bool NextRow(Row* row) = 0;
  // Turns a row that is not `built` into an Example.  Called from several
  // threads at once.  Throws ConvertError (row-level) for a bad row.
  virtual void Build(const Row& row, records::ExampleBuilder* builder) const;
  // The number of rows, when known before reading (for balanced shards
  // and an ETA), counting rows that may turn out bad.
  virtual std::optional<uint64_t> rows() const { return std::nullopt; }
  // Bytes of input consumed so far, and in all (for the progress line).
  virtual uint64_t bytes_read() const = 0;
  virtual uint64_t total_bytes() const = 0;
};

struct ConvertInputs {
  std::vector<std::string> files;  // csv, jsonl, npy, npz, images (dir)
  std::string images, labels;      // idx
  const records::FeatureSpec* spec = nullptr;  // optional types for csv/jsonl
};

// "csv", "jsonl", "npy", "npz", "idx", "images".  Throws ConvertError for
// an unknown format or unusable inputs.
std::unique_ptr<ExampleSource> OpenSource(const std::string& format,
                                          const ConvertInputs& inputs);

// A whole conversion: the input's rows into `shards` shards named
// ShardName(output, ...), written side by side on up to `threads` threads
// (0: one per core), all committed together at the end or none; with
// writer.build_index an index beside each shard; for images the labels
// file.  Throws ConvertError (bad input), IoError, Error.
struct ConvertJob {
  std::string format;
  ConvertInputs inputs;
  std::string output;
  uint64_t shards = 1;
  records::WriterOptions writer;
  int threads = 0;
  bool skip_bad = false;
};

struct ConvertSummary {
  uint64_t records = 0;
  uint64_t skipped = 0;
  uint64_t bytes = 0;
  double seconds = 0;
  std::vector<ShardResult> shards;
  std::string first_skipped;  // the first skipped row's error
  std::string labels_file;    // images only
};

ConvertSummary Convert(const ConvertJob& job);

// For the images format: the class names in label order, written beside
// the shards as PREFIX-labels.txt ("0:name" lines, as TF-slim writes).
std::vector<std::string> ImageClassNames(const std::string& directory);

}  // namespace recflow::tools

#endif  // RECFLOW_TOOLS_CONVERTERS_H_
