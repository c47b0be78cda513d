// The stages behind Dataset's methods (one .cc file each); dataset.cc
// calls these.  Internal to pipeline/.
#ifndef RECFLOW_PIPELINE_STAGES_H_
#define RECFLOW_PIPELINE_STAGES_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "pipeline/dataset.h"
#include "pipeline/global_shuffle.h"
#include "pipeline/state.h"
#include "records/crc32c.h"
#include "records/example_parser.h"
#include "records/file.h"
#include "records/index.h"

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

// What a shuffle buffer's FillAhead (IteratorBase's, and the fused
// path's RecordStream's) needs besides its own reading: reads ahead while
// the buffer has room, and keeps the first error met, for the stage's next
// read to throw, which is where reading at that time would have met it.
class AheadFiller {
 public:
  // Calls read_one() up to `n` times, while filling() and no error is
  // kept; an exception from read_one() is kept and stops it.
  template <typename Filling, typename ReadOne>
  void Fill(size_t n, const Filling& filling, const ReadOne& read_one) {
    for (; n > 0 && !error_ && filling(); --n) {
      try {
        read_one();
      } catch (...) {
        error_ = std::current_exception();
      }
    }
  }
  // Throws the kept error, once; nothing when none is kept.
  void ThrowKept() {
    if (!error_) return;
    std::exception_ptr e = std::move(error_);
    error_ = nullptr;
    std::rethrow_exception(e);
  }

 private:
  std::exception_ptr error_;
};

// The salt of the iterator Repeat makes for `epoch` under its own `salt`.
inline uint64_t RepeatSalt(uint64_t salt, int64_t epoch) {
  return MixSeed(salt, static_cast<uint64_t>(epoch));
}

// The epochs of a Repeat(count) over inputs of type Input (IteratorBase
// for the stage, the fused path's RecordStream): the open epoch's input,
// made with the salt of its epoch, and the next epoch's, which fills while
// the open one drains (and, where asked, inputs of the epochs after it,
// made ahead so that their readers start early where epochs are short).  Both
// paths keep tf.data's rules through it (an input that produces nothing ends
// the repetition rather than spinning forever) and one saved form (stage
// "repeat": the epoch, whether it produced, the open input's state).  Not
// thread-safe, as an iterator.
template <typename Input>
class RepeatEpochs {
 public:
  using Maker = std::function<std::unique_ptr<Input>(uint64_t salt)>;
  // count < 0: forever.  prepare_next, if set, makes the next epoch's
  // input as soon as an epoch opens and is called with it once (the fused
  // path's readers then start on it); else the next epoch's input is made
  // when the open one drains.  With prepare_next, where the epoch before
  // handed out at most `short_epoch` elements, the inputs of the next
  // `epochs_ahead` (>= 1) epochs are made so (an epoch is known short only
  // once one has ended: the first epoch, and the first after a restore,
  // make one).
  RepeatEpochs(int64_t count, uint64_t salt, Maker make,
               std::function<void(Input&)> prepare_next = {},
               int epochs_ahead = 1, uint64_t short_epoch = 0)
      : count_(count),
        salt_(salt),
        make_(std::move(make)),
        prepare_next_(std::move(prepare_next)),
        epochs_ahead_(std::max(epochs_ahead, 1)),
        short_epoch_(short_epoch) {}

  // The open epoch's input, opening the current epoch's if none is open;
  // null when the repetition is done.
  Input* Begin() {
    if (in_) return in_.get();
    if (count_ >= 0 && epoch_ >= count_) return nullptr;
    Open();
    return in_.get();
  }
  Input* input() const { return in_.get(); }
  // f(input) for each epoch's input made ahead, the next epoch's first.
  template <typename F>
  void ForEachAhead(F f) const {
    for (const auto& in : ahead_) f(*in);
  }
  // The open input may not be open yet: opens it unless the repetition is
  // done.
  void Prepare() {
    if (!in_ && (count_ < 0 || epoch_ < count_)) Open();
  }

  // The open input handed out n elements or records: the epoch produced,
  // and, while the input drains (a shuffle's buffer at its input's end),
  // the next epoch's input fills as many, as TensorFlow's
  // shuffle-and-repeat keeps its buffer full across epochs.  Else the
  // whole buffer (10,000 records, or the whole file under a larger buffer)
  // would be read at the epoch's start while the consumer waits.  Only
  // when reading happens changes: the order, the saved state (the next
  // epoch's input is never saved) and where errors are thrown do not.
  void Handed(size_t n) {
    if (n == 0) return;
    produced_ = true;
    Count(n);
    if (!in_ || !in_->Draining()) return;
    if (ahead_.empty()) {
      if (count_ >= 0 && epoch_ + 1 >= count_) return;
      try {
        ahead_.push_back(make_(RepeatSalt(salt_, epoch_ + 1)));
      } catch (...) {
        return;  // thrown again where the epoch opens
      }
    }
    ahead_.front()->FillAhead(n);
  }
  // What the open input handed out before it threw: the epoch produced.
  void HandedBeforeAnError(size_t n) {
    produced_ = produced_ || n > 0;
    Count(n);
  }

  // The open input ended: on to the next epoch; false when the repetition
  // ends.
  bool EndEpoch() {
    in_.reset();
    last_handed_ = handed_;
    handed_ = 0;
    if (!produced_) {
      epoch_ = count_ >= 0 ? count_ : epoch_;
      ahead_.clear();
      return false;
    }
    ++epoch_;
    return true;
  }

  void Save(StateWriter* w) const {
    w->BeginStage("repeat");
    w->I64(epoch_);
    w->Bool(produced_);
    w->Bool(in_ != nullptr);
    if (in_) in_->Save(w);
  }
  void Restore(StateReader* r) {
    r->BeginStage("repeat");
    epoch_ = r->I64();
    if (epoch_ < 0 || (count_ >= 0 && epoch_ > count_)) {
      r->Fail("epoch " + std::to_string(epoch_) + " of Repeat(" +
              std::to_string(count_) + ")");
    }
    const bool produced = r->Bool();
    in_.reset();
    ahead_.clear();
    handed_ = kUnknown;  // the restored epoch's elements before the save
    last_handed_ = kUnknown;
    if (r->Bool()) {
      Open();
      in_->Restore(r);
    }
    produced_ = produced;
  }

 private:
  void Open() {
    if (ahead_.empty()) {
      in_ = make_(RepeatSalt(salt_, epoch_));
    } else {
      in_ = std::move(ahead_.front());
      ahead_.pop_front();
    }
    produced_ = false;
    if (!prepare_next_) return;
    // Epochs epoch_ + 1 .. epoch_ + epochs, those not made yet.
    const int64_t epochs = last_handed_ <= short_epoch_ ? epochs_ahead_ : 1;
    for (int64_t e = epoch_ + 1 + static_cast<int64_t>(ahead_.size());
         e <= epoch_ + epochs && (count_ < 0 || e < count_); ++e) {
      ahead_.push_back(make_(RepeatSalt(salt_, e)));
      prepare_next_(*ahead_.back());
    }
  }

  const int64_t count_;
  const uint64_t salt_;
  Maker make_;
  std::function<void(Input&)> prepare_next_;
  const int64_t epochs_ahead_;
  const uint64_t short_epoch_;
  static constexpr uint64_t kUnknown = ~uint64_t{0};
  void Count(size_t n) {
    if (handed_ != kUnknown) handed_ += n;
  }
  uint64_t handed_ = 0;              // by the open epoch
  uint64_t last_handed_ = kUnknown;  // by the epoch before
  int64_t epoch_ = 0;
  bool produced_ = false;
  std::unique_ptr<Input> in_;
  // The inputs of epochs epoch_ + 1, epoch_ + 2, ... made ahead (the
  // first fills while the open one drains; later ones are only prepared).
  std::deque<std::unique_ptr<Input>> ahead_;
};

// records::ExpandRecordPaths, its errors as Errors prefixed with `who`.
std::vector<std::string> ExpandFiles(const std::vector<std::string>& paths,
                                     std::string_view who);
// The files of shard `index` of `num_shards` (DatasetBase::ShardByFiles):
// files[index], files[index + num_shards], ...; std::nullopt when there are
// fewer files than shards (the shard then goes by element).
std::optional<std::vector<std::string>> FilesOfShard(
    const std::vector<std::string>& files, int64_t num_shards, int64_t index);
// A fingerprint of a file list, for descriptions.
uint64_t FilesFingerprint(const std::vector<std::string>& files);
// Makes `out` the element {"record": record} from `path` at `offset`, the
// `index`-th record of its file (reusing out's component vector);
// `frame_crc` as Origin::frame_crc.
void SetRecord(Element* out, Tensor record,
               const std::shared_ptr<const std::string>& path, uint64_t offset,
               uint64_t index, std::optional<uint32_t> frame_crc);

// One record as a source reads it: `size` bytes at `data`, kept alive by
// `owner` (a read block or a copy), and where it came from.  A view read
// after FileRecords::KeepBlocksIn may have no owner: then whoever keeps
// its block (the fused path's chunk) keeps its bytes, and the view must
// not outlive that.  `path` points at the dataset's own copy of the file
// name, so a view must not outlive the dataset that made it.
struct RecordView {
  const char* data = nullptr;
  uint64_t size = 0;
  std::shared_ptr<const void> owner;
  size_t storage_bytes = 0;  // bytes `owner` (or the block) holds; 0: unknown
  const std::shared_ptr<const std::string>* path = nullptr;
  uint64_t offset = 0;  // of the frame, in the uncompressed stream
  uint64_t index = 0;   // the record's index in its file
  // Set when the bytes are those of the frame at `offset` in an
  // uncompressed file (so a saved state may name them by reference): the
  // data CRC stored in that frame.
  std::optional<uint32_t> frame_crc;

  // Planned but not read yet (the fused global shuffle): `path`, `offset`
  // and `index` say where, `size` is the whole frame's length from the
  // file's index, and `data` is null.  UnreadFiles::Read reads it.
  bool unread = false;

  std::string_view bytes() const { return {data, size}; }
  Tensor ToTensor() const {
    return Tensor::BytesView(data, size, owner, storage_bytes);
  }
};

// One file's records, from a position (tfrecord_dataset.cc).
class FileRecords {
 public:
  virtual ~FileRecords() = default;
  // The next record; false at the end.  After an exception the file is
  // finished.
  virtual bool NextView(RecordView* out) = 0;
  // The same as the element {"record": ...} with its origin.
  bool Next(Element* out);
  // Where to continue: the offset and index of the next record
  // (compressed files: the index only).
  virtual uint64_t next_offset() const = 0;
  virtual uint64_t next_index() const = 0;
  // From the next NextView on, the views of records that lie whole in a
  // read block come without an owner (RecordView::owner null): instead,
  // each block they view is appended to *blocks once, before the first
  // view of it that NextView returns, and the caller keeps the views'
  // bytes alive by keeping *blocks (which must outlive the reader's use of
  // it, or be replaced by another call first).  Views of other records (a
  // record across blocks, a compressed file's) own their bytes as before.
  // Null: every view owns its bytes again.  Why: a shared count per view,
  // incremented here and decremented where the view goes (in a parallel
  // pipeline, on another core), was ~6% of perf's samples of a fused
  // parse-only pipeline on one thread; the fused path keeps a chunk's
  // blocks with the chunk instead (docs/PERFORMANCE.md).  Readers without
  // blocks ignore it.
  virtual void KeepBlocksIn(
      std::vector<std::shared_ptr<const void>>* /*blocks*/) {}
  // Whether the records are decoded from a compressed stream (each costs
  // microseconds to read, where a frame of an uncompressed file costs a
  // fraction of one).
  virtual bool decodes() const { return false; }
};
// Opens `path` (kept by reference: it must outlive the reader) at a
// record boundary: uncompressed files through io.h's block readers, with
// records viewing the blocks; compressed ones (detected unless `options`
// says) decoded from the start, dropping `index` records.
std::unique_ptr<FileRecords> OpenFileRecords(
    const std::shared_ptr<const std::string>& path, uint64_t offset,
    uint64_t index, const TFRecordOptions& options);

// The records of an uncompressed file from the frame at `offset` (record
// `index`), read no further than `end_offset`: a frame that runs past it
// throws (as one past the end of the file), so the caller, who expects the
// range to end on a frame's end, reads it again without the limit.  For
// readers that split a file into ranges (batch_parse_fusion.cc).
std::unique_ptr<FileRecords> OpenFileRange(
    const std::shared_ptr<const std::string>& path, uint64_t offset,
    uint64_t index, uint64_t end_offset, const TFRecordOptions& options);

// Ranges of indexed files that the fused path (batch_parse_fusion.cc) has
// read in this process, checked and used (for tests).
uint64_t FusedRangesRead();
// Files the fused path has made a reader for in this process (for tests:
// how far ahead of the planner files are opened).
uint64_t FusedFileReadersMade();
// The smallest file the fused path reads by ranges (default 16 MiB; 0
// restores it), so that tests can use small files.
void SetMinRangedFileBytes(uint64_t bytes);
// The cores the fused path counts (default the machine's, MachineCores();
// 0 restores it): a Repeat of short epochs prepares as many epochs ahead
// as the iterator's threads, at most the cores, and where the consumer's
// thread plans and the threads take every core, the tasks get a worker
// fewer.  So that tests run as on a machine of that many cores.
void SetFusedCores(int cores);
// Where the fused path plans from then on, for benchmarks that compare the
// two: 1 in a task of its own, 0 or -1 (the default) on the consumer's
// thread (on 16 cores the task was 2-20% slower at 8 and 16 threads:
// batch_parse_fusion.cc).  With one parse call there is no planner task
// either way.
void SetPlanInTask(int mode);
// The most tasks (readers, parses, the planner) the fused path ran at once
// in this process since the last call (for tests: where the consumer's
// thread plans, the workers are one fewer than the threads once they
// would take every core).
int TakeFusedTasksAtOnceMost();
// The workers of the arena of the fused stage made last in this process
// (for tests; 0 before the first).
int LastFusedWorkers();
// Chunks the fused path's planner has read for one file while a reader
// task it waited for read another, in this process (for tests).
uint64_t PlannerHelpReads();

// Whether FromTFRecords' stage, with num_parallel_reads > 1, reads each
// open file ahead on a thread of its own (the default) or reads them in
// turn on the consumer's thread: for benchmarks and tests that compare
// the two.  Iterators made afterwards follow it.  The fused batch-parse
// path follows it only where it has one parse call; with more, its reader
// tasks always read ahead.
void SetTFRecordReadAhead(bool on);
// The rule both paths follow: whether FromTFRecords with `options` reads
// its open files ahead (num_parallel_reads > 1, the switch above on).
bool ReadsFilesAhead(const TFRecordOptions& options);

// Makes `v` hold a copy of `bytes` in a buffer of their size, so that it
// stops keeping a larger one (a read block) alive.
void OwnBytes(RecordView* v, std::string_view bytes);

// Copies records into shared chunks (1 MiB unless asked otherwise): one
// allocation per chunk, not per record.  Records over a quarter chunk get
// their own buffer.  A chunk lives while any record copied into it does.
class RecordArena {
 public:
  explicit RecordArena(size_t chunk_bytes = size_t{1} << 20)
      : chunk_bytes_(chunk_bytes) {}
  Tensor Copy(std::string_view r);
  void Copy(std::string_view r, RecordView* out);

 private:
  size_t chunk_bytes_;
  std::shared_ptr<records::AlignedVector<char>> chunk_;
  size_t used_ = 0;
};

// Shuffle buffers of records (the fused Shuffle's, ShuffledFileRecords)
// copy out views that stayed kCompactAfter buffer lengths (a fraction
// e^-3 under a uniform draw) into shared chunks of kCompactedChunkBytes
// (records over a quarter of it into their own), so that a straggler does
// not keep its read block: the blocks a buffer holds span about three
// buffers' worth of records.  A chunk stays until its last record is
// drawn, about five buffer lengths after it fills (75 records of ~850
// bytes): the chunks held come to about a quarter of a buffer's bytes.
inline constexpr size_t kCompactedChunkBytes = size_t{64} << 10;

// When a shuffle buffer's entries are old enough to copy out: each entry
// is stamped as it is inserted, the buffer is swept every quarter buffer
// length of insertions (at least 64), and a sweep copies the entries
// inserted more than kCompactAfter buffer lengths ago that no sweep has
// settled.  Its owner's thread only.
class CompactionClock {
 public:
  // An entry a sweep has looked at: later sweeps pass it.
  static constexpr uint64_t kSettled = ~uint64_t{0};
  static constexpr uint64_t kCompactAfter = 3;

  explicit CompactionClock(int64_t buffer_size)
      : limit_(kCompactAfter * static_cast<uint64_t>(buffer_size)),
        every_(static_cast<uint64_t>(std::max<int64_t>(buffer_size / 4, 64))),
        until_sweep_(every_) {}
  // The stamp of an entry inserted now.
  uint64_t Stamp() { return inserted_++; }
  // The stamp entries inserted now would get, without inserting.
  uint64_t Now() const { return inserted_; }
  // After each Stamp(): whether the buffer is due for a sweep (none until
  // kCompactAfter buffer lengths have been inserted).
  bool SweepDue() {
    if (--until_sweep_ != 0) return false;
    until_sweep_ = every_;
    return inserted_ > limit_;
  }
  // In a sweep: whether the entry stamped *stamp is old enough to copy out
  // (it is settled then).
  bool Settle(uint64_t* stamp) const {
    if (*stamp == kSettled || inserted_ - *stamp <= limit_) return false;
    *stamp = kSettled;
    return true;
  }

 private:
  const uint64_t limit_;
  const uint64_t every_;
  uint64_t until_sweep_;
  uint64_t inserted_ = 0;
};

// Whether a buffered view's bytes sit in a larger buffer than their own
// (a read block, or one whose size is unknown): the views a sweep copies.
inline bool ViewsALargerBuffer(const RecordView& v) {
  return v.owner == nullptr || v.storage_bytes == 0 ||
         v.storage_bytes > 2 * v.size;
}

// The seed of file `file` (its place in the source's expanded list) in an
// epoch whose seed is `epoch_seed` (TFRecordOptions::shuffle_buffer_per_file).
uint64_t FileShuffleSeed(uint64_t epoch_seed, size_t file);

// One file's records through a shuffle buffer of their own
// (TFRecordOptions::shuffle_buffer_per_file): ShuffleDataset's algorithm
// and generator over `in`'s records (fill the buffer, draw a buffered
// record uniformly, the next input takes its place), so that a file
// wrapped with seed FileShuffleSeed(...) gives the order of
// FromTFRecords({file}).Shuffle(buffer_size, that seed, false).  The views
// own their bytes (KeepBlocksIn is not passed on: a view outlives the
// chunk it was read in); a view buffered for three buffer lengths is
// copied out of its read block.  An error of `in` is kept and thrown once
// the records buffered before it were drawn; then the file is finished.
// next_offset() and next_index() are where `in` continues.  One thread at
// a time.
class ShuffledFileRecords final : public FileRecords {
 public:
  ShuffledFileRecords(const std::shared_ptr<const std::string>& path,
                      std::unique_ptr<FileRecords> in, int64_t buffer_size,
                      uint64_t seed);
  ~ShuffledFileRecords() override;
  bool NextView(RecordView* out) override;
  uint64_t next_offset() const override { return in_->next_offset(); }
  uint64_t next_index() const override { return in_->next_index(); }

  // The generator, the buffer and the records drawn and not handed on:
  // `drawn` (records a caller took from NextView and holds, in the order
  // it will hand them on) and then those a restored state left here.
  // Written after the file's position (next_offset, next_index), which
  // Restore's caller opens `in` at.  A kept error is not saved: the state
  // says the input goes on, and reading it again meets the error again;
  // so with `error_ahead` (the caller holds an error this threw, to throw
  // after `drawn`).  Needs nothing of `in` (null: a file not opened yet).
  void Save(StateWriter* w, std::span<const RecordView> drawn = {},
            bool error_ahead = false) const;
  // Before the first NextView, into a reader made with the saved position.
  void Restore(StateReader* r);

 private:
  struct Entry;
  bool Filling() const;
  void ReadOne();
  void CompactOld();

  const std::shared_ptr<const std::string>& path_;
  std::unique_ptr<FileRecords> in_;
  const int64_t buffer_size_;
  Rng rng_;
  std::vector<Entry> buffer_;
  std::deque<RecordView> drawn_;  // a restored state's, handed on first
  bool input_end_ = false;
  std::exception_ptr error_;  // kept for after the buffer
  CompactionClock clock_;
  RecordArena compacted_;
};

// Inputs read ahead, each on a thread of its own (interleave.cc's
// ReadAhead, tfrecord_dataset.cc's FileReadAhead), and their consumer.
//
// How a reader and the consumer wake each other (each wake a system call
// and, on a busy machine, a switch of threads): a consumer that ran out
// waits for a run of kWakeRun results (or the input's end, an error, a
// full buffer), at most kRunWait, and then for any result; a reader that
// filled its buffer waits until the consumer has taken from it.
constexpr size_t kWakeRun = 32;
constexpr std::chrono::microseconds kRunWait{100};

// The consumer's wait of the wake rule, under `lock` (the reader's
// mutex), for a reader that notifies `cv` on handing results over while
// `wants` > 0: for a run (`run_ready()`: kWakeRun results, or fewer that
// end with the input's end or an error or fill the buffer) at most
// kRunWait, then for any result (`any()`), until `ctx` is cancelled.
// `wants` tells the reader which (kWakeRun, then 1), and is 0 after.
template <typename RunReady, typename Any>
void WaitForRun(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                std::atomic<size_t>& wants, const IteratorContext& ctx,
                RunReady run_ready, Any any) {
  const auto woken = [&] { return run_ready() || ctx.cancelled(); };
  wants.store(kWakeRun);
  cv.wait_for(lock, kRunWait, woken);
  if (!any()) {
    wants.store(1);
    cv.wait(lock, woken);
  }
  wants.store(0);
}

// Tells the consumer of several read-ahead inputs that one of them has
// results to take (the wake rule above): a count, and a wait for it to
// pass a value.  Thread-safe.
class ReadySignal {
 public:
  uint64_t count() const {
    std::lock_guard<std::mutex> lock(mu_);
    return count_;
  }
  void Notify() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++count_;
    }
    cv_.notify_all();
  }
  // Until count() != seen, `timeout` passed (when given) or `ctx` is
  // cancelled (its wake-up calls Wake).
  void WaitPast(uint64_t seen, const IteratorContext& ctx,
                std::optional<std::chrono::microseconds> timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    const auto passed = [&] { return count_ != seen || ctx.cancelled(); };
    if (timeout) {
      cv_.wait_for(lock, *timeout, passed);
    } else {
      cv_.wait(lock, passed);
    }
  }
  void Wake() {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  // Set by a consumer that found nothing after its timed wait: readers
  // then notify on every result, not on runs.
  std::atomic<bool> wants_any{false};

  // One consumer's waits for a result of any input, by the wake rule:
  // Wait(seen) is called each time the consumer has looked at every
  // input (having read `seen` = count() before) and found nothing; it
  // waits for a run, then (nothing anywhere) sets wants_any and returns
  // for one more look (a result published before the readers knew is
  // seen by it), then waits for any result.  wants_any is cleared when
  // the Waiter goes.
  class Waiter {
   public:
    Waiter(ReadySignal* signal, const IteratorContext* ctx)
        : signal_(signal), ctx_(ctx) {}
    ~Waiter() { signal_->wants_any.store(false); }
    Waiter(const Waiter&) = delete;
    Waiter& operator=(const Waiter&) = delete;

    void Wait(uint64_t seen) {
      if (!waited_for_run_) {
        signal_->WaitPast(seen, *ctx_, kRunWait);
        waited_for_run_ = true;
      } else if (!signal_->wants_any.load()) {
        signal_->wants_any.store(true);
      } else {
        signal_->WaitPast(seen, *ctx_, std::nullopt);
      }
    }

   private:
    ReadySignal* signal_;
    const IteratorContext* ctx_;
    bool waited_for_run_ = false;
  };

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t count_ = 0;
};

// sources.cc
DatasetPtr TensorSlices(Element arrays);
DatasetPtr Tensors(Element arrays);
DatasetPtr Range(int64_t start, int64_t stop, int64_t step);
DatasetPtr Counter(int64_t start, int64_t step);
DatasetPtr Random(std::optional<uint64_t> seed, bool rerandomize);
DatasetPtr Generator(GeneratorFn fn, std::string name);
// csv_dataset.cc: `files` (expanded: ExpandFiles) read in turn, their
// columns typed by the first file's header and first data row.
DatasetPtr Csv(std::vector<std::string> files, CsvOptions options);

// plain_file_dataset.cc: the lines (record_bytes 0) or fixed-length records
// of `files` (expanded: ExpandFiles), read in turn; Dataset::FromTextLines
// and FromFixedLengthRecords interleave one per file for num_parallel_reads.
struct PlainFraming {
  uint64_t record_bytes = 0;  // 0: lines
  uint64_t header_bytes = 0;
  uint64_t footer_bytes = 0;
};
DatasetPtr PlainFile(std::vector<std::string> files, PlainFraming framing,
                     PlainFileOptions options);

// tfrecord_dataset.cc
DatasetPtr TFRecord(std::vector<std::string> files, TFRecordOptions options);

// global_shuffle.cc
DatasetPtr GlobalShuffle(std::vector<std::string> files,
                         GlobalShuffleOptions options);

// A global shuffle's files, as its stage and the fused path read them.
struct GlobalShuffleSource {
  std::vector<std::shared_ptr<const std::string>> paths;
  std::vector<std::shared_ptr<const records::Index>> indexes;  // per file
  std::vector<uint64_t> starts;  // id of each file's first record
  uint64_t total = 0;
  GlobalShuffleOptions options;
};

// Where a global shuffle reader is: the epochs' order, its shard of it and
// how many records it took (global_shuffle.cc says how they relate).  The
// stage and the fused path both read through one.
class GlobalShuffleCursor {
 public:
  GlobalShuffleCursor(const GlobalShuffleSource* source, uint64_t seed);
  // The next record's file and index in it; false after the last epoch.
  bool Next(size_t* file, uint64_t* record);
  // Stage "global_shuffle": restores with another sharding too.
  void Save(StateWriter* w) const;
  void Restore(StateReader* r);

 private:
  // The records of the next kAhead positions are found ahead of their
  // turn and their index entries prefetched: an entry is a cache miss
  // (random records of indexes of megabytes) that the reads then wait on.
  static constexpr uint64_t kAhead = 16;
  struct Planned {
    size_t file = 0;
    uint64_t record = 0;
  };

  // Whether the t-th record this reader takes exists (before the last
  // epoch's end), and where it is.
  bool Exists(uint64_t t) const;
  Planned Find(uint64_t t);

  const GlobalShuffleSource* source_;
  uint64_t seed_;
  FeistelPermutation order_;  // of epoch_
  uint64_t epoch_ = 0;
  uint64_t stride_;
  uint64_t shard_;
  uint64_t start_ = 0;
  uint64_t taken_ = 0;
  // planned_[t % kAhead] holds Find(t) for t in [taken_, planned_until_).
  std::array<Planned, kAhead> planned_;
  uint64_t planned_until_ = 0;
};

// Reads the views of `views` that are unread (RecordView::unread) and of
// the source's files (each opened on first use and kept), into one buffer
// the views then share, checking every frame; other views are left as
// they are.  A view names its file by its path's place in `paths` (the
// source's own by default; a list the source's files lie in, in order,
// that outlives this).  Returns the views read and their bytes.
// Throws records::RecordError (naming file, offset, record) at the first
// record that is not what the index says.  Thread-safe for calls with
// distinct views.
class UnreadFiles {
 public:
  explicit UnreadFiles(
      const GlobalShuffleSource* source,
      const std::shared_ptr<const std::string>* paths = nullptr);
  ~UnreadFiles();
  std::pair<size_t, uint64_t> Read(std::vector<RecordView>* views);

 private:
  const records::ReadableFile& File(size_t i);

  const GlobalShuffleSource* source_;
  const std::shared_ptr<const std::string>* paths_;
  // Opened files, read without a lock once set (every parse call looks
  // one up per record); `mu_` only serializes opening them.
  std::unique_ptr<std::atomic<const records::ReadableFile*>[]> files_;
  std::mutex mu_;
};

// What a stage tells the fused batch-parse path (batch_parse_fusion.cc)
// about itself, through DatasetBase::DescribeForFusion.
struct FusableStage {
  enum class Kind {
    kTFRecord,
    kGlobalShuffle,
    kShuffle,
    kRepeat,
    kTake,
    kSkip,
    kShard,
    kBatch,
    kSample,
    kChoose
  };
  Kind kind = Kind::kTFRecord;
  const DatasetBase* dataset = nullptr;
  DatasetPtr input;  // null for the source, kSample and kChoose
  // kTFRecord: the files (the dataset's own copies), options and the order
  // an iterator made with a salt reads them in.
  const std::vector<std::shared_ptr<const std::string>>* paths = nullptr;
  const TFRecordOptions* tfrecord = nullptr;
  std::function<std::vector<size_t>(IteratorContext*, uint64_t salt)>
      file_order;
  // kGlobalShuffle (uncompressed files only): the files, and the order's
  // seed in shuffle_seed.
  const GlobalShuffleSource* global = nullptr;
  // kShuffle: the buffer and the seed of an iterator made with a salt
  // (kGlobalShuffle: the seed; kSample: the draws' seed).
  int64_t buffer_size = 0;
  std::function<uint64_t(IteratorContext*, uint64_t salt)> shuffle_seed;
  // kRepeat, kTake, kSkip (-1: every element); kShard: the number of
  // shards, and this one's index
  int64_t count = 0;
  int64_t shard_index = 0;
  // kBatch
  int64_t batch_size = 0;
  bool drop_remainder = false;
  // kSample (SampleFromDatasets), kChoose (ChooseFromDatasets): its
  // inputs, their weights (kSample) or the choice dataset (kChoose), and
  // whether the picks stop at the first input that ends.  `chains`: each
  // input's stages, down to its source (the fused path describes them).
  std::vector<DatasetPtr> inputs;
  const std::vector<double>* weights = nullptr;
  DatasetPtr choices;
  bool stop_on_empty = false;
  std::vector<std::vector<FusableStage>> chains;
};

// The buffers of a Parse's batches, recycled (parse.cc): a batch's tensors
// hand their buffers back when the last reference to them goes, and the
// next batch is parsed into them, so that a steady pipeline allocates no
// batch buffers.  As many per feature wait here as the iterators parsing
// have batches in flight (HoldParsedBuffers), at least a few; the rest are
// freed.
// Thread-safe; kept alive by the tensors that will give buffers back.
class ParsedBuffers;

// A Map that parses tf.Examples (Parse); null for other maps.
struct ParseInfo {
  std::shared_ptr<const records::ExampleParser> parser;
  ParseOptions options;
  std::shared_ptr<ParsedBuffers> buffers;  // Parse() makes it with the parser
};

// map.cc
DatasetPtr Map(DatasetPtr input, MapFn fn, MapOptions options,
               std::shared_ptr<const ParseInfo> parse = nullptr);

// parse.cc
// A Parse's parser, options and batch buffers (what Parse() maps with).
std::shared_ptr<ParseInfo> MakeParseInfo(records::FeatureSpec spec,
                                         ParseOptions options);
DatasetPtr Parse(DatasetPtr input, records::FeatureSpec spec,
                 ParseOptions options);
DatasetPtr ParseSequence(DatasetPtr input, records::FeatureSpec context,
                         records::FeatureSpec sequence, ParseOptions options);
// Parses `serialized` (a batch when `batched`, else one record) into the
// components of `out`, which keeps its origins, with `info`'s parser and
// into its recycled buffers.  On a bad record of a batch, throws the
// ParseError naming that record by `out`'s origins.
void ParseRecords(const ParseInfo& info,
                  std::span<const std::string_view> serialized, bool batched,
                  Element* out);
// While the result lives, `info`'s Parse keeps the buffers of up to
// `batches` batches for reuse (ParsedBuffers; the holders' batches added
// up, and never fewer than a few): an iterator that has that many batches
// in flight holds it, so that each batch is parsed into buffers that
// batches before it gave back rather than into new ones.  When it goes,
// the buffers beyond the new limit are freed.  Null when `info` has no
// buffers or `batches` is 0.  Thread-safe.
std::shared_ptr<void> HoldParsedBuffers(const ParseInfo& info, size_t batches);
// Batch buffers that Parses of this process freed because as many
// waited for reuse already (for tests).
uint64_t ParsedBuffersFreed();

// batch_parse_fusion.cc: tf.data's map_and_batch fusion, with the reading
// and shuffling below it.  For a Parse whose input is
// Batch(Shuffle|Repeat ...(TFRecord)), an iterator that reads files in
// parallel tasks, decides shuffle, repeat and batch order on one thread
// over record views (no record bytes copied), and parses each batch's
// records straight into its tensors in parallel tasks; the same elements,
// order, errors and states as the stages run one by one.  Null when the
// chain is not of that form or the iterator's options turn fusion off.
std::unique_ptr<IteratorBase> MakeFusedBatchParse(
    const DatasetBase& parse, const DatasetPtr& input, const ParseInfo& info,
    int parallel_calls, IteratorContext* ctx, uint64_t salt);

// transforms.cc
// The state of a stage that counts its input's elements (Take, Skip,
// AssertCardinality, Shard; their iterators' and the fused path's
// streams'): under the stage's name, the count; the input's state follows.
// RestoreCounted refuses a count below 0 or above `most` (-1: no bound),
// naming the stage by `label`.
void SaveCounted(StateWriter* w, std::string_view stage, int64_t counted);
int64_t RestoreCounted(StateReader* r, std::string_view stage, int64_t most,
                       std::string_view label);
DatasetPtr Filter(DatasetPtr input, PredicateFn fn, std::string name);
DatasetPtr TakeWhile(DatasetPtr input, PredicateFn fn, std::string name);
DatasetPtr Scan(DatasetPtr input, Element initial, Dataset::ScanFn fn,
                std::string name);
DatasetPtr Unique(DatasetPtr input);
DatasetPtr Repeat(DatasetPtr input, int64_t count);
DatasetPtr Take(DatasetPtr input, int64_t count);
DatasetPtr AssertCardinality(DatasetPtr input, int64_t expected);
DatasetPtr RejectionResample(DatasetPtr input, Dataset::KeyFn class_func,
                             ResampleOptions options);
DatasetPtr Skip(DatasetPtr input, int64_t count);
DatasetPtr Shard(DatasetPtr input, int64_t num_shards, int64_t index);
DatasetPtr IgnoreErrors(DatasetPtr input);

// combine.cc
// SampleFromDatasets' draws (its iterator's, and the fused batch-parse
// path's stream's): input i with a chance of weights[i] over the sum of
// the weights of the inputs that have not ended.  Not thread-safe.
class WeightedDraws {
 public:
  WeightedDraws(std::vector<double> weights, uint64_t seed);
  // The input of the next element; nullopt where every input of weight
  // > 0 has ended.
  std::optional<size_t> Pick();
  // What Pick() will return `ahead` picks from now (0: the next one), no
  // input ending before, without drawing; Skip(n) draws n picks unseen.
  std::optional<size_t> Peek(uint64_t ahead) const;
  void Skip(uint64_t n) { rng_.set_state(rng_.state() + n); }
  // After an input ended, or a restore: ended[i] for each input.
  void SetEnded(const std::vector<bool>& ended);
  double weight(size_t i) const { return weights_[i]; }
  uint64_t state() const { return rng_.state(); }
  void set_state(uint64_t s) { rng_.set_state(s); }

 private:
  // The input `rng`'s next draw picks.
  std::optional<size_t> PickWith(Rng& rng) const;

  std::vector<double> weights_;
  Rng rng_;
  // ends_[i]: where input i's share of [0, total_) ends.
  std::vector<double> ends_;
  double total_ = 0;
  size_t last_ = 0;
};

// What tf.data's directed interleave (SampleFrom, ChooseFrom) keeps of
// its inputs, and its loop: which inputs have ended, and whether the
// stream has.  Not thread-safe.
class MixEnds {
 public:
  MixEnds(size_t inputs, bool stop_on_empty)
      : stop_on_empty_(stop_on_empty), input_ended_(inputs, false) {}

  // The next element: pick() names the input that gives it (nullopt: the
  // stream ends; an exception it throws is that element's error, the pick
  // used up); take(i) takes it from input i, false where input i has
  // ended; inputs_changed() is called when one has.  An input picked that
  // has ended ends the stream where stop_on_empty, else the picks go on
  // among the rest, until every input has ended.  False at the end, and
  // on every call after it.
  template <typename Pick, typename Take, typename Changed>
  bool Next(const Pick& pick, const Take& take, const Changed& inputs_changed) {
    while (!ended_) {
      const std::optional<size_t> i = pick();
      if (!i) break;
      if (!input_ended_[*i]) {
        if (take(*i)) return true;
        input_ended_[*i] = true;
        ++inputs_ended_;
        inputs_changed();
      }
      // The input picked has ended (now or before).
      if (stop_on_empty_ || inputs_ended_ == input_ended_.size()) break;
    }
    ended_ = true;
    return false;
  }
  const std::vector<bool>& input_ended() const { return input_ended_; }
  bool ended() const { return ended_; }
  // Whether the stream has ended, then each input's flag.
  void Save(StateWriter* w) const;
  void Restore(StateReader* r);

  // The mixture's stage, as its iterator and the fused path's stream save
  // it alike (docs/FORMATS.md): under `stage`, these ends, the picker's
  // state (save_picker(w)), then each input of `in` (pointers to what
  // has Save(w)) in turn.
  template <typename Inputs, typename SavePicker>
  void SaveStage(StateWriter* w, std::string_view stage,
                 const SavePicker& save_picker, Inputs& in) const {
    w->BeginStage(stage);
    Save(w);
    save_picker(w);
    for (auto& i : in) i->Save(w);
  }
  // What SaveStage saved; inputs_changed() once the ends are back, before
  // the picker's state.
  template <typename Inputs, typename Changed, typename RestorePicker>
  void RestoreStage(StateReader* r, std::string_view stage,
                    const Changed& inputs_changed,
                    const RestorePicker& restore_picker, Inputs& in) {
    r->BeginStage(stage);
    Restore(r);
    inputs_changed();
    restore_picker(r);
    for (auto& i : in) i->Restore(r);
  }

 private:
  bool stop_on_empty_;
  std::vector<bool> input_ended_;
  size_t inputs_ended_ = 0;
  bool ended_ = false;
};

// ChooseFromDatasets' picks (its iterator's, and the fused batch-parse
// path's stream's): each the next element of the choice dataset, one
// int64 or int32 scalar in [0, inputs).  Not thread-safe.
class ChoicePicker {
 public:
  ChoicePicker(std::unique_ptr<IteratorBase> choices, size_t inputs)
      : choices_(std::move(choices)), inputs_(inputs) {}
  // The input the next choice names; nullopt where the choices have
  // ended.  Throws (the choice used up) where it names none.
  std::optional<size_t> Pick();
  // The choices read, then the choice dataset's iterator.
  void Save(StateWriter* w);
  void Restore(StateReader* r);

 private:
  std::unique_ptr<IteratorBase> choices_;
  size_t inputs_;
  int64_t read_ = 0;  // choices read (for errors)
};

DatasetPtr Zip(std::vector<DatasetPtr> inputs);
DatasetPtr Concatenate(DatasetPtr first, DatasetPtr second);
DatasetPtr SampleFrom(std::vector<DatasetPtr> inputs, SampleOptions options);
DatasetPtr ChooseFrom(std::vector<DatasetPtr> inputs, DatasetPtr choices,
                      bool stop_on_empty_dataset);
DatasetPtr Enumerate(DatasetPtr input, int64_t start, std::string name);

// batch.cc
DatasetPtr Batch(DatasetPtr input, int64_t batch_size, bool drop_remainder);
DatasetPtr PaddedBatch(DatasetPtr input, int64_t batch_size,
                       PaddedBatchOptions options);
DatasetPtr RaggedBatch(DatasetPtr input, int64_t batch_size,
                       bool drop_remainder);
DatasetPtr Unbatch(DatasetPtr input);
DatasetPtr Rebatch(DatasetPtr input, std::vector<int64_t> batch_sizes,
                   bool drop_remainder);
DatasetPtr Window(DatasetPtr input, int64_t size, WindowOptions options);
DatasetPtr GroupByWindow(DatasetPtr input, Dataset::KeyFn key,
                         int64_t window_size,
                         Dataset::WindowSizeFn window_size_func,
                         GroupOptions options);
DatasetPtr BucketBySequenceLength(DatasetPtr input, Dataset::LengthFn length,
                                  BucketOptions options, std::string name);

// shuffle.cc
DatasetPtr Shuffle(DatasetPtr input, int64_t buffer_size,
                   std::optional<uint64_t> seed, bool reshuffle);

// Saved shuffle buffers name records that are still byte for byte the
// frame at their origin in an uncompressed file by reference: (file,
// offset, record, CRC-32C), 40 bytes, instead of their bytes.  Whether
// they are is decided in memory, from the CRC their frame had when read
// (Origin::frame_crc); the file is read again only on restore.
class RecordReferences {
 public:
  // The file id to save `e` by, or nullopt when it must be saved whole (not
  // a single record read from an uncompressed file, or its bytes changed).
  std::optional<uint64_t> Find(const Element& e);
  // The table of files the ids index.
  void WriteFiles(StateWriter* w) const {
    w->U64(files_.size());
    for (const auto& f : files_) w->String(f);
  }

 private:
  std::vector<std::string> files_;
  std::map<std::string, uint64_t> index_;
};
// Kind 1 of a saved buffer entry: a reference (kind 0: WriteElement).
inline void WriteRecordReference(StateWriter* w, uint64_t file, uint64_t offset,
                                 uint64_t record, std::string_view bytes) {
  w->U64(1);
  w->U64(file);
  w->U64(offset);
  w->U64(record);
  w->U64(records::crc32c::Value(bytes.data(), bytes.size()));
}
// Reads the records that a restored state's references name
// (records::ReadRecordAt), each file opened once per restore, checked
// against the CRC in the state; throws Error when a file changed since.
class ReferenceReader {
 public:
  RecordView Read(const std::shared_ptr<const std::string>& path,
                  uint64_t offset, uint64_t record, uint32_t crc);

 private:
  std::map<std::string, std::unique_ptr<records::ReadableFile>> open_;
};

// interleave.cc
// options are checked (Dataset::Interleave); num_parallel_calls kAutotune
// already made a count.  `files`: the interleave reads the files of a file
// source, one input each (FromTextLines' num_parallel_reads).
struct InterleavedFiles {
  // Of the file list (FilesFingerprint), in the interleave's description:
  // a state saved over other files (another shard's) is refused.
  uint64_t fingerprint = 0;
  // The interleave's ShardByFiles.
  std::function<DatasetPtr(int64_t num_shards, int64_t index)> shard;
};
DatasetPtr Interleave(DatasetPtr input, InterleaveFn fn, int64_t cycle_length,
                      InterleaveOptions options,
                      std::optional<InterleavedFiles> files = std::nullopt);

// map.cc
DatasetPtr Prefetch(DatasetPtr input, int64_t buffer_size, uint64_t max_bytes);

// cache.cc
DatasetPtr Cache(DatasetPtr input, std::string filename);

// A seed given, or a random one.
uint64_t SeedOrRandom(const std::optional<uint64_t>& seed);

}  // namespace recflow::pipeline::stages

#endif  // RECFLOW_PIPELINE_STAGES_H_
