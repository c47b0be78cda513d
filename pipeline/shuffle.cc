// Shuffle: TensorFlow's buffered shuffle.
#include <fmt/format.h>

#include <map>

#include "pipeline/stages.h"
#include "records/compression.h"
#include "records/crc32c.h"
#include "records/file.h"
#include "records/tfrecord_format.h"

namespace recflow::pipeline::stages {
namespace {

// Decides which buffered elements can be saved as references: a single
// "record" bytes scalar whose bytes are those of the frame at its origin
// in an uncompressed file (both CRCs of the frame are checked against the
// file now).
struct RecordReferences {
  std::vector<std::string> files;
  std::map<std::string, int64_t> index;  // -1: not usable
  std::map<std::string, std::unique_ptr<records::ReadableFile>> open;

  int64_t Find(const Element& e) {
    if (e.components.size() != 1 || e.components[0].name != "record" ||
        !e.origin.file || e.batch_origins) {
      return -1;
    }
    const Tensor& t = e.components[0].tensor;
    if (t.dtype() != DType::kBytes || t.shape().rank() != 0) return -1;
    const std::string& path = *e.origin.file;
    auto it = index.find(path);
    if (it == index.end()) {
      int64_t id = -1;
      try {
        auto file = std::make_unique<records::ReadableFile>(path);
        if (records::DetectCompression(*file) == records::Compression::kNone) {
          id = static_cast<int64_t>(files.size());
          files.push_back(path);
          open[path] = std::move(file);
        }
      } catch (const records::Error&) {
      }
      it = index.emplace(path, id).first;
    }
    if (it->second < 0) return -1;
    const std::string_view bytes = t.bytes(0);
    char header[records::kHeaderBytes];
    char footer[records::kFooterBytes];
    const records::ReadableFile& file = *open[path];
    const uint64_t at = e.origin.offset;
    if (file.ReadAt(at, header, sizeof header) != sizeof header ||
        !records::HeaderChecks(header) ||
        records::HeaderLength(header) != bytes.size() ||
        file.ReadAt(at + records::kHeaderBytes + bytes.size(), footer,
                    sizeof footer) != sizeof footer ||
        records::crc32c::Unmask(records::DecodeLittleEndian<uint32_t>(
            footer)) != records::crc32c::Value(bytes.data(), bytes.size())) {
      return -1;
    }
    return it->second;
  }
};

// The record a reference names, checked against its CRC in the state.
Element ReadRecordAt(const std::shared_ptr<const std::string>& path,
                     uint64_t offset, uint64_t record, uint32_t crc) {
  records::ReadableFile file(*path);
  char header[records::kHeaderBytes];
  auto fail = [&](std::string_view what) -> Element {
    throw Error(
        fmt::format("shuffle state: {}: record {} at offset {}: {}; "
                    "the file changed since the state was saved",
                    *path, record, offset, what));
  };
  if (file.ReadAt(offset, header, sizeof header) != sizeof header ||
      !records::HeaderChecks(header)) {
    return fail("no record header there");
  }
  const uint64_t length = records::HeaderLength(header);
  if (length > (file.size() > offset + records::kFrameOverhead
                    ? file.size() - offset - records::kFrameOverhead
                    : 0))
    return fail("length past the end");
  std::string data(length, '\0');
  if (file.ReadAt(offset + records::kHeaderBytes, data.data(), length) !=
      length) {
    return fail("the record is cut short");
  }
  if (records::crc32c::Value(data.data(), data.size()) != crc) {
    return fail("different bytes");
  }
  Element e;
  e.components.push_back({"record", Tensor::BytesScalar(data)});
  e.origin.file = path;
  e.origin.offset = offset;
  e.origin.record = record;
  return e;
}

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

  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    // Unseeded: the iterator's random seed, told apart per stage.
    const uint64_t base =
        seed_ ? *seed_ : MixSeed(ctx->seed(), Fingerprint(Describe()));
    const uint64_t seed = reshuffle_ ? MixSeed(base, salt) : base;
    return std::make_unique<It>(this, input_->MakeIterator(ctx, salt), seed,
                                ctx->Counter(this, StageName()));
  }

 private:
  // The buffer is filled to buffer_size; each call delivers a uniformly
  // chosen buffered element and the next input takes its place.  Buffered
  // elements are compacted so that they do not keep whole read blocks
  // alive.
  class It final : public IteratorBase {
   public:
    It(const ShuffleDataset* d, std::unique_ptr<IteratorBase> in, uint64_t seed,
       StageCounter* counter)
        : d_(d), in_(std::move(in)), rng_(seed), counter_(counter) {
      buffer_.reserve(static_cast<size_t>(
          std::min<int64_t>(d->buffer_size_, int64_t{1} << 20)));
    }

    bool GetNext(Element* out) override {
      while (!input_end_ &&
             static_cast<int64_t>(buffer_.size()) < d_->buffer_size_) {
        Element e;
        if (!in_->GetNext(&e)) {
          input_end_ = true;
          break;
        }
        for (auto& c : e.components) c.tensor = c.tensor.Compact();
        buffer_.push_back(std::move(e));
      }
      if (buffer_.empty()) return false;
      const size_t i = static_cast<size_t>(rng_.Below(buffer_.size()));
      *out = std::move(buffer_[i]);
      if (i + 1 != buffer_.size()) buffer_[i] = std::move(buffer_.back());
      buffer_.pop_back();
      counter_->buffered.store(static_cast<int64_t>(buffer_.size()),
                               std::memory_order_relaxed);
      return true;
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
      std::vector<int64_t> file_of(buffer_.size(), -1);
      for (size_t i = 0; i < buffer_.size(); ++i) {
        file_of[i] = refs.Find(buffer_[i]);
      }
      w->U64(refs.files.size());
      for (const auto& f : refs.files) w->String(f);
      w->U64(buffer_.size());
      for (size_t i = 0; i < buffer_.size(); ++i) {
        const Element& e = buffer_[i];
        if (file_of[i] < 0) {
          w->U64(0);
          w->WriteElement(e);
          continue;
        }
        const std::string_view record = e.components[0].tensor.bytes(0);
        w->U64(1);
        w->U64(static_cast<uint64_t>(file_of[i]));
        w->U64(e.origin.offset);
        w->U64(e.origin.record);
        w->U64(records::crc32c::Value(record.data(), record.size()));
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
        buffer_.push_back(ReadRecordAt(paths[file], offset, record,
                                       static_cast<uint32_t>(crc)));
      }
      in_->Restore(r);
    }

   private:
    const ShuffleDataset* d_;
    std::unique_ptr<IteratorBase> in_;
    Rng rng_;
    StageCounter* counter_;
    std::vector<Element> buffer_;
    bool input_end_ = false;
  };

  int64_t buffer_size_;
  std::optional<uint64_t> seed_;
  bool reshuffle_;
};

}  // namespace

DatasetPtr Shuffle(DatasetPtr input, int64_t buffer_size,
                   std::optional<uint64_t> seed, bool reshuffle) {
  return std::make_shared<ShuffleDataset>(std::move(input), buffer_size, seed,
                                          reshuffle);
}

}  // namespace recflow::pipeline::stages
