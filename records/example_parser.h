// The fast tf.train.Example parser: serialized Examples go straight into
// batch tensors, without building protobuf messages.
//
//   ExampleParser parser(FeatureSpec::FromFile("spec.json"));
//   ParsedBatch batch;
//   parser.ParseBatch(serialized_records, &batch);
//   const ParsedFeature& image = batch.feature("image");  // [batch, 784]
//
// It decodes the wire format itself and gives, for every input protobuf
// accepts, exactly what protobuf's parser plus extraction of the same
// features gives (tests/records/example_parser_test.cc shows it): packed
// and unpacked lists, unknown fields skipped, the last of duplicate keys
// wins, repeated sub-messages merge, and a Feature with none of its three
// lists set counts as missing.  Whatever protobuf rejects it rejects.
//
// Thread safety: a parser is immutable after construction; ParseBatch may
// be called from several threads at once with different outputs.
#ifndef RECFLOW_RECORDS_EXAMPLE_PARSER_H_
#define RECFLOW_RECORDS_EXAMPLE_PARSER_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "records/aligned_buffer.h"
#include "records/errors.h"
#include "records/feature_spec.h"

namespace recflow::records {

// One feature of a parsed batch.  FixedLen: `batch_size * num_elements`
// values, example-major ([batch, shape...]).  VarLen: the values of all
// examples one after another, and row_lengths[i] = how many belong to
// example i (TensorFlow's ragged layout; its sparse indices follow from it).
// Exactly one of floats / ints / bytes is used, per the dtype, in 64-byte
// aligned buffers; bytes values are one contiguous buffer, value k being
// bytes_data[bytes_offsets[k], bytes_offsets[k + 1]).
struct ParsedFeature {
  std::string name;
  FeatureConfig config;
  AlignedVector<float> floats;
  AlignedVector<int64_t> ints;
  std::string bytes_data;
  AlignedVector<uint64_t> bytes_offsets;  // size = values + 1
  AlignedVector<int64_t> row_lengths;     // VarLen, and sequence features
  // Sequence VarLen features only: values per step (row_lengths then
  // counts steps per example).
  AlignedVector<int64_t> step_lengths;

  size_t num_values() const;
  std::string_view bytes_value(size_t k) const {
    return std::string_view(bytes_data)
        .substr(bytes_offsets[k], bytes_offsets[k + 1] - bytes_offsets[k]);
  }
};

struct ParsedBatch {
  int64_t batch_size = 0;
  std::vector<ParsedFeature> features;  // in the spec's (sorted) order
  // Throws std::out_of_range for a name not in the spec.
  const ParsedFeature& feature(std::string_view name) const;
};

// A serialized Example that cannot be parsed with the spec.  The message is
// TensorFlow's, prefixed with where: "FILE: record N: " when the caller
// gave the context.
class ParseError : public Error {
 public:
  using Error::Error;
};

struct ParseContext {
  std::string file;           // "" when unknown
  uint64_t first_record = 0;  // record index of serialized[0] in the file
};

class ExampleParser {
 public:
  // Throws Error for a feature whose dtype an Example cannot hold.
  explicit ExampleParser(FeatureSpec spec);

  const FeatureSpec& spec() const { return spec_; }

  // Makes `out` one feature per spec feature, named and configured as the
  // spec says, as ParseBatch does before it parses: an output shaped for
  // this spec keeps its features (and their buffers); any other is
  // reshaped.  So a caller can lend it buffers before it is parsed into.
  void ShapeOutput(ParsedBatch* out) const;

  // Parses `serialized` into `out`, whose buffers are reused (cleared, not
  // freed) so that a steady stream of batches allocates nothing new.
  // `threads` > 1 parses parts of the batch on that many threads.  Throws
  // ParseError for the first bad example (in batch order).
  void ParseBatch(std::span<const std::string_view> serialized,
                  ParsedBatch* out, const ParseContext& context = {},
                  int threads = 1) const;

 private:
  FeatureSpec spec_;
};

// A parsed batch of tf.train.SequenceExample.  `context` as ParsedBatch.
// `sequence`, one ParsedFeature per feature_list of the sequence spec:
// values of every step of every example one after another; row_lengths[i]
// = the steps of example i (0 when the example has no such list).  A
// FixedLen sequence feature has exactly num_elements values per step; a
// VarLen one also gets step_lengths, the values of each step.
struct ParsedSequenceBatch {
  ParsedBatch context;
  ParsedBatch sequence;
};

class SequenceExampleParser {
 public:
  SequenceExampleParser(FeatureSpec context_spec, FeatureSpec sequence_spec);

  // As ExampleParser::ParseBatch, on one thread.  Throws ParseError.
  void ParseBatch(std::span<const std::string_view> serialized,
                  ParsedSequenceBatch* out,
                  const ParseContext& context = {}) const;

 private:
  FeatureSpec context_spec_;
  FeatureSpec sequence_spec_;
};

}  // namespace recflow::records

#endif  // RECFLOW_RECORDS_EXAMPLE_PARSER_H_
