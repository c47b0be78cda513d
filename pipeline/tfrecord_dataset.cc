// The TFRecord source: files read through io.h's block readers (uncompressed)
// or records::TFRecordReader (ZLIB, GZIP, ZSTD), interleaved record by
// record across num_parallel_reads files.
//
// Uncompressed records are views into the read blocks (no copy); a record
// that spans two blocks is copied once into its own buffer.  This framing
// sits here rather than in records::TFRecordReader because that reader
// owns one buffer that its next call overwrites, while a pipeline hands
// records downstream and needs many blocks alive at once.  Both check the
// same things and name damage with the same words.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <thread>
#include <utility>

#include "pipeline/io.h"
#include "pipeline/stages.h"
#include "records/compression.h"
#include "records/crc32c.h"
#include "records/file.h"
#include "records/file_list.h"
#include "records/tfrecord_format.h"
#include "records/tfrecord_reader.h"

namespace recflow::pipeline::stages {
namespace {

std::atomic<bool> read_ahead_enabled{true};
// What FileReadAhead holds at most per file (half handed over, half
// taken), the bytes over all the files of an iterator (the open ones and
// as many upcoming).
constexpr size_t kReadAheadRecords = 1024;
constexpr size_t kReadAheadDecodedRecords = 8192;
constexpr uint64_t kReadAheadBytes = uint64_t{256} << 20;

using records::DamageKind;
using records::RecordError;

class BlockFileRecords final : public FileRecords {
 public:
  BlockFileRecords(const std::shared_ptr<const std::string>& path,
                   uint64_t offset, uint64_t index,
                   const TFRecordOptions& options,
                   uint64_t end_offset = UINT64_MAX)
      : path_(path),
        options_(options),
        blocks_(OpenBlockReader(*path_, offset, options.io, end_offset)),
        file_size_(blocks_->file_size()),
        next_offset_(offset),
        next_index_(index) {}

  bool NextView(RecordView* out) override {
    if (done_) return false;
    try {
      return ReadRecord(out);
    } catch (...) {
      done_ = true;
      throw;
    }
  }
  uint64_t next_offset() const override { return next_offset_; }
  uint64_t next_index() const override { return next_index_; }
  void KeepBlocksIn(std::vector<std::shared_ptr<const void>>* blocks) override {
    keep_in_ = blocks;
    kept_ = nullptr;
  }

 private:
  size_t Available() const { return block_.size - pos_; }
  const char* Here() const { return block_.data + pos_; }

  [[noreturn]] void Fail(DamageKind kind, std::string detail) const {
    throw RecordError(*path_, next_offset_, next_index_, kind,
                      std::move(detail));
  }

  // Copies the next `n` bytes of the file to `dst`, moving through blocks.
  void Take(size_t n, char* dst) {
    while (n > 0) {
      if (Available() == 0 && !NextBlock()) {
        throw records::IoError(
            *path_, fmt::format("the file ended at {} while being read; it "
                                "was {} bytes when opened",
                                block_.offset + block_.size, file_size_));
      }
      const size_t k = std::min(n, Available());
      std::memcpy(dst, Here(), k);
      pos_ += k;
      dst += k;
      n -= k;
    }
  }

  bool NextBlock() {
    if (!blocks_->Next(&block_)) return false;
    pos_ = 0;
    verified_until_ = block_.data;
    return true;
  }

  bool ReadRecord(RecordView* out) {
    const uint64_t offset = next_offset_;
    if (offset >= file_size_) {
      done_ = true;
      return false;
    }
    if (Available() == 0) NextBlock();
    const uint64_t left = file_size_ - offset;
    if (left < records::kHeaderBytes) {
      Fail(DamageKind::kTruncatedHeader,
           fmt::format("the stream ends {} bytes into the 12-byte header",
                       left));
    }
    const bool verify = options_.verify_checksums;
    // Records in a block are checked several at a time where they are
    // short (records::VerifyFramesAhead), and all of the block's that
    // check at once: a reader of one of many files open at once stops
    // mid-block at the end of its chunk, and by the next chunk of its file
    // a shuffled pipeline had pushed the block's lines out of the cache
    // (Fashion-MNIST, 16 files, shuffled at one thread: the CRC's samples
    // -30%, 3.73 -> 3.78 M records/s; parse-only 5.41 -> 5.57 M;
    // docs/PERFORMANCE.md).
    if (verify && Here() >= verified_until_) {
      const char* const end = block_.data + block_.size;
      const char* p = Here();
      frames_.clear();
      next_frame_ = 0;
      for (const char* q;
           (q = records::VerifyFramesAhead(p, end, &frames_)) != p;) {
        p = q;
      }
      verified_until_ = p;
    }
    bool checked = Here() < verified_until_;
    // A frame checked ahead is whole in the block, and its length and CRC
    // were kept then: its header and footer are not read again (shuffled,
    // the block may have left the cache by now).
    if (checked) {
      const records::VerifiedFrame f = frames_[next_frame_++];
      if (f.length <= options_.max_record_bytes) {
        OwnedByBlock(out);
        Deliver(out, Here() + records::kHeaderBytes, f.length, f.data_crc);
        pos_ += f.length + records::kFrameOverhead;
        return true;
      }
      // Over the maximum: CheckFrameHeader says so below.
    }
    char header_copy[records::kHeaderBytes];
    const bool header_in_block = Available() >= records::kHeaderBytes;
    const char* header = Here();
    if (!header_in_block) {
      Take(records::kHeaderBytes, header_copy);
      header = header_copy;
    }
    const uint64_t length = records::HeaderLength(header);
    const records::FrameFault fault = records::CheckFrameHeader(
        header, verify && !checked, options_.max_record_bytes, left);
    if (fault != records::FrameFault::kNone) {
      Fail(records::FrameFaultKind(fault, verify),
           records::FrameFaultDetail(fault, verify, header,
                                     options_.max_record_bytes, left) +
               (offset == 0 ? records::StartOfStreamHint(std::string_view(
                                  header, records::kHeaderBytes))
                            : ""));
    }
    const uint64_t frame = length + records::kFrameOverhead;
    const char* data;
    if (header_in_block && Available() >= frame) {
      data = Here() + records::kHeaderBytes;
      OwnedByBlock(out);
      pos_ += frame;
    } else {
      checked = false;
      if (header_in_block) pos_ += records::kHeaderBytes;
      auto buffer = std::make_shared<records::AlignedVector<char>>(
          length + records::kFooterBytes);
      Take(buffer->size(), buffer->data());
      data = buffer->data();
      out->storage_bytes = buffer->size();
      out->owner = std::move(buffer);
    }
    if (verify && !checked && !records::DataChecks(data, length)) {
      Fail(DamageKind::kDataCrcMismatch, records::DataCrcDetail(data, length));
    }
    Deliver(out, data, length, records::StoredDataCrc(data, length));
    return true;
  }

  // The view's storage is the current block: its owner, or with
  // KeepBlocksIn none, the block kept once in the caller's list.
  void OwnedByBlock(RecordView* out) {
    if (keep_in_ == nullptr) {
      out->owner = block_.owner;
    } else {
      out->owner.reset();
      if (block_.owner.get() != kept_) {
        keep_in_->push_back(block_.owner);
        kept_ = block_.owner.get();
      }
    }
    out->storage_bytes = block_.size;
  }
  // The record at next_offset_ into *out, and the position past it.
  void Deliver(RecordView* out, const char* data, uint64_t length,
               uint32_t data_crc) {
    out->data = data;
    out->size = length;
    out->path = &path_;
    out->offset = next_offset_;
    out->index = next_index_;
    out->frame_crc = data_crc;
    next_offset_ += length + records::kFrameOverhead;
    ++next_index_;
  }

  const std::shared_ptr<const std::string>& path_;
  const TFRecordOptions& options_;
  std::unique_ptr<BlockReader> blocks_;
  const uint64_t file_size_;
  Block block_;
  size_t pos_ = 0;
  const char* verified_until_ = nullptr;
  // The frames from Here() to verified_until_, checked, from next_frame_.
  std::vector<records::VerifiedFrame> frames_;
  size_t next_frame_ = 0;
  uint64_t next_offset_;
  uint64_t next_index_;
  bool done_ = false;
  // KeepBlocksIn's: where blocks go, and the last block put there.
  std::vector<std::shared_ptr<const void>>* keep_in_ = nullptr;
  const void* kept_ = nullptr;
};

// Records decoded from a compressed stream are copied into a RecordArena.
class StreamFileRecords final : public FileRecords {
 public:
  StreamFileRecords(const std::shared_ptr<const std::string>& path,
                    uint64_t skip, records::Compression compression,
                    const TFRecordOptions& options)
      : path_(path) {
    records::ReaderOptions ro;
    ro.compression = compression;
    ro.verify_checksums = options.verify_checksums;
    ro.max_record_bytes = options.max_record_bytes;
    reader_ = std::make_unique<records::TFRecordReader>(*path_, ro);
    // A compressed stream cannot be entered in the middle: decode and drop
    // the records before the position.
    std::string_view r;
    for (uint64_t i = 0; i < skip; ++i) {
      if (!reader_->ReadRecord(&r)) {
        throw Error(
            fmt::format("{}: has {} records, but the state continues "
                        "at record {}",
                        *path_, i, skip));
      }
    }
    next_index_ = skip;
  }

  bool NextView(RecordView* out) override {
    std::string_view r;
    if (!reader_->ReadRecord(&r)) return false;
    arena_.Copy(r, out);
    out->frame_crc.reset();
    out->path = &path_;
    out->offset = reader_->last_offset();
    out->index = reader_->last_index();
    next_index_ = reader_->last_index() + 1;
    return true;
  }
  uint64_t next_offset() const override { return 0; }
  uint64_t next_index() const override { return next_index_; }
  bool decodes() const override { return true; }

 private:
  const std::shared_ptr<const std::string>& path_;
  std::unique_ptr<records::TFRecordReader> reader_;
  RecordArena arena_;
  uint64_t next_index_ = 0;
};

// One file's records read ahead on a thread of its own, for the consumer
// to take in the same order: the unfused source's num_parallel_reads > 1.
// Its position (next_offset, next_index) is that of the next record the
// consumer has not taken, so a saved state names the records read ahead
// by where they are, as the source reading in turn does (the same state,
// byte for byte), and a restore reads them again.  The reader hands its
// records over in runs, and the consumer takes all that were handed over
// at once, by the wake rule (stages.h).  Bounds: the reader stops while
// max_records records, or max_bytes of records' bytes, are handed over and
// not taken (max_records for an uncompressed file's records, which cost
// less to read than to parse, max_decoded_records for decoded ones); the
// consumer's run, taken whole, holds as many again.
// The file is opened by `open` on the reader's thread (opening a
// compressed file decodes its start), or given open (`in`, with `open`
// empty).  An error of `open` is thrown by the first NextView, and
// open_failed() then says so.  NextView, WhatIsReady, open_failed and the
// positions are the consumer's (one thread).  `counter` (the tfrecord
// stage's; it outlives this) gets the reader's opening and reading as
// busy time, and the consumer's waits for a run as wait time: the
// consumer's NextView runs in the stage's BusyScope, and waiting is not
// the stage's work.
class FileReadAhead final : public FileRecords {
 public:
  enum class Readiness { kNothing, kRecord, kEnd };  // kRecord: or error
  using Opener = std::function<std::unique_ptr<FileRecords>()>;

  struct Bounds {
    size_t max_records;
    size_t max_decoded_records;
    uint64_t max_bytes;
  };

  // `open` opens the file at record 0.
  FileReadAhead(IteratorContext* ctx, StageCounter* counter, Opener open,
                Bounds bounds, ReadySignal* signal)
      : FileReadAhead(ctx, counter, nullptr, std::move(open), bounds, signal) {}
  FileReadAhead(IteratorContext* ctx, StageCounter* counter,
                std::unique_ptr<FileRecords> in, Bounds bounds,
                ReadySignal* signal)
      : FileReadAhead(ctx, counter, std::move(in), nullptr, bounds, signal) {}
  ~FileReadAhead() override {
    ctx_->RemoveWakeUp(wake_up_id_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    reader_cv_.notify_all();
    reader_.join();
  }

  bool NextView(RecordView* out) override {
    if (run_pos_ == run_.size() && !TakeRun()) throw Cancelled();
    Item& item = run_[run_pos_];
    if (item.end) return false;  // stays, so that later calls end too
    if (item.error) {
      item.end = true;  // the file is finished
      open_failed_ = item.open_failed;
      std::rethrow_exception(std::exchange(item.error, nullptr));
    }
    *out = std::move(item.view);
    next_offset_ = item.next_offset;
    next_index_ = item.next_index;
    ++run_pos_;
    return true;
  }
  uint64_t next_offset() const override { return next_offset_; }
  uint64_t next_index() const override { return next_index_; }
  // Whether the error NextView threw was the opening's.
  bool open_failed() const { return open_failed_; }

  // What NextView would give now, without waiting.
  Readiness WhatIsReady() {
    if (run_pos_ == run_.size()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (shared_.empty()) return Readiness::kNothing;
      SwapRunLocked();
    }
    return run_[run_pos_].end ? Readiness::kEnd : Readiness::kRecord;
  }

 private:
  struct Item {
    RecordView view;
    std::exception_ptr error;
    bool open_failed = false;  // the error is the opening's
    bool end = false;
    uint64_t next_offset = 0;  // in_'s position after the record
    uint64_t next_index = 0;
  };

  FileReadAhead(IteratorContext* ctx, StageCounter* counter,
                std::unique_ptr<FileRecords> in, Opener open, Bounds bounds,
                ReadySignal* signal)
      : ctx_(ctx),
        counter_(counter),
        open_(std::move(open)),
        in_(std::move(in)),
        bounds_(bounds),
        max_records_(bounds.max_records),
        max_bytes_(bounds.max_bytes),
        signal_(signal),
        next_offset_(in_ ? in_->next_offset() : 0),
        next_index_(in_ ? in_->next_index() : 0) {
    wake_up_id_ = ctx_->AddWakeUp([this] {
      std::lock_guard<std::mutex> lock(mu_);
      consumer_cv_.notify_all();
    });
    reader_ = std::thread([this] { ReaderLoop(); });
  }

  // Whether the records handed over and not taken, with `extra` more of
  // `extra_bytes`, leave room.
  bool HasRoom(size_t extra, uint64_t extra_bytes) const {
    return shared_count_.load() + extra < max_records_ &&
           shared_bytes_.load() + extra_bytes < max_bytes_;
  }

  // Under mu_: the shared items become the consumer's run (the vectors
  // change places, so that neither allocates once grown).
  void SwapRunLocked() {
    run_.clear();
    run_pos_ = 0;
    run_.swap(shared_);
    shared_count_.store(0);
    shared_bytes_.store(0);
    if (reader_waits_) reader_cv_.notify_one();
  }

  // Waits for items by the wake rule and makes them the run; false when
  // the Iterator is being destroyed.
  bool TakeRun() {
    std::unique_lock<std::mutex> lock(mu_);
    if (shared_.empty()) {
      WaitScope wait(counter_);
      WaitForRun(
          lock, consumer_cv_, consumer_wants_, *ctx_,
          [this] {
            return !shared_.empty() &&
                   (shared_.size() >= consumer_wants_.load() || reader_done_ ||
                    !HasRoom(0, 0));
          },
          [this] { return !shared_.empty(); });
      if (shared_.empty()) return false;
    }
    SwapRunLocked();
    return true;
  }

  void ReaderLoop() {
    std::vector<Item> unpublished;
    uint64_t unpublished_bytes = 0;
    if (open_) {
      BusyScope busy(counter_);
      try {
        in_ = open_();
      } catch (...) {
        Item item;
        item.error = std::current_exception();
        item.open_failed = true;
        unpublished.push_back(std::move(item));
      }
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (!unpublished.empty()) {
      Publish(&unpublished, &unpublished_bytes, true);
      return;
    }
    if (in_->decodes()) max_records_.store(bounds_.max_decoded_records);
    while (!reader_done_) {
      reader_waits_ = true;
      reader_cv_.wait(lock, [this] { return stop_ || HasRoom(0, 0); });
      reader_waits_ = false;
      if (stop_) return;
      lock.unlock();
      // A run: up to kWakeRun items, fewer when the room runs out, the
      // file ends or errs, or the consumer (or the iterator, for any
      // file's) waits for one.
      bool done = false;
      {
        BusyScope busy(counter_);  // not the lock's wait below
        do {
          Item item;
          try {
            done = !in_->NextView(&item.view);
          } catch (...) {
            item.error = std::current_exception();
            done = true;
          }
          item.end = done && !item.error;
          item.next_offset = in_->next_offset();
          item.next_index = in_->next_index();
          unpublished_bytes += item.view.size;
          unpublished.push_back(std::move(item));
        } while (!done && unpublished.size() < kWakeRun &&
                 HasRoom(unpublished.size(), unpublished_bytes) &&
                 consumer_wants_.load() != 1 &&
                 !(signal_ != nullptr && signal_->wants_any.load()));
      }
      lock.lock();
      Publish(&unpublished, &unpublished_bytes, done);
    }
  }

  // Under mu_: the reader's items join the shared ones.
  void Publish(std::vector<Item>* items, uint64_t* bytes, bool done) {
    reader_done_ = done;
    std::move(items->begin(), items->end(), std::back_inserter(shared_));
    shared_count_.store(shared_.size());
    shared_bytes_.fetch_add(*bytes);
    items->clear();
    *bytes = 0;
    if (consumer_wants_.load() > 0) consumer_cv_.notify_one();
    if (signal_ != nullptr) signal_->Notify();
  }

  IteratorContext* ctx_;
  StageCounter* counter_;
  Opener open_;
  std::unique_ptr<FileRecords> in_;  // the reader's, once it runs
  const Bounds bounds_;
  std::atomic<size_t> max_records_;  // set once the file is open
  const uint64_t max_bytes_;
  ReadySignal* signal_;  // null: deterministic
  uint64_t wake_up_id_;
  // The consumer's.
  std::vector<Item> run_;
  size_t run_pos_ = 0;
  uint64_t next_offset_;
  uint64_t next_index_;
  bool open_failed_ = false;
  // Shared, under mu_ (the counts also read without it).
  std::mutex mu_;
  std::condition_variable consumer_cv_;
  std::condition_variable reader_cv_;
  std::vector<Item> shared_;
  std::atomic<size_t> shared_count_{0};
  std::atomic<uint64_t> shared_bytes_{0};
  std::atomic<size_t> consumer_wants_{0};  // waiting for this many
  bool reader_waits_ = false;
  bool reader_done_ = false;  // the file ended or erred
  bool stop_ = false;
  std::thread reader_;  // last: starts once the rest is made
};

class TFRecordDataset final : public DatasetBase {
 public:
  TFRecordDataset(std::vector<std::string> files, TFRecordOptions options)
      : files_(std::move(files)), options_(std::move(options)) {
    if (files_.empty()) throw Error("FromTFRecords: no files given");
    if (options_.num_parallel_reads == kAutotune) {
      options_.num_parallel_reads = static_cast<int>(
          std::min<size_t>(files_.size(), static_cast<size_t>(MachineCores())));
    }
    if (options_.num_parallel_reads < 1) {
      throw Error(
          fmt::format("FromTFRecords: num_parallel_reads must be at "
                      "least 1, or -1 for one file per core, not {}",
                      options_.num_parallel_reads));
    }
    if (options_.block_length < 1) {
      throw Error(
          fmt::format("FromTFRecords: block_length must be at least 1, not {}",
                      options_.block_length));
    }
    if (options_.shuffle_buffer_per_file < 0) {
      throw Error(fmt::format(
          "FromTFRecords: shuffle_buffer_per_file must be at least 0 (0: "
          "no shuffle per file), not {}",
          options_.shuffle_buffer_per_file));
    }
    for (const auto& f : files_) {
      paths_.push_back(std::make_shared<const std::string>(f));
    }
  }

  // (block_length only when it is not 1, shuffle_buffer_per_file only
  // when set: the descriptions, and so the unseeded file orders and the
  // states, of pipelines from before them stay as they were.)
  std::string Describe() const override {
    return fmt::format(
        "TFRecord({} files {:016x}, parallel_reads={}{}, shuffle_files={}, "
        "{}seed={})",
        files_.size(), FilesFingerprint(files_), options_.num_parallel_reads,
        options_.block_length == 1
            ? ""
            : fmt::format(", block_length={}", options_.block_length),
        options_.shuffle_files,
        options_.shuffle_buffer_per_file == 0
            ? ""
            : fmt::format("shuffle_buffer_per_file={}, ",
                          options_.shuffle_buffer_per_file),
        options_.seed ? fmt::format("{}", *options_.seed) : "none");
  }
  std::string StageName() const override { return "tfrecord"; }
  // Read ahead, the files read at once (each on a reader thread; the
  // upcoming files' readers, mostly waiting for room, not counted).
  int Parallelism(const IteratorContext&) const override {
    return ReadsFilesAhead(options_) ? options_.num_parallel_reads : 1;
  }

  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    return std::make_unique<It>(this, ctx, FileOrder(ctx, salt),
                                EpochSeed(ctx, salt));
  }

  bool DescribeForFusion(FusableStage* out) const override {
    out->kind = FusableStage::Kind::kTFRecord;
    out->paths = &paths_;
    out->tfrecord = &options_;
    out->file_order = [this](IteratorContext* ctx, uint64_t salt) {
      return FileOrder(ctx, salt);
    };
    out->shuffle_seed = [this](IteratorContext* ctx, uint64_t salt) {
      return EpochSeed(ctx, salt);
    };
    return true;
  }

  // The seed of an iterator made with `salt`: the file order's, and the
  // one each file's shuffle seed is made from (FileShuffleSeed).
  // Unseeded: the iterator's random seed, told apart per source.
  uint64_t EpochSeed(IteratorContext* ctx, uint64_t salt) const {
    return StageSeed(*this, options_.seed, *ctx, salt,
                     options_.reshuffle_each_iteration);
  }

  // The order in which an iterator made with `salt` reads the files.
  std::vector<size_t> FileOrder(IteratorContext* ctx, uint64_t salt) const {
    std::vector<size_t> order(files_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    if (options_.shuffle_files) {
      Rng rng(EpochSeed(ctx, salt));
      for (size_t i = order.size(); i > 1; --i) {
        std::swap(order[i - 1], order[rng.Below(i)]);
      }
    }
    return order;
  }

  DatasetPtr ShardByFiles(int64_t num_shards, int64_t index) const override {
    auto mine = FilesOfShard(files_, num_shards, index);
    if (!mine) return nullptr;
    return std::make_shared<TFRecordDataset>(std::move(*mine), options_);
  }

 private:
  // tf.data's interleave with cycle_length = num_parallel_reads and its
  // block_length: block_length records from each open file in turn (fewer
  // where the file ends); a finished file's slot takes the next file when
  // the cycle comes back to it.  With more than one slot, each open file
  // is read ahead on a thread of its own (FileReadAhead), below its
  // shuffle buffer if it has one, and so are as many upcoming files, each
  // given to the slot that would take it (FillEmptySlots): the records,
  // their order, the errors' places and the states are those of reading
  // in turn.  Not deterministic: when the file whose turn it is has
  // nothing read, the next open file (in the cycle's order) that has a
  // record (or error) read gives it, and the turns stay as they were.
  class It final : public IteratorBase {
   public:
    It(const TFRecordDataset* d, IteratorContext* ctx,
       std::vector<size_t> order, uint64_t epoch_seed)
        : d_(d),
          ctx_(ctx),
          order_(std::move(order)),
          epoch_seed_(epoch_seed),
          counter_(ctx->Counter(d, d->StageName(), d->Parallelism(*ctx))),
          read_ahead_(ReadsFilesAhead(d->options_)),
          slots_(d->options_.num_parallel_reads) {
      if (read_ahead_ && !d->options_.deterministic) {
        signal_ = std::make_unique<ReadySignal>();
        wake_up_id_ = ctx_->AddWakeUp([this] { signal_->Wake(); });
      }
    }
    ~It() override {
      // The readers, before the signal they notify.
      slots_.clear();
      upcoming_.clear();
      if (signal_) ctx_->RemoveWakeUp(wake_up_id_);
    }

    bool GetNext(Element* out) override {
      while (true) {
        if (read_ahead_ &&
            (open_ < slots_.size() || (upcoming_.size() < slots_.size() &&
                                       next_file_ < order_.size()))) {
          FillEmptySlots();  // (after a restore: the upcoming files)
        }
        if (open_ == 0 && next_file_ >= order_.size()) return false;
        Slot& slot = slots_[cycle_];
        if (slot.records) {
          if (signal_ && TakeOutOfTurn(slot, out)) return true;
          slot.early = false;
          bool got;
          try {
            got = slot.records->Next(out);
          } catch (...) {
            // A file that could not be opened was never open, reading in
            // turn: the next file takes its slot at once.
            Close(slot, !(slot.ahead && slot.ahead->open_failed()));
            throw;
          }
          if (got) {
            if (++block_index_ ==
                static_cast<uint64_t>(d_->options_.block_length)) {
              Advance();
            }
            return true;
          }
          Close(slot);
        } else if (next_file_ < order_.size()) {
          Open(slot, next_file_++, /*at_start=*/true);
          ++open_;
        } else {
          Advance();
        }
      }
    }

    // The upcoming files are saved as not opened yet.  Deterministic, so
    // are the files opened early into slots and not read from since, as
    // the sequential loop has them (they are the files opened last before
    // the upcoming ones, in the order it opens them).  Not deterministic,
    // records may have been taken from files opened after them.
    void Save(StateWriter* w) override {
      const bool as_in_turn = d_->options_.deterministic;
      size_t early = 0;
      for (const Slot& slot : slots_) early += slot.early ? 1 : 0;
      w->BeginStage("tfrecord");
      w->U64(cycle_);
      if (d_->options_.block_length != 1) w->U64(block_index_);
      w->U64(next_file_ - (as_in_turn ? early : 0) - upcoming_.size());
      for (const Slot& slot : slots_) {
        const bool open = slot.records && !(as_in_turn && slot.early);
        w->Bool(open);
        if (open) {
          w->U64(slot.order_index);
          w->U64(slot.records->next_offset());
          w->U64(slot.records->next_index());
          if (slot.shuffled != nullptr) slot.shuffled->Save(w);
        }
      }
    }

    void Restore(StateReader* r) override {
      r->BeginStage("tfrecord");
      cycle_ = r->U64();
      block_index_ = d_->options_.block_length != 1 ? r->U64() : 0;
      next_file_ = r->U64();
      if (cycle_ >= slots_.size() || next_file_ > order_.size() ||
          block_index_ >= static_cast<uint64_t>(d_->options_.block_length)) {
        throw Error("tfrecord state: position out of range");
      }
      upcoming_.clear();
      for (Slot& slot : slots_) {
        if (slot.records) Close(slot, false);
        if (!r->Bool()) continue;
        const uint64_t index = r->U64();
        const uint64_t offset = r->U64();
        const uint64_t record = r->U64();
        if (index >= order_.size()) {
          throw Error("tfrecord state: file out of range");
        }
        // At its start (a state saved not deterministic, with a file
        // opened early), read ahead, a file that cannot be opened throws
        // at its turn, as it would have.
        Open(slot, index, /*at_start=*/offset == 0 && record == 0, offset,
             record);
        ++open_;
        if (slot.shuffled != nullptr) slot.shuffled->Restore(r);
      }
    }

   private:
    struct Slot {
      std::unique_ptr<FileRecords> records;
      ShuffledFileRecords* shuffled = nullptr;  // records, when shuffled
      FileReadAhead* ahead = nullptr;  // records, or the shuffle's input
      size_t order_index = 0;
      // Opened before its turn by FillEmptySlots, and not read from since.
      bool early = false;
    };

    // Read ahead: gives the empty slots their next files now, in the
    // order the sequential loop reaches them (the cycle's order from the
    // current turn: a slot emptied earlier is reached again only after a
    // whole cycle), so that each gets the file it would get there, and
    // its reading starts before its turn; then opens as many upcoming
    // files as there are slots (tf.data's parallel interleave reads as
    // many future inputs ahead), so that a slot's next file has been read
    // ahead when its last one ends.  A file that cannot be opened throws
    // at its turn.
    void FillEmptySlots() {
      for (size_t i = 0; i < slots_.size(); ++i) {
        Slot& slot = slots_[(cycle_ + i) % slots_.size()];
        if (slot.records) continue;
        if (!upcoming_.empty()) {
          slot = std::move(upcoming_.front());
          upcoming_.pop_front();
        } else if (next_file_ < order_.size()) {
          Open(slot, next_file_++, /*at_start=*/true);
        } else {
          break;
        }
        slot.early = true;
        ++open_;
      }
      while (upcoming_.size() < slots_.size() && next_file_ < order_.size()) {
        upcoming_.emplace_back();
        Open(upcoming_.back(), next_file_++, /*at_start=*/true);
      }
    }

    // Opens the file at a position, here (a restore: so that a file that
    // cannot be opened there fails the restore), or at its start
    // (`at_start`; the position is then 0), where read ahead, on the
    // reader's thread: its opening (a compressed file's first blocks
    // decoded) then overlaps the other files' reading.
    void Open(Slot& slot, size_t order_index, bool at_start,
              uint64_t offset = 0, uint64_t record = 0) {
      const size_t file = order_[order_index];
      const auto& path = d_->paths_[file];
      slot.shuffled = nullptr;
      slot.ahead = nullptr;
      slot.early = false;
      if (read_ahead_) {
        // Decoded records ahead enough to cover tens of milliseconds of
        // a reader descheduled (8,192 of ~850 bytes gzipped: 40 ms here;
        // with 1,024 two files gave 1.36x of one, with 8,192 1.70x);
        // uncompressed ones, read in a fraction of that, 1,024, so that
        // they are still in the cache when parsed (with 8,192, parsed on
        // the consumer's thread, they ran at 0.66-1.04x of reading in
        // turn; with 1,024, 1.11-1.41x: docs/PERFORMANCE.md); and at most
        // 256 MiB for all the files.
        const FileReadAhead::Bounds bounds{
            .max_records = kReadAheadRecords / 2,
            .max_decoded_records = kReadAheadDecodedRecords / 2,
            .max_bytes = kReadAheadBytes / 2 / (2 * slots_.size())};
        std::unique_ptr<FileReadAhead> ahead;
        if (at_start) {
          ahead = std::make_unique<FileReadAhead>(
              ctx_, counter_,
              [&path, options = &d_->options_] {
                return OpenFileRecords(path, 0, 0, *options);
              },
              bounds, signal_.get());
        } else {
          ahead = std::make_unique<FileReadAhead>(
              ctx_, counter_,
              OpenFileRecords(path, offset, record, d_->options_), bounds,
              signal_.get());
        }
        slot.ahead = ahead.get();
        slot.records = std::move(ahead);
      } else {
        slot.records = OpenFileRecords(path, offset, record, d_->options_);
      }
      if (d_->options_.shuffle_buffer_per_file > 0) {
        auto shuffled = std::make_unique<ShuffledFileRecords>(
            path, std::move(slot.records), d_->options_.shuffle_buffer_per_file,
            FileShuffleSeed(epoch_seed_, file));
        slot.shuffled = shuffled.get();
        slot.records = std::move(shuffled);
      }
      slot.order_index = order_index;
    }
    void Close(Slot& slot, bool advance = true) {
      slot.records.reset();
      slot.shuffled = nullptr;
      slot.ahead = nullptr;
      --open_;
      if (advance) Advance();
    }
    // Not deterministic, `turn` the open slot whose turn it is: waits
    // until it or another open file has a record (or error) read.  false:
    // `turn` has one, or its end (the caller takes it in turn); true: *out
    // is a record another file had ready (or its error is thrown), from
    // the next slot on; the turns stay as they were.  A file with a
    // shuffle buffer counts as ready when its reader has a record: drawing
    // may then read more.
    bool TakeOutOfTurn(Slot& turn, Element* out) {
      ReadySignal::Waiter waiter(signal_.get(), ctx_);
      while (true) {
        const uint64_t seen = signal_->count();
        if (turn.ahead->WhatIsReady() != FileReadAhead::Readiness::kNothing) {
          return false;
        }
        bool closed = false;
        for (size_t i = 1; i < slots_.size() && !closed; ++i) {
          Slot& slot = slots_[(cycle_ + i) % slots_.size()];
          if (slot.ahead &&
              slot.ahead->WhatIsReady() == FileReadAhead::Readiness::kRecord) {
            slot.early = false;
            try {
              if (slot.records->Next(out)) return true;
            } catch (...) {
              Close(slot, false);
              throw;
            }
            // A shuffle buffer's file that ended while it drew.
            Close(slot, false);
            closed = true;
          }
        }
        if (closed) continue;
        if (ctx_->cancelled()) throw Cancelled();
        WaitScope wait(counter_);
        waiter.Wait(seen);
      }
    }
    void Advance() {
      cycle_ = (cycle_ + 1) % slots_.size();
      block_index_ = 0;
    }

    const TFRecordDataset* d_;
    IteratorContext* ctx_;
    std::vector<size_t> order_;
    uint64_t epoch_seed_;
    StageCounter* counter_;  // this stage's (its readers count in it)
    const bool read_ahead_;
    std::unique_ptr<ReadySignal> signal_;  // read ahead, not deterministic
    uint64_t wake_up_id_ = 0;
    std::vector<Slot> slots_;
    std::deque<Slot> upcoming_;  // read ahead: the next files, opened
    size_t cycle_ = 0;
    uint64_t block_index_ = 0;  // records taken from slots_[cycle_]
    size_t next_file_ = 0;
    size_t open_ = 0;
  };

  std::vector<std::string> files_;
  std::vector<std::shared_ptr<const std::string>> paths_;
  TFRecordOptions options_;
};

}  // namespace

void SetTFRecordReadAhead(bool on) { read_ahead_enabled.store(on); }
bool ReadsFilesAhead(const TFRecordOptions& options) {
  return options.num_parallel_reads > 1 && read_ahead_enabled.load();
}

uint64_t FileShuffleSeed(uint64_t epoch_seed, size_t file) {
  // A domain of its own ("fileshuf"), apart from the file order's
  // generator, which is seeded with epoch_seed itself.
  return MixSeed(MixSeed(epoch_seed, 0x6669'6c65'7368'7566ULL), file);
}

struct ShuffledFileRecords::Entry {
  RecordView view;
  uint64_t inserted = 0;  // its stamp (CompactionClock)
};

ShuffledFileRecords::ShuffledFileRecords(
    const std::shared_ptr<const std::string>& path,
    std::unique_ptr<FileRecords> in, int64_t buffer_size, uint64_t seed)
    : path_(path),
      in_(std::move(in)),
      buffer_size_(buffer_size),
      rng_(seed),
      clock_(buffer_size),
      compacted_(kCompactedChunkBytes) {
  // (Not for an object made only to save a fresh state: FileReader's.)
  // At most 65,536 entries (5 MiB) ahead: many files are open at once,
  // each with a buffer; a larger one grows as it fills.
  if (in_ == nullptr) return;
  buffer_.reserve(
      static_cast<size_t>(std::min<int64_t>(buffer_size_, int64_t{1} << 16)));
}

ShuffledFileRecords::~ShuffledFileRecords() = default;

bool ShuffledFileRecords::NextView(RecordView* out) {
  if (!drawn_.empty()) {
    *out = std::move(drawn_.front());
    drawn_.pop_front();
    return true;
  }
  while (Filling()) ReadOne();
  if (buffer_.empty()) {
    if (error_) {
      std::exception_ptr e = std::move(error_);
      error_ = nullptr;
      std::rethrow_exception(e);
    }
    return false;
  }
  // The entry the draw kPeek calls on takes while the buffer stays this
  // full (it does until the file ends), asked for now: the entries are
  // cold (a file's buffer of 625 is ~55 KB, and 16 files' buffers and
  // the blocks their views hold pass through the cache between two draws
  // from one file), and each draw's miss then overlaps the draws before
  // (Fashion-MNIST, 16 files of 625, Intel Xeon: the reader's ns a record
  // 364-391 -> 338-369 at one thread; docs/PERFORMANCE.md).
  constexpr uint64_t kPeek = 4;
  __builtin_prefetch(&buffer_[rng_.PeekBelow(buffer_.size(), kPeek)], 1, 3);
  // ShuffleDataset's draw, with the same generator.
  const size_t i = static_cast<size_t>(rng_.Below(buffer_.size()));
  *out = std::move(buffer_[i].view);
  if (i + 1 != buffer_.size()) buffer_[i] = std::move(buffer_.back());
  buffer_.pop_back();
  return true;
}

bool ShuffledFileRecords::Filling() const {
  return !input_end_ && static_cast<int64_t>(buffer_.size()) < buffer_size_;
}

void ShuffledFileRecords::ReadOne() {
  Entry& e = buffer_.emplace_back();
  bool got = false;
  try {
    got = in_->NextView(&e.view);
  } catch (...) {  // kept for after the buffer: nothing buffered is lost
    buffer_.pop_back();
    input_end_ = true;
    error_ = std::current_exception();
    return;
  }
  if (!got) {
    buffer_.pop_back();
    input_end_ = true;
    return;
  }
  e.inserted = clock_.Stamp();
  if (clock_.SweepDue()) CompactOld();
}

// A view buffered for kCompactAfter buffer lengths that holds a larger
// buffer (its read block, 128 KiB) gets a copy of its own bytes in a small
// shared chunk: under a uniform draw a fraction e^-3 of the records stay
// that long, and each would keep its block.  A view looked at is settled.
void ShuffledFileRecords::CompactOld() {
  for (Entry& e : buffer_) {
    if (clock_.Settle(&e.inserted) && ViewsALargerBuffer(e.view)) {
      compacted_.Copy(e.view.bytes(), &e.view);
    }
  }
}

void ShuffledFileRecords::Save(StateWriter* w,
                               std::span<const RecordView> drawn,
                               bool error_ahead) const {
  const auto write = [w](const RecordView& v) {
    w->U64(v.frame_crc ? 1 : 0);
    w->U64(v.offset);
    w->U64(v.index);
    if (v.frame_crc) {
      w->U64(records::crc32c::Value(v.data, v.size));
    } else {
      w->String(v.bytes());
    }
  };
  w->BeginStage("shuffle per file");
  w->U64(rng_.state());
  w->Bool(input_end_ && !error_ && !error_ahead);
  w->U64(drawn.size() + drawn_.size());
  for (const RecordView& v : drawn) write(v);
  for (const RecordView& v : drawn_) write(v);
  w->U64(buffer_.size());
  for (const Entry& e : buffer_) write(e.view);
}

void ShuffledFileRecords::Restore(StateReader* r) {
  ReferenceReader refs;
  const auto read = [&] {
    const uint64_t kind = r->U64();
    if (kind > 1) r->Fail("unknown record kind");
    const uint64_t offset = r->U64();
    const uint64_t index = r->U64();
    if (kind == 1) {
      return refs.Read(path_, offset, index, static_cast<uint32_t>(r->U64()));
    }
    RecordView v;
    OwnBytes(&v, r->String());
    v.path = &path_;
    v.offset = offset;
    v.index = index;
    return v;
  };
  r->BeginStage("shuffle per file");
  rng_.set_state(r->U64());
  input_end_ = r->Bool();
  error_ = nullptr;
  drawn_.clear();
  for (uint64_t n = r->U64(); n > 0; --n) drawn_.push_back(read());
  const uint64_t n = r->U64();
  if (n > static_cast<uint64_t>(buffer_size_)) {
    r->Fail(fmt::format("{} records in a buffer of {}", n, buffer_size_));
  }
  buffer_.clear();
  // Read back into buffers of their own size: none needs copying out.
  for (uint64_t i = 0; i < n; ++i) {
    buffer_.push_back({read(), CompactionClock::kSettled});
  }
}

void OwnBytes(RecordView* v, std::string_view bytes) {
  auto own = std::make_shared<records::AlignedVector<char>>(bytes.size());
  if (!bytes.empty()) std::memcpy(own->data(), bytes.data(), bytes.size());
  v->data = own->data();
  v->size = bytes.size();
  v->storage_bytes = bytes.size();
  v->owner = std::move(own);
}

void RecordArena::Copy(std::string_view r, RecordView* out) {
  if (r.size() > chunk_bytes_ / 4) {
    OwnBytes(out, r);
    return;
  }
  if (!chunk_ || used_ + r.size() > chunk_->size()) {
    chunk_ = std::make_shared<records::AlignedVector<char>>(chunk_bytes_);
    used_ = 0;
  }
  char* dst = chunk_->data() + used_;
  if (!r.empty()) std::memcpy(dst, r.data(), r.size());
  used_ += r.size();
  out->data = dst;
  out->size = r.size();
  out->owner = chunk_;
  out->storage_bytes = chunk_->size();
}

Tensor RecordArena::Copy(std::string_view r) {
  RecordView v;
  Copy(r, &v);
  return v.ToTensor();
}

bool FileRecords::Next(Element* out) {
  RecordView v;
  if (!NextView(&v)) return false;
  SetRecord(out, v.ToTensor(), *v.path, v.offset, v.index, v.frame_crc);
  return true;
}

std::unique_ptr<FileRecords> OpenFileRecords(
    const std::shared_ptr<const std::string>& path, uint64_t offset,
    uint64_t index, const TFRecordOptions& options) {
  // Checked as each file is opened (as tf.data touches no file before):
  // a stat per open, not one per file of a long list when the dataset is
  // made.  Before the detection below opens it: a named pipe would block.
  records::RequireRegularFiles({*path}, kSourcesNeedRegularFiles);
  const records::Compression c =
      options.compression
          ? *options.compression
          : records::DetectCompression(records::ReadableFile(*path));
  if (c == records::Compression::kNone) {
    // Each record before `offset` took a whole frame.  A state that says
    // otherwise was not saved from this file: its record numbers could
    // reach UINT64_MAX, where the fused reader's chunks (read up to a
    // record number) came out empty without end.
    if (index > offset / records::kFrameOverhead) {
      throw Error(fmt::format(
          "{}: record {} cannot start at byte {} (a record takes at least {} "
          "bytes): the position was not saved from this file",
          *path, index, offset, records::kFrameOverhead));
    }
    return std::make_unique<BlockFileRecords>(path, offset, index, options);
  }
  return std::make_unique<StreamFileRecords>(path, index, c, options);
}

std::unique_ptr<FileRecords> OpenFileRange(
    const std::shared_ptr<const std::string>& path, uint64_t offset,
    uint64_t index, uint64_t end_offset, const TFRecordOptions& options) {
  return std::make_unique<BlockFileRecords>(path, offset, index, options,
                                            end_offset);
}

void SetRecord(Element* out, Tensor record,
               const std::shared_ptr<const std::string>& path, uint64_t offset,
               uint64_t index, std::optional<uint32_t> frame_crc) {
  if (out->components.size() == 1 && out->components[0].name == "record") {
    out->components[0].tensor = std::move(record);
  } else {
    out->components.clear();
    out->components.push_back({"record", std::move(record)});
  }
  out->origin.file = path;
  out->origin.offset = offset;
  out->origin.record = index;
  out->origin.frame_crc = frame_crc;
  out->batch_origins.reset();
}

std::vector<std::string> ExpandFiles(const std::vector<std::string>& paths,
                                     std::string_view who) {
  try {
    return records::ExpandRecordPaths(paths);
  } catch (const records::FileListError& e) {
    throw Error(fmt::format("{}: {}", who, e.what()));
  }
}

std::optional<std::vector<std::string>> FilesOfShard(
    const std::vector<std::string>& files, int64_t num_shards, int64_t index) {
  if (static_cast<int64_t>(files.size()) < num_shards) return std::nullopt;
  std::vector<std::string> mine;
  for (size_t i = static_cast<size_t>(index); i < files.size();
       i += static_cast<size_t>(num_shards)) {
    mine.push_back(files[i]);
  }
  return mine;
}

uint64_t FilesFingerprint(const std::vector<std::string>& files) {
  std::string joined;
  for (const auto& f : files) joined += f + '\n';
  return Fingerprint(joined);
}

DatasetPtr TFRecord(std::vector<std::string> files, TFRecordOptions options) {
  return std::make_shared<TFRecordDataset>(ExpandFiles(files, "FromTFRecords"),
                                           std::move(options));
}

}  // namespace recflow::pipeline::stages
