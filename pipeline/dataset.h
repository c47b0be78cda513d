// Dataset and Iterator: recflow's input pipeline, with tf.data's semantics.
//
//   auto ds = Dataset::FromTFRecords({"data/train-*.tfrecord"},
//                                    {.num_parallel_reads = 4})
//                 .Shuffle(10'000, /*seed=*/7)
//                 .Batch(256, /*drop_remainder=*/true)
//                 .Parse(FeatureSpec::FromFile("spec.json"))
//                 .Prefetch(2);
//   Iterator it = ds.MakeIterator({.threads = 4});
//   Element batch;
//   while (it.Next(&batch)) Train(batch["image"], batch["label"]);
//
// A Dataset is an immutable description, cheap to copy and safe to share
// between threads; each transformation returns a new one.  An Iterator runs
// it: stages pull from their inputs, parallel stages run in a oneTBB task
// arena of the size IteratorOptions::threads sets, and every buffer is
// bounded, so a slow consumer slows the producers.  The order of elements
// depends only on the inputs and seeds, never on thread timing, unless a
// stage is told `deterministic = false`.
//
// Save() captures the iterator's position in a blob; Restore() on an
// iterator of the same pipeline (in this process or another) continues the
// same stream.  User functions (Map, Filter, Interleave, generators) must
// be deterministic for that to hold.
#ifndef RECFLOW_PIPELINE_DATASET_H_
#define RECFLOW_PIPELINE_DATASET_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pipeline/dataset_base.h"
#include "pipeline/io.h"
#include "pipeline/tensor.h"
#include "records/compression.h"
#include "records/feature_spec.h"
#include "records/input_stream.h"

namespace recflow::pipeline {

// num_parallel_calls: use as many threads as the iterator's arena has.
// Prefetch's buffer_size: a buffer that starts at one element and deepens
// while the consumer runs it dry after bursts (AsyncIterator::Config::
// autotune), up to kAutotunePrefetchElements elements and max_bytes
// (kAutotunePrefetchBytes when 0).
inline constexpr int kAutotune = -1;
inline constexpr int64_t kAutotunePrefetchElements = 64;
inline constexpr uint64_t kAutotunePrefetchBytes = uint64_t{256} << 20;

struct TFRecordOptions {
  // std::nullopt: detected per file (records::DetectCompression).
  std::optional<records::Compression> compression;
  // Files read at once; their records are interleaved in a fixed
  // round-robin order (tf.data's num_parallel_reads: an interleave with
  // cycle_length = num_parallel_reads), block_length records from each file
  // in turn (tf.data's interleave block_length).  kAutotune: one file per
  // core of this machine, at most one per file (tf.data's AUTOTUNE cycle
  // length), fixed when the dataset is made; the order then depends on
  // the machine's core count (not on the iterator's threads), as
  // tf.data's does: give a number for an order that is the same
  // everywhere.
  int num_parallel_reads = 1;
  int block_length = 1;
  // With more than one, the files are read at once: as stages, each
  // open file and as many upcoming ones (tf.data's future inputs) ahead
  // on a thread of its own (up to 8,192 records a file, 1,024 when
  // uncompressed, and 256 MiB of records in all); fused (Parse after
  // Batch), by the fused path's reader tasks, also with one parse call.
  // The order, the errors' places and the states are those of reading in
  // turn.
  //
  // false (tf.data's deterministic=false): when the file whose turn it is
  // has no record read yet, take the next record of another open file that
  // has one; each file's records keep their order, the interleaving then
  // depends on timing.  (A file that has a shuffle buffer counts as having
  // one when its reader has: drawing may read more.)  States save and
  // restore exactly in both modes.
  bool deterministic = true;
  // Shuffle the order of the files, afresh each epoch (under Repeat) when
  // reshuffle_each_iteration.  No seed: a random one, kept in the state.
  bool shuffle_files = false;
  // > 0: each file's records pass through a shuffle buffer of this many
  // records of its own before the interleave, as tf.data's
  // `files.interleave(lambda f: TFRecordDataset(f).shuffle(n), ...)`.
  // The order is exactly that of
  // FromTensorSlices(files).Interleave(f -> FromTFRecords({f}).Shuffle(n,
  // stages::FileShuffleSeed(epoch_seed, i), false), num_parallel_reads,
  // block_length) where i is the file's place in the expanded list and
  // epoch_seed is `seed` (no seed: a random one, kept in the state),
  // mixed with the epoch's salt when reshuffle_each_iteration: the same
  // seed gives the same order at every thread count.  It is not the order
  // of one Shuffle(n * num_parallel_reads) after the interleave, though a
  // record moves as far: 16 files of 3,750 records, n = 625, the mean
  // distance from a record's unshuffled place was 6,655 positions against
  // 6,688 under Shuffle(10,000), with the same 5th and 95th percentiles.
  // What differs is a batch's mix of files: the interleave takes the
  // files in turn (16 of each in a batch of 256 there), where one buffer's
  // mix varies (up to 32 of one file).  What it buys: under a fused
  // Parse(Batch(...)) the reader tasks shuffle, on every core, where a
  // Shuffle stage is drawn from on one thread (docs/PERFORMANCE.md).  A
  // file's read error comes after the records buffered before it were
  // drawn (nothing buffered is lost); the state saves each open file's
  // buffer (40 bytes a record read back by reference, as Shuffle's).
  // Files are then read in one piece (not by index ranges).
  int64_t shuffle_buffer_per_file = 0;
  std::optional<uint64_t> seed;
  bool reshuffle_each_iteration = true;
  bool verify_checksums = true;
  uint64_t max_record_bytes = uint64_t{2} << 30;
  // How uncompressed files are read (io.h).
  IoOptions io;
};

struct GlobalShuffleOptions {
  std::optional<uint64_t> seed;  // no seed: a random one, kept in the state
  bool reshuffle_each_iteration = true;
  // This reader's part: positions shard_index, shard_index + num_shards,
  // ... of each epoch's permutation.
  int64_t num_shards = 1;
  int64_t shard_index = 0;
  bool verify_checksums = true;
  // Epochs read by this source (-1: without end).  Unlike Repeat(), the
  // shards' stride runs on across epoch boundaries (global_shuffle.cc), so
  // readers that each took k records have together taken exactly the first
  // num_shards * k positions of the epochs' stream: data-parallel ranks
  // stay in step however num_shards divides the records, and a state
  // restores exactly with another num_shards.  Each epoch has its own
  // order when reshuffle_each_iteration.
  int64_t num_epochs = 1;
};

// Dataset::SampleFromDatasets: tf.data's sample_from_datasets.
struct SampleOptions {
  // weights[i]: the relative chance of drawing from input i (finite, >= 0,
  // not all 0; they need not sum to 1).  Empty: every input alike.  An
  // input of weight 0 is never read.
  std::vector<double> weights = {};
  // No seed: a random one per Iterator, kept in its state.
  std::optional<uint64_t> seed = std::nullopt;
  // true: the draws end when the input drawn has ended.  false (tf.data's
  // default): the draws go on among the inputs left, their weights
  // renormalised, until every input of weight > 0 has ended.
  bool stop_on_empty_dataset = false;
  // true: each epoch (under Repeat) draws another sequence; false
  // (tf.data's default): every epoch of one Iterator draws the same.
  bool rerandomize_each_iteration = false;
};

struct MapOptions {
  // 1: run on the consumer's thread; > 1 or kAutotune: that many calls at
  // once in the task arena.
  int num_parallel_calls = 1;
  // false: deliver results as they finish rather than in input order.
  bool deterministic = true;
  // Shown in statistics and in the pipeline's description.
  std::string name = "map";
};

struct ParseOptions {
  // The component holding serialized tf.Examples: a scalar (one Example)
  // or a vector (a batch, parsed in one vectorised call).
  std::string record_key = "record";
  int num_parallel_calls = 1;
  bool deterministic = true;
  // Keep the serialized records in the output element.
  bool keep_record = false;
};

struct PaddedBatchOptions {
  bool drop_remainder = false;
  // Per component: the padded shape of one element (-1: the longest in the
  // batch).  Components not listed pad every dimension to the longest.
  std::vector<std::pair<std::string, std::vector<int64_t>>> padded_shapes;
  // Per component: the padding value (default 0 / empty bytes).
  std::vector<std::pair<std::string, double>> padding_values;
};

// Dataset::BucketBySequenceLength: tf.data's bucket_by_sequence_length.
struct BucketOptions {
  // Upper length boundaries, increasing: bucket 0 holds lengths below
  // bucket_boundaries[0], bucket i lengths in [boundaries[i-1],
  // boundaries[i]), the last one lengths from the last boundary up.
  std::vector<int64_t> bucket_boundaries = {};
  // The batch size of each bucket (one more than the boundaries).
  std::vector<int64_t> bucket_batch_sizes = {};
  // As PaddedBatchOptions'.
  std::vector<std::pair<std::string, std::vector<int64_t>>> padded_shapes = {};
  std::vector<std::pair<std::string, double>> padding_values = {};
  // The dimensions padded_shapes gives as -1 are padded to the bucket's
  // boundary - 1 instead of the longest in the batch (tf.data pads its
  // elements' unknown dimensions so; recflow has no static shapes, so
  // padded_shapes says which); a length in the last bucket is an Error.
  bool pad_to_bucket_boundary = false;
  // Batch without padding, as Batch does (the elements of a batch must have
  // one shape: serialized records to Parse after, say).
  bool no_padding = false;
  // Drop the buckets left part-full at the end.
  bool drop_remainder = false;
};

// Dataset::GroupByWindow: tf.data's group_by_window.
struct GroupOptions {
  // Drop the groups left part-full at the end (tf.data: a reduce_func
  // that batches with drop_remainder=True).
  bool drop_remainder = false;
  // What stands for the functions in the description and in errors.
  std::string key_name = "key_func";
  std::string window_size_name = "window_size_func";
};

// Dataset::RejectionResample: tf.data's rejection_resample.
struct ResampleOptions {
  // The class distribution wanted: one probability per class (class
  // values 0 .. n-1), each >= 0, summing to 1.
  std::vector<double> target_dist = {};
  // The input's class distribution, if known (as target_dist); empty:
  // estimated as elements come, as tf.data's (counts of the classes seen,
  // each begun at 10).
  std::vector<double> initial_dist = {};
  // No seed: a random one per Iterator, kept in its state.  Each epoch
  // (under Repeat) draws afresh.
  std::optional<uint64_t> seed = std::nullopt;
  // What stands for class_func in the description and in errors.
  std::string class_name = "class_func";
};

// Dataset::Window: tf.data's window.
struct WindowOptions {
  // Input elements between the starts of consecutive windows (0: the
  // window's size, tf.data's default).
  int64_t shift = 0;
  // Input elements between consecutive elements of a window.
  int64_t stride = 1;
  // Drop the windows at the end that have fewer than `size` elements.
  bool drop_remainder = false;
};

// Dataset::Interleave's options (tf.data's interleave arguments).
struct InterleaveOptions {
  // Elements taken from each input's dataset in its turn.
  int64_t block_length = 1;
  // 1: an input's dataset is read in its turn, on the thread that asks
  // for the next element.  > 1 (tf.data's num_parallel_calls): every open
  // input's dataset is read ahead on a thread of its own, at most this
  // many of them inside a read at once (more than cycle_length: every open
  // input at once); kAutotune: cycle_length.
  // An input is opened as soon as the slot it goes to is free, not when
  // that slot's turn comes.  With deterministic, the elements, their order
  // and the places of errors are those of the sequential form.
  int num_parallel_calls = 1;
  // false (tf.data's deterministic=false), with num_parallel_calls > 1:
  // when the input whose turn it is has nothing read yet, take an element
  // (or error) another open input has ready; each input's elements keep
  // their order, the interleaving depends on timing.  States save and
  // restore exactly in both modes.
  bool deterministic = true;
  // With num_parallel_calls > 1, the elements each open input reads
  // ahead (tf.data's buffer_output_elements), kept in the state;
  // kAutotune: up to 1,024 elements and kAutotunePrefetchBytes /
  // cycle_length bytes (what is read stops once they are reached), so
  // that small elements (text lines) pass in runs.
  int64_t buffer_output_elements = kAutotune;
  // Shown in statistics, errors and the pipeline's description.
  std::string name = "interleave";
};

// Dataset::FromTextLines and FromFixedLengthRecords (tf.data's
// TextLineDataset and FixedLengthRecordDataset).
struct PlainFileOptions {
  // zlib, gzip or zstd: every file is one stream of it, decoded whole.
  // std::nullopt: each file's by its name (records::CompressionFromSuffix:
  // .gz, .zz or .zlib, .zst or .zstd; otherwise none), not by its first
  // bytes, which in a text or binary file may look like a codec's magic.
  // (tf.data's compression_type is none unless given.)
  std::optional<records::Compression> compression;
  // Files open at once, their elements taken one from each in turn
  // (tf.data's num_parallel_reads, whose order this is:
  // FromTensorSlices(files).Interleave(f -> one file, num_parallel_reads));
  // kAutotune: one per core of this machine, at most one per file.  More
  // than one: each open file is read (and decoded) ahead on a thread of
  // its own, as Interleave's num_parallel_calls, in the same order.  That
  // pays where an element costs more to read than to hand from thread to
  // thread (about 0.25 us): 1.5-1.8x for gzipped 3,073-byte records on
  // two cores, but 0.63-0.94x for gzipped 50-byte lines there
  // (docs/PERFORMANCE.md).
  int num_parallel_reads = 1;
  // Bytes asked of the file (or decoder) per read (tf.data's
  // buffer_size); a buffer grows to hold a longer line or record.
  size_t buffer_bytes = size_t{256} << 10;
  // FromTextLines: a line whose bytes before its '\n' are more than this
  // is an error that ends its file's reading (the next file follows), as
  // soon as the bytes are read: a file without line ends (binary, or one
  // JSON document) would otherwise be held whole in memory, where
  // tf.data's reader grows without bound.  A line's buffer holds no more
  // than this + 1 bytes.  Not used by FromFixedLengthRecords.
  uint64_t max_line_bytes = records::kDefaultMaxRowBytes;
};

struct CsvOptions {
  // The field delimiter: any byte but a quote, CR or LF ('\t' for TSV).
  char delimiter = ',';
  // Column types by name (float32, int64 or bytes); a name the header
  // lacks is an Error.  Columns not listed are inferred from the first
  // data row: int64, else float32, else bytes.
  std::vector<std::pair<std::string, DType>> column_types;
  // Only these columns, in the header's order (empty: all).
  std::vector<std::string> select_columns;
  // zlib, gzip or zstd (tf.data's compression_type); std::nullopt: each
  // file's by its name's suffix (.gz, .zz or .zlib, .zst or .zstd;
  // otherwise none), as PlainFileOptions::compression.
  std::optional<records::Compression> compression;
  // A row whose cells and delimiters are longer than this is an Error that
  // ends the reading (records::CsvReader; a quote never closed or a file
  // without line ends would otherwise be held whole in memory).
  uint64_t max_row_bytes = records::kDefaultMaxRowBytes;
};

using MapFn = std::function<Element(Element)>;
using PredicateFn = std::function<bool(const Element&)>;
class Dataset;
using InterleaveFn = std::function<Dataset(const Element&)>;
// A generator: called once per iteration (epoch) to make the function
// that returns its elements, std::nullopt at the end.  To be restorable it
// must give the same elements each time it is made.
using GeneratorFn = std::function<std::function<std::optional<Element>()>()>;

class Iterator;

class Dataset {
 public:
  // --- Sources ---
  // The file sources refuse a name that is not a regular file (a pipe or
  // device) with records::IoError (kSourcesNeedRegularFiles says why): as
  // they open it (FromTFRecords, FromCsv after its first file, which it
  // reads when made) or when made (FromTFRecordsGlobalShuffle, which
  // indexes every file then).
  // TFRecord files: paths, glob patterns and directories (records whose
  // name holds "tfrecord" or "tfrec", sorted).  Elements: {"record": bytes
  // scalar}.  Under a fused Parse(Batch(...)) with fewer files read at once
  // than threads, an uncompressed file of 16 MiB or more with an index
  // (path.idx) is read by ranges on several threads; the index is checked
  // against the records, never trusted, so a stale one changes only the
  // speed.
  static Dataset FromTFRecords(std::vector<std::string> paths,
                               TFRecordOptions options = {});
  // Every record of every file exactly once per epoch, in a fresh uniform
  // random order each epoch, read by index (records::ReadIndex of
  // path.idx; files without an index are indexed in memory by one read).
  // Memory: the indexes, plus O(1) per record for the order (a seeded
  // Feistel bijection over record ids).  The state is elastic: restoring
  // with another num_shards / shard_index continues the epoch with no
  // record repeated or skipped (pipeline/global_shuffle.h in the source).
  static Dataset FromTFRecordsGlobalShuffle(std::vector<std::string> paths,
                                            GlobalShuffleOptions options = {});
  // Slices of in-memory arrays along their first dimension, as views of
  // `arrays` (never copied); all components must have the same first
  // dimension.
  static Dataset FromTensorSlices(Element arrays);
  // tf.data's from_tensors: `arrays` as one element (never copied).
  static Dataset FromTensors(Element arrays);
  // {"value": int64 scalar} for start, start + step, ... before stop.
  static Dataset Range(int64_t start, int64_t stop, int64_t step = 1);
  // tf.data's counter: {"value": int64 scalar} for start, start + step, ...
  // without end (a step of 0 repeats start).
  static Dataset Counter(int64_t start = 0, int64_t step = 1);
  // tf.data's random: {"value": int64 scalar}, uniform over every int64
  // value, without end.  The same seed gives the same sequence (recflow's
  // generator, not TensorFlow's); no seed: a random one, kept in the
  // state.  rerandomize_each_iteration: a new sequence for each epoch
  // under Repeat (tf.data's default is the same sequence each time).
  static Dataset Random(std::optional<uint64_t> seed = {},
                        bool rerandomize_each_iteration = false);
  // tf.data's list_files: {"filename": bytes scalar}, one element per file
  // that one of `patterns` matches (records::MatchFiles: glob(3), every
  // file, sorted).  shuffle (tf.data's default): in a new order each epoch
  // (a Shuffle over every name, seeded by `seed`).  Matching nothing is a
  // records::FileListError naming the patterns.
  static Dataset ListFiles(const std::vector<std::string>& patterns,
                           bool shuffle = true,
                           std::optional<uint64_t> seed = {});
  static Dataset FromGenerator(GeneratorFn generator,
                               std::string name = "generator");
  // tf.data's TextLineDataset: {"line": bytes scalar} for each line of
  // each file in turn (paths and globs, as FromCsv), without its '\n' and
  // with every '\r' removed, as TensorFlow's line reader does; a last line
  // without '\n' counts when it is not empty.  An element's origin is its
  // file, line number and offset (in the decoded stream of a compressed
  // file).  A file that cannot be read or decoded is an error after the
  // lines before the damage; the next file follows.
  static Dataset FromTextLines(std::vector<std::string> paths,
                               PlainFileOptions options = {});
  // tf.data's FixedLengthRecordDataset: {"record": bytes scalar} of
  // `record_bytes` bytes each, after each file's `header_bytes` and before
  // its `footer_bytes` (tf.data's names).  A file whose body is not a whole
  // number of records is an error naming its sizes: uncompressed, before
  // any of its records (the file's size tells), as tf.data's; compressed,
  // after its whole records, where the decoded stream ends.
  static Dataset FromFixedLengthRecords(std::vector<std::string> paths,
                                        uint64_t record_bytes,
                                        uint64_t header_bytes = 0,
                                        uint64_t footer_bytes = 0,
                                        PlainFileOptions options = {});
  // CSV files with a header row (RFC 4180 quoting); one scalar per column.
  // Every file must have the first file's header; the first file's first
  // data row types the columns not in column_types, for every file (and
  // for every shard of Shard, which takes whole files).
  static Dataset FromCsv(std::vector<std::string> paths,
                         CsvOptions options = {});
  // Elements whose components are those of an element of each dataset,
  // in order (tf.data's zip, with the tuple flattened: a name in two
  // inputs is an Error when met); ends when the shortest input ends.
  // Every input iterates with the same epoch salt, so shuffles given the
  // same seed (features and labels shuffled apart) stay aligned in every
  // epoch, as tf.data's; unseeded shuffles described alike draw the same
  // seed too, where tf.data's would differ: give seeds to tell them apart.
  static Dataset Zip(const std::vector<Dataset>& datasets);
  // tf.data's sample_from_datasets: each element is the next element of
  // an input drawn at random with the chance its weight gives (each input's
  // elements in their own order).  The inputs' elements must have the same
  // component names (an Error on the first element of an input that
  // differs).  Draws come from a seeded generator kept in the state, so a
  // seeded pipeline gives the same stream in every run and a restored
  // Iterator continues it exactly; the sequence is recflow's, not
  // TensorFlow's (the same distribution).
  static Dataset SampleFromDatasets(const std::vector<Dataset>& datasets,
                                    SampleOptions options = {});
  // tf.data's choose_from_datasets: for each element of `choices` (one
  // component, an int64 or int32 scalar i in [0, datasets.size()); else an
  // Error naming the choice's position and value), the next element of
  // datasets[i]; ends when `choices` ends.  When the input chosen has
  // ended: with stop_on_empty_dataset (tf.data's default) the stream ends;
  // without, that choice is skipped, and the stream ends once every input
  // has ended.  Component names as SampleFromDatasets.
  static Dataset ChooseFromDatasets(const std::vector<Dataset>& datasets,
                                    const Dataset& choices,
                                    bool stop_on_empty_dataset = true);

  // --- Transformations (tf.data semantics) ---
  Dataset Map(MapFn fn, MapOptions options = {}) const;
  // Parses serialized tf.Examples with `spec` (records::ExampleParser):
  // FixedLen features become [shape] tensors ([batch, shape] after Batch),
  // VarLen ones [n] tensors, or ragged tensors after Batch.
  Dataset Parse(records::FeatureSpec spec, ParseOptions options = {}) const;
  // Parses serialized tf.train.SequenceExamples
  // (records::SequenceExampleParser): `context` features as Parse does;
  // each feature_list of `sequence`, one record: FixedLen of shape S ->
  // [steps, S...], VarLen -> ragged [steps, (values)].  A batch: FixedLen
  // -> ragged [batch, (steps), S...]; VarLen, ragged in two dimensions,
  // -> NAME, ragged [batch, (values)] (each record's steps one after
  // another), and NAME + "/step_lengths", ragged [batch, (steps)] int64 (a
  // tf.RaggedTensor's nested row lengths: from_nested_row_lengths(
  // NAME.values, [steps per record, NAME/step_lengths.values])).  A name
  // in both specs, or one ending in "/step_lengths", is an Error.
  Dataset ParseSequence(records::FeatureSpec context,
                        records::FeatureSpec sequence,
                        ParseOptions options = {}) const;
  Dataset Filter(PredicateFn predicate, std::string name = "filter") const;
  // tf.data's take_while: the elements before the first for which
  // `predicate` is false; that element ends the stream, and nothing after
  // it is read.  A predicate that throws uses up its element.
  Dataset TakeWhile(PredicateFn predicate,
                    std::string name = "take_while") const;
  // tf.data's scan: fn(state, element) returns {new state, output}; the
  // output is the element delivered, the new state goes to the next call.
  // Each iteration (each epoch under Repeat) starts from `initial_state`.
  // The state must keep the initial state's component names and dtypes
  // (shapes may change); it is in the iterator's state.  A function that
  // throws, or returns a state of other components (an Error naming the
  // element), uses up its element and leaves the state as it was.
  using ScanFn =
      std::function<std::pair<Element, Element>(const Element&, Element)>;
  Dataset Scan(Element initial_state, ScanFn fn,
               std::string name = "scan") const;
  // tf.data's unique: each distinct element once, where it first comes
  // (equal: the same component names, dtypes, shapes and values).  Its
  // components must be integers or bytes (a float component is an Error,
  // as in tf.data).  Every distinct element seen is kept, for the
  // iteration (each epoch under Repeat starts afresh), and is in the
  // iterator's state.
  Dataset Unique() const;
  // TensorFlow's algorithm: fill a buffer of `buffer_size`, then deliver
  // a uniformly chosen buffered element and put the next input in its
  // place.
  Dataset Shuffle(int64_t buffer_size, std::optional<uint64_t> seed = {},
                  bool reshuffle_each_iteration = true) const;
  Dataset Batch(int64_t batch_size, bool drop_remainder = false) const;
  Dataset PaddedBatch(int64_t batch_size,
                      PaddedBatchOptions options = {}) const;
  // tf.data's ragged_batch: as Batch, but every component of rank >= 1
  // is ragged in its first dimension, as tf.data's (even where every
  // element has one shape): [batch, (n), rest...], the rest of the shape
  // agreeing within a batch (else an Error naming the component and the
  // element); scalars batch dense.
  Dataset RaggedBatch(int64_t batch_size, bool drop_remainder = false) const;
  Dataset Unbatch() const;
  // tf.data's rebatch: the rows of this dataset's batches in batches of
  // `batch_sizes[0]`, `batch_sizes[1]`, ... in turn (each > 0), as
  // Unbatch().Batch(n) would give them with one copy, not two (none when a
  // batch passes whole).  The components of each input element must share
  // their first dimension (ragged: their rows); a batch that joins rows of
  // several input elements needs them to agree in names, dtypes and the
  // rest of the shape (an Error naming the component).  drop_remainder
  // drops a last batch short of its size.
  Dataset Rebatch(std::vector<int64_t> batch_sizes,
                  bool drop_remainder = false) const;
  // tf.data's window, each window delivered batched (as Batch stacks it:
  // tf.data's `window(...).flat_map(lambda w: w.batch(size))`, for each
  // component): window k holds input elements k * shift, k * shift +
  // stride, ... up to `size` of them.  Without drop_remainder the windows
  // that start before the end but run past it are delivered shorter, as
  // tf.data's are (Range(7).Window(3, {.shift = 1}) ends [4 5 6], [5 6],
  // [6]).  Elements in a window's reach are kept until it is delivered
  // ((size - 1) * stride + 1 of them at most, in the iterator's state); an
  // input error is thrown as it comes, and the element it used up is in no
  // window.
  Dataset Window(int64_t size, WindowOptions options = {}) const;
  // tf.data's bucket_by_sequence_length: each element goes to the bucket
  // its length (`element_length`, >= 0; else an Error naming it) falls in;
  // a bucket that reaches its batch size is padded and batched (as
  // PaddedBatch) and delivered.  At the end the buckets left are delivered
  // part-full in bucket order (tf.data's group_by_window flushes so).  The
  // buckets' elements are in the state.
  // `name` stands for the length in the description and in errors.
  using LengthFn = std::function<int64_t(const Element&)>;
  Dataset BucketBySequenceLength(LengthFn element_length, BucketOptions options,
                                 std::string name = "element_length") const;
  // The same by the size of component `component`'s first dimension (a
  // bytes scalar: its size in bytes; another scalar is an Error).
  Dataset BucketBySequenceLength(const std::string& component,
                                 BucketOptions options) const;
  // tf.data's group_by_window, each window batched (as Batch stacks it:
  // tf.data's reduce_func=lambda key, w: w.batch(window_size)): each
  // element goes to the group of its key (key_func); a group that reaches
  // its window size is delivered; at the end the groups left are
  // delivered part-full in key order (tf.data's order) unless
  // drop_remainder.  window_size_func gives each key's window size (> 0,
  // else an Error naming the key), asked once per group begun.  The
  // groups' elements are in the state.
  using KeyFn = std::function<int64_t(const Element&)>;
  using WindowSizeFn = std::function<int64_t(int64_t key)>;
  Dataset GroupByWindow(KeyFn key_func, int64_t window_size,
                        GroupOptions options = {}) const;
  Dataset GroupByWindow(KeyFn key_func, WindowSizeFn window_size_func,
                        GroupOptions options = {}) const;
  // A key_func: the value of the integer scalar `component` (anything
  // else is an Error naming it).
  static KeyFn ComponentKey(std::string component);
  // tf.data's rejection_resample: the input's elements, some dropped, so
  // that the classes (class_func, an integer in [0, classes); else an
  // Error naming the element) come with the target distribution.  tf.data's
  // algorithm, on one pass: each output is, with probability m, the next
  // element whatever its class, else the next element accepted, where an
  // element of class i is accepted with probability (r_i - m) / (M - m),
  // r_i = target_i / initial_i, m and M the least and greatest r (every
  // element passes where the distributions agree).  tf.data pairs each
  // element with its class; recflow delivers the element as it is.  The
  // generator's state and the estimated counts are in the iterator's
  // state.  Ends when the input ends.
  Dataset RejectionResample(KeyFn class_func, ResampleOptions options) const;
  // count < 0: forever.
  Dataset Repeat(int64_t count = -1) const;
  Dataset Take(int64_t count) const;
  // tf.data's assert_cardinality: this dataset's elements, with
  // Cardinality() `expected` (>= 0, or kInfiniteCardinality); an Error when
  // the input turns out to hold more (on the first too many, naming its
  // file and record where it has one) or fewer (at its end).  The count is
  // in the iterator's state.
  Dataset AssertCardinality(int64_t expected) const;
  Dataset Skip(int64_t count) const;
  // Element i where i % num_shards == index; on a file source (TFRecord,
  // CSV, text lines, fixed-length records) with at least num_shards
  // files, whole files instead (tf.data's AUTO policy): files index,
  // index + num_shards, ..., read as the source reads its files.
  Dataset Shard(int64_t num_shards, int64_t index) const;
  // cycle_length kAutotune: one input per core of this machine (tf.data's
  // default), fixed when the dataset is made.
  // tf.data's flat_map: each element's dataset in turn (Interleave with
  // cycle_length 1).
  Dataset FlatMap(InterleaveFn fn) const;
  Dataset Interleave(InterleaveFn fn, int64_t cycle_length,
                     int64_t block_length = 1,
                     std::string name = "interleave") const;
  Dataset Interleave(InterleaveFn fn, int64_t cycle_length,
                     InterleaveOptions options) const;
  // Runs the pipeline up to here on its own thread, at most `buffer_size`
  // elements (and `max_bytes` bytes, 0: no byte limit beyond one element)
  // ahead; kAutotune: a buffer that tunes its depth (see kAutotune).
  Dataset Prefetch(int64_t buffer_size, uint64_t max_bytes = 0) const;
  // Keeps the first complete pass in memory (filename empty) or in a file
  // (TFRecord framing; written atomically when the pass completes, then
  // read by later iterations and later processes).
  Dataset Cache(std::string filename = "") const;
  // Skips elements whose production throws, counting them.
  Dataset IgnoreErrors() const;
  // This dataset's elements, then `other`'s, whose components must have
  // the same names (an Error on its first element otherwise).
  Dataset Concatenate(const Dataset& other) const;
  // Adds an int64 scalar `name`: start, start + 1, ... (tf.data's
  // enumerate; an element that already has `name` is an Error).
  Dataset Enumerate(int64_t start = 0, std::string name = "index") const;

  Iterator MakeIterator(IteratorOptions options = {}) const;
  // The elements one iteration gives, where that is known without running
  // it (tf.data's cardinality, by its rules): a count,
  // kInfiniteCardinality or kUnknownCardinality.  Unknown: files (as
  // tf.data's TFRecordDataset; FromTFRecordsGlobalShuffle, which indexes
  // them, is known), CSV, generators, Filter, TakeWhile, Unique,
  // Interleave, Unbatch, Rebatch, IgnoreErrors, ChooseFromDatasets,
  // BucketBySequenceLength, GroupByWindow and what follows them; Repeat()
  // forever is infinite unless its input is known to be empty.
  int64_t Cardinality() const { return base_->Cardinality(); }
  std::string Describe() const { return base_->Describe(); }
  const DatasetPtr& base() const { return base_; }
  explicit Dataset(DatasetPtr base) : base_(std::move(base)) {}

 private:
  DatasetPtr base_;
};

// Runs a Dataset.  Used by one thread at a time (Next, Save, Restore,
// Stats); it may move between threads.  Elements it returns hold their
// storage (shared, reference-counted) and stay valid after the Iterator is
// gone, except views of arrays the caller owns (Tensor::View without an
// owner), which live as long as those arrays.
class Iterator {
 public:
  Iterator(DatasetPtr dataset, IteratorOptions options);
  ~Iterator();  // stops all of its work
  Iterator(Iterator&&) noexcept;
  Iterator& operator=(Iterator&&) noexcept;

  // The next element; false at the end.  Throws the error of the stage
  // that failed, with its original context.
  bool Next(Element* out);
  std::optional<Element> Next();

  // The position after the last element Next() returned.
  std::string Save();
  // Continues from a state saved by an iterator of the same pipeline.
  // Only before the first Next().
  void Restore(std::string_view state);

  std::vector<StageStats> Stats() const;
  IteratorContext& context() { return *ctx_; }

 private:
  DatasetPtr dataset_;
  std::unique_ptr<IteratorContext> ctx_;
  std::unique_ptr<IteratorBase> root_;
  bool started_ = false;
  // IteratorOptions::output_memory, and whether root_ copies into it.
  std::shared_ptr<Allocator> output_memory_;
  bool root_delivers_ = false;
  std::function<void(const Element&)> prepare_;  // IteratorOptions::prepare
  bool root_prepares_ = false;
  // Asks a new root to deliver in output_memory_ and to call prepare_.
  void AskRootToDeliver();
};

}  // namespace recflow::pipeline

#endif  // RECFLOW_PIPELINE_DATASET_H_
