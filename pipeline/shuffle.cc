// Shuffle: TensorFlow's buffered shuffle.
#include <fmt/format.h>

#include <bit>
#include <mutex>
#include <new>

#include "pipeline/stages.h"
#include "records/crc32c.h"
#include "records/file.h"
#include "records/index.h"

namespace recflow::pipeline::stages {
namespace {

// Storage for the records a shuffle buffer holds, reused LIFO.
//
// In the fill-and-replace algorithm every delivered record makes room for
// the next input, so once the buffer is full a shuffle needs no new memory
// at all: the slot a record was delivered from (and copied out of by the
// stage after, so still in the CPU's cache) takes the next record.  Taking
// it from here instead of malloc saves a large allocation and its free per
// record and the page faults of a heap that glibc grows and trims; it was
// 11-15% of a shuffled pipeline's samples under perf (docs/PERFORMANCE.md).
//
// Slots come in size classes a quarter of a power of two apart (from 256
// bytes up at most 25% of a slot is unused; below that the classes are 64,
// 128 and 192 bytes), are carved from 256 KiB chunks, and go back to their
// free list when the last Tensor viewing them is dropped, on any thread
// (the deleter holds the pool).  The pool keeps what it carved until
// it is destroyed: its high-water mark is the shuffle buffer plus what is
// in flight downstream.  One pool serves a dataset's iterators over all
// epochs (IteratorContext::Shared).  Thread-safe.
class SlotPool : public std::enable_shared_from_this<SlotPool> {
 public:
  static constexpr size_t kMaxSlot = 64 << 10;  // larger: Tensor::Compact

  ~SlotPool() {
    for (char* chunk : chunks_) {
      ::operator delete (chunk, std::align_val_t{kAlign});
    }
  }

  // A bytes scalar holding a copy of `value` (value.size() <= kMaxSlot).
  Tensor Copy(std::string_view value) {
    const int c = Class(value.size());
    char* slot = Take(c);
    if (!value.empty()) std::memcpy(slot, value.data(), value.size());
    std::shared_ptr<const void> owner(
        slot, [pool = shared_from_this(), c](const void* p) {
          pool->Give(c, static_cast<char*>(const_cast<void*>(p)));
        });
    return Tensor::BytesView(slot, value.size(), std::move(owner),
                             ClassBytes(c));
  }

 private:
  static constexpr size_t kAlign = 64;
  static constexpr size_t kChunk = 256 << 10;
  static constexpr int kClasses = 4 * 11;  // 64 B .. 64 KiB

  // Class k holds slots of ClassBytes(k) bytes: 64 x {4, 5, 6, 7}/4 x 2^(k/4).
  static size_t ClassBytes(int k) {
    return (size_t{64} << (k / 4)) * static_cast<size_t>(4 + k % 4) / 4 /
           kAlign * kAlign;
  }
  static int Class(size_t n) {
    if (n <= kAlign) return 0;
    // Power of two at or below n, in units of 64 bytes, then the quarter.
    const int p = std::bit_width((n - 1) / kAlign) - 1;
    int k = 4 * p;
    while (ClassBytes(k) < n) ++k;
    return k;
  }

  char* Take(int c) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& free = free_[c];
    if (free.empty()) Carve(c);
    char* slot = free.back();
    free.pop_back();
    return slot;
  }
  void Give(int c, char* slot) {
    std::lock_guard<std::mutex> lock(mu_);
    free_[c].push_back(slot);
  }
  // Cuts a fresh chunk into slots of class c (under mu_).
  void Carve(int c) {
    const size_t bytes = ClassBytes(c);
    const size_t n = std::max<size_t>(kChunk / bytes, 1);
    char* chunk =
        static_cast<char*>(::operator new (n* bytes, std::align_val_t{kAlign}));
    chunks_.push_back(chunk);
    // Reversed, so that slots are handed out in address order.
    for (size_t i = n; i-- > 0;) free_[c].push_back(chunk + i * bytes);
  }

  std::mutex mu_;
  std::vector<char*> free_[kClasses + 1];
  std::vector<char*> chunks_;
};

class ShuffleDataset final : public UnaryDataset {
 public:
  ShuffleDataset(DatasetPtr input, int64_t buffer_size,
                 std::optional<uint64_t> seed, bool reshuffle)
      : UnaryDataset(std::move(input)),
        buffer_size_(buffer_size),
        seed_(seed),
        reshuffle_(reshuffle) {}

  std::string Label() const override {
    return fmt::format("Shuffle({}, seed={}, reshuffle_each_iteration={})",
                       buffer_size_, seed_ ? fmt::format("{}", *seed_) : "none",
                       reshuffle_);
  }
  std::string StageName() const override { return "shuffle"; }
  int64_t Cardinality() const override { return input_->Cardinality(); }

  // The seed of an iterator made with `salt`.  Unseeded: the iterator's
  // random seed, told apart per stage.
  uint64_t SeedFor(IteratorContext* ctx, uint64_t salt) const {
    return StageSeed(*this, seed_, *ctx, salt, reshuffle_);
  }

  bool DescribeForFusion(FusableStage* out) const override {
    out->kind = FusableStage::Kind::kShuffle;
    out->input = input_;
    out->buffer_size = buffer_size_;
    out->shuffle_seed = [this](IteratorContext* ctx, uint64_t salt) {
      return SeedFor(ctx, salt);
    };
    return true;
  }

  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    const uint64_t seed = SeedFor(ctx, salt);
    auto pool = ctx->Shared<SlotPool>(this);
    return std::make_unique<It>(this, input_->MakeIterator(ctx, salt), seed,
                                ctx->Counter(this, StageName()),
                                std::move(pool));
  }

 private:
  // The buffer is filled to buffer_size; each call delivers a uniformly
  // chosen buffered element and the next input takes its place.  Buffered
  // elements are compacted so that they do not keep whole read blocks
  // alive.
  class It final : public IteratorBase {
   public:
    It(const ShuffleDataset* d, std::unique_ptr<IteratorBase> in, uint64_t seed,
       StageCounter* counter, std::shared_ptr<SlotPool> pool)
        : d_(d),
          in_(std::move(in)),
          rng_(seed),
          counter_(counter),
          pool_(std::move(pool)) {
      buffer_.reserve(static_cast<size_t>(
          std::min<int64_t>(d->buffer_size_, int64_t{1} << 20)));
    }

    bool GetNext(Element* out) override {
      ahead_.ThrowKept();  // met by FillAhead where this call meets it
      while (Filling()) ReadOne();
      if (buffer_.empty()) return false;
      const size_t i = static_cast<size_t>(rng_.Below(buffer_.size()));
      *out = std::move(buffer_[i]);
      if (i + 1 != buffer_.size()) buffer_[i] = std::move(buffer_.back());
      buffer_.pop_back();
      counter_->buffered.store(static_cast<int64_t>(buffer_.size()),
                               std::memory_order_relaxed);
      return true;
    }

    bool Draining() const override { return input_end_; }
    void FillAhead(size_t n) override {
      ahead_.Fill(
          n, [this] { return Filling(); }, [this] { ReadOne(); });
    }

    // Buffered records that are still byte for byte the record at their
    // origin in an uncompressed file are saved as (file, offset, record,
    // CRC), 40 bytes, and read back on restore; other elements are saved
    // whole (as tf.data saves its whole buffer).
    void Save(StateWriter* w) override {
      w->BeginStage("shuffle");
      w->U64(rng_.state());
      w->Bool(input_end_);
      RecordReferences refs;
      std::vector<std::optional<uint64_t>> file_of(buffer_.size());
      for (size_t i = 0; i < buffer_.size(); ++i) {
        file_of[i] = refs.Find(buffer_[i]);
      }
      refs.WriteFiles(w);
      w->U64(buffer_.size());
      for (size_t i = 0; i < buffer_.size(); ++i) {
        const Element& e = buffer_[i];
        if (!file_of[i]) {
          w->U64(0);
          w->WriteElement(e);
          continue;
        }
        const std::string_view record = e.components[0].tensor.bytes(0);
        WriteRecordReference(w, *file_of[i], e.origin.offset, e.origin.record,
                             record);
      }
      in_->Save(w);
    }
    void Restore(StateReader* r) override {
      r->BeginStage("shuffle");
      rng_.set_state(r->U64());
      input_end_ = r->Bool();
      const uint64_t files = r->U64();
      std::vector<std::shared_ptr<const std::string>> paths;
      for (uint64_t f = 0; f < files; ++f) {
        paths.push_back(std::make_shared<const std::string>(r->String()));
      }
      const uint64_t n = r->U64();
      if (n > static_cast<uint64_t>(d_->buffer_size_)) {
        throw Error(
            fmt::format("shuffle state holds {} elements, more than "
                        "its buffer of {}",
                        n, d_->buffer_size_));
      }
      buffer_.clear();
      ReferenceReader refs;
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t kind = r->U64();
        if (kind == 0) {
          buffer_.push_back(r->ReadElement());
          continue;
        }
        if (kind != 1) throw Error("shuffle state: unknown element kind");
        const uint64_t file = r->U64();
        const uint64_t offset = r->U64();
        const uint64_t record = r->U64();
        const uint64_t crc = r->U64();
        if (file >= paths.size()) throw Error("shuffle state: bad file");
        RecordView v =
            refs.Read(paths[file], offset, record, static_cast<uint32_t>(crc));
        Element e;
        SetRecord(&e, v.ToTensor(), paths[file], offset, record, v.frame_crc);
        buffer_.push_back(std::move(e));
      }
      in_->Restore(r);
    }

   private:
    bool Filling() const {
      return !input_end_ &&
             static_cast<int64_t>(buffer_.size()) < d_->buffer_size_;
    }
    // One element of the input into the buffer (or the input's end noted).
    void ReadOne() {
      Element e;
      if (!in_->GetNext(&e)) {
        input_end_ = true;
        return;
      }
      for (auto& c : e.components) Compact(&c.tensor);
      buffer_.push_back(std::move(e));
    }

    // Records (bytes scalars) that view a larger block are copied into a
    // slot of the pool; other tensors as Tensor::Compact does.
    void Compact(Tensor* t) {
      if (t->IsCompact()) return;
      if (t->dtype() == DType::kBytes && t->shape().rank() == 0 &&
          t->byte_size() <= SlotPool::kMaxSlot) {
        *t = pool_->Copy(t->bytes(0));
      } else {
        *t = t->Compact();
      }
    }

    const ShuffleDataset* d_;
    std::unique_ptr<IteratorBase> in_;
    Rng rng_;
    StageCounter* counter_;
    std::shared_ptr<SlotPool> pool_;
    std::vector<Element> buffer_;
    bool input_end_ = false;
    AheadFiller ahead_;  // FillAhead's kept error, for GetNext to throw
  };

  int64_t buffer_size_;
  std::optional<uint64_t> seed_;
  bool reshuffle_;
};

}  // namespace

RecordView ReferenceReader::Read(const std::shared_ptr<const std::string>& path,
                                 uint64_t offset, uint64_t record,
                                 uint32_t crc) {
  std::unique_ptr<records::ReadableFile>& file = open_[*path];
  if (!file) file = std::make_unique<records::ReadableFile>(*path);
  auto buffer = std::make_shared<records::AlignedVector<char>>();
  std::string_view bytes;
  try {
    bytes = records::ReadRecordAt(*file, offset, record, buffer.get());
  } catch (const records::RecordError& e) {
    throw Error(
        fmt::format("shuffle state: {}; the file changed since the "
                    "state was saved",
                    e.what()));
  }
  if (records::crc32c::Value(bytes.data(), bytes.size()) != crc) {
    throw Error(
        fmt::format("shuffle state: {}: record {} at offset {}: different "
                    "bytes; the file changed since the state was saved",
                    *path, record, offset));
  }
  RecordView v;
  v.data = bytes.data();
  v.size = bytes.size();
  v.storage_bytes = buffer->size();
  v.owner = std::move(buffer);
  v.path = &path;
  v.offset = offset;
  v.index = record;
  v.frame_crc = crc;
  return v;
}

std::optional<uint64_t> RecordReferences::Find(const Element& e) {
  if (e.components.size() != 1 || e.components[0].name != "record" ||
      !e.origin.file || !e.origin.frame_crc || e.batch_origins) {
    return std::nullopt;
  }
  const Tensor& t = e.components[0].tensor;
  if (t.dtype() != DType::kBytes || t.shape().rank() != 0) return std::nullopt;
  const std::string_view bytes = t.bytes(0);
  if (records::crc32c::Value(bytes.data(), bytes.size()) !=
      *e.origin.frame_crc) {
    return std::nullopt;  // a map changed the bytes
  }
  const auto [it, added] = index_.emplace(*e.origin.file, files_.size());
  if (added) files_.push_back(*e.origin.file);
  return it->second;
}

DatasetPtr Shuffle(DatasetPtr input, int64_t buffer_size,
                   std::optional<uint64_t> seed, bool reshuffle) {
  return std::make_shared<ShuffleDataset>(std::move(input), buffer_size, seed,
                                          reshuffle);
}

}  // namespace recflow::pipeline::stages
