// Cache: the first complete pass over the input, kept in memory or in a
// file, serves every later iteration.
//
// As tf.data: a pass that does not complete (the iterator is destroyed
// first) leaves no cache.  A file cache is TFRecord framing: a first record
// naming the pipeline it caches, then one record per element (the
// StateWriter encoding, CRC-checked); it is written under a temporary name
// and renamed when the pass completes, so a cache file is complete or
// absent.  States stay small: a position, never the cached elements; a
// state restored where the cache is missing or half-filled (a new process)
// rebuilds it by reading the input's first pass again.
#include <fmt/format.h>
#include <sys/stat.h>

#include "pipeline/stages.h"
#include "records/tfrecord_reader.h"
#include "records/tfrecord_writer.h"

namespace recflow::pipeline::stages {
namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

struct MemoryCache {
  std::mutex mu;
  bool complete = false;
  uint64_t fill_salt = 0;  // of the pass that filled it
  std::vector<Element> elements;
};

class CacheDataset final : public UnaryDataset {
 public:
  CacheDataset(DatasetPtr input, std::string filename)
      : UnaryDataset(std::move(input)), filename_(std::move(filename)) {}

  std::string Label() const override {
    return filename_.empty() ? "Cache(memory)"
                             : fmt::format("Cache({})", filename_);
  }
  std::string StageName() const override { return "cache"; }
  int64_t Cardinality() const override { return input_->Cardinality(); }
  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    return std::make_unique<It>(this, ctx, salt);
  }

 private:
  class It final : public IteratorBase {
   public:
    It(const CacheDataset* d, IteratorContext* ctx, uint64_t salt)
        : d_(d), ctx_(ctx), salt_(salt) {
      if (d_->filename_.empty()) {
        memory_ = ctx->Shared<MemoryCache>(d_);
      }
      reading_ = CacheComplete();
      fill_salt_ = salt_;
      if (reading_ && memory_) {
        std::lock_guard<std::mutex> lock(memory_->mu);
        fill_salt_ = memory_->fill_salt;
      }
    }

    bool GetNext(Element* out) override {
      if (reading_) return Read(out);
      if (!input_) input_ = d_->input_->MakeIterator(ctx_, fill_salt_);
      if (!input_->GetNext(out)) {
        Publish();
        return false;
      }
      Append(*out);
      ++position_;
      return true;
    }

    void Save(StateWriter* w) override {
      w->BeginStage("cache");
      w->Bool(reading_);
      w->U64(position_);
      w->U64(fill_salt_);
      if (!reading_) {
        w->Bool(input_ != nullptr);
        if (input_) input_->Save(w);
      }
    }

    void Restore(StateReader* r) override {
      r->BeginStage("cache");
      const bool reading = r->Bool();
      position_ = r->U64();
      fill_salt_ = r->U64();
      if (reading) {
        if (!CacheComplete()) Rebuild();
        reading_ = true;
        OpenReader();
        for (uint64_t i = 0; i < position_; ++i) {
          Element skipped;
          if (!ReadRaw(&skipped)) {
            throw Error(
                fmt::format("cache holds fewer than the {} elements "
                            "the state has read",
                            position_));
          }
        }
        return;
      }
      reading_ = false;
      // The state holds the input's position but not the elements cached
      // before it: read the input's first pass again up to the position,
      // caching it, and go on from there.
      if (r->Bool()) {
        d_->input_->MakeIterator(ctx_, fill_salt_)->Restore(r);
      }
      input_ = d_->input_->MakeIterator(ctx_, fill_salt_);
      for (uint64_t i = 0; i < position_; ++i) {
        Element e;
        if (!input_->GetNext(&e)) {
          throw Error(
              fmt::format("cache: the input ended after {} elements "
                          "while restoring a state at element {}; "
                          "is it deterministic?",
                          i, position_));
        }
        Append(e);
      }
    }

   private:
    bool CacheComplete() {
      if (memory_) {
        std::lock_guard<std::mutex> lock(memory_->mu);
        return memory_->complete;
      }
      return Exists(d_->filename_);
    }

    void Append(const Element& e) {
      if (memory_) {
        Element copy = e;
        for (auto& c : copy.components) c.tensor = c.tensor.Compact();
        pending_.push_back(std::move(copy));
        return;
      }
      Writer().Write(EncodeElementRecord(e));
    }

    void Publish() {
      if (memory_) {
        std::lock_guard<std::mutex> lock(memory_->mu);
        if (!memory_->complete) {
          memory_->elements = std::move(pending_);
          memory_->fill_salt = fill_salt_;
          memory_->complete = true;
        }
        return;
      }
      Writer().Close();  // an empty input makes an empty cache
      writer_.reset();
    }

    // The cache file being written, opened with its header record on
    // first use.
    records::TFRecordWriter& Writer() {
      if (!writer_) {
        writer_ = std::make_unique<records::TFRecordWriter>(d_->filename_);
        writer_->Write(d_->input_->Describe());
      }
      return *writer_;
    }

    // Reads the input's first pass again into the cache.
    void Rebuild() {
      auto input = d_->input_->MakeIterator(ctx_, fill_salt_);
      Element e;
      while (input->GetNext(&e)) Append(e);
      Publish();
    }

    void OpenReader() {
      if (memory_) return;
      reader_ = std::make_unique<records::TFRecordReader>(d_->filename_);
      std::string_view header;
      if (!reader_->ReadRecord(&header) || header != d_->input_->Describe()) {
        throw Error(fmt::format(
            "cache file {} was written by another pipeline ({}); delete it "
            "to rebuild",
            d_->filename_,
            header.empty() ? std::string("empty") : std::string(header)));
      }
    }

    bool ReadRaw(Element* out) {
      if (memory_) {
        if (position_read_ >= memory_->elements.size()) return false;
        *out = memory_->elements[position_read_++];
        return true;
      }
      std::string_view blob;
      if (!reader_->ReadRecord(&blob)) return false;
      *out = DecodeElementRecord(blob);
      ++position_read_;
      return true;
    }

    bool Read(Element* out) {
      if (!reader_ && !memory_) OpenReader();
      if (!ReadRaw(out)) return false;
      ++position_;
      return true;
    }

    const CacheDataset* d_;
    IteratorContext* ctx_;
    uint64_t salt_;
    uint64_t fill_salt_ = 0;
    std::shared_ptr<MemoryCache> memory_;
    bool reading_ = false;
    uint64_t position_ = 0;
    size_t position_read_ = 0;
    std::unique_ptr<IteratorBase> input_;
    std::vector<Element> pending_;
    std::unique_ptr<records::TFRecordWriter> writer_;
    std::unique_ptr<records::TFRecordReader> reader_;
  };

  std::string filename_;
};

}  // namespace

DatasetPtr Cache(DatasetPtr input, std::string filename) {
  return std::make_shared<CacheDataset>(std::move(input), std::move(filename));
}

}  // namespace recflow::pipeline::stages
