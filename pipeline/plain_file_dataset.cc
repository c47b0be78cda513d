// The plain-file sources: lines of text files (tf.data's TextLineDataset)
// and fixed-length records (FixedLengthRecordDataset), read through the
// records layer's decoders.  One stage reads its files in turn; Dataset
// interleaves one stage per file for num_parallel_reads.
//
// The state is the file's number, the offset in its decoded stream of the
// next byte to read and the number of elements read from it.  Restore
// seeks there (an uncompressed file) or decodes up to it, and refuses a
// position that cannot be an element's start (a line's: after a '\n' or at
// the end; a record's: header + k * record_bytes).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "pipeline/stages.h"
#include "records/file_list.h"
#include "records/input_stream.h"

namespace recflow::pipeline::stages {
namespace {

class PlainFileDataset final : public DatasetBase {
 public:
  PlainFileDataset(std::vector<std::string> files, PlainFraming framing,
                   PlainFileOptions options)
      : files_(std::move(files)), framing_(framing), options_(options) {}

  std::string Describe() const override {
    const std::string what =
        lines() ? std::string("TextLines")
                : fmt::format(
                      "FixedLengthRecords(record={}, header={}, "
                      "footer={}, ",
                      framing_.record_bytes, framing_.header_bytes,
                      framing_.footer_bytes);
    return fmt::format("{}{}{} files {:016x}, {})", what, lines() ? "(" : "",
                       files_.size(), FilesFingerprint(files_),
                       options_.compression
                           ? records::CompressionName(*options_.compression)
                           : "compression by name");
  }
  std::string StageName() const override {
    return lines() ? "text_line" : "fixed_length_record";
  }
  std::unique_ptr<IteratorBase> MakeIteratorInternal(IteratorContext*,
                                                     uint64_t) const override {
    return std::make_unique<It>(this);
  }
  std::shared_ptr<const DatasetBase> ShardByFiles(
      int64_t num_shards, int64_t index) const override {
    auto mine = FilesOfShard(files_, num_shards, index);
    if (!mine) return nullptr;
    return std::make_shared<PlainFileDataset>(std::move(*mine), framing_,
                                              options_);
  }

 private:
  bool lines() const { return framing_.record_bytes == 0; }

  class It final : public IteratorBase {
   public:
    explicit It(const PlainFileDataset* d) : d_(d) {}

    bool GetNext(Element* out) override {
      while (true) {
        if (!stream_) {
          if (file_ >= d_->files_.size()) return false;
          try {
            Open(file_);
            SkipHeader();
          } catch (...) {
            NextFile();  // its error in its place, then the next file
            throw;
          }
        }
        const uint64_t start = offset_;
        bool got;
        try {
          got = d_->lines() ? NextLine() : NextRecord();
        } catch (...) {
          NextFile();  // past damage, the file cannot be read on
          throw;
        }
        if (!got) {
          NextFile();
          continue;
        }
        out->components.clear();
        out->batch_origins.reset();
        out->components.push_back(
            {d_->lines() ? "line" : "record", Tensor::BytesScalar(value_)});
        out->origin = {path_, start, count_++, std::nullopt};
        return true;
      }
    }

    void Save(StateWriter* w) override {
      w->BeginStage(d_->StageName());
      w->U64(file_);
      w->U64(stream_ ? offset_ : 0);
      w->U64(stream_ ? count_ : 0);
    }

    void Restore(StateReader* r) override {
      r->BeginStage(d_->StageName());
      const uint64_t file = r->U64();
      const uint64_t offset = r->U64();
      const uint64_t count = r->U64();
      stream_.reset();
      file_ = file;
      offset_ = 0;
      count_ = 0;
      if (file > d_->files_.size() ||
          (file == d_->files_.size() && (offset != 0 || count != 0))) {
        r->Fail(fmt::format("file {} of {}", file, d_->files_.size()));
      }
      if (offset == 0) {  // the file is not open yet
        if (count != 0) r->Fail(fmt::format("{} elements at offset 0", count));
        return;
      }
      const PlainFraming& f = d_->framing_;
      if (!d_->lines() &&
          (offset < f.header_bytes ||
           (offset - f.header_bytes) / f.record_bytes != count ||
           (offset - f.header_bytes) % f.record_bytes != 0)) {
        r->Fail(
            fmt::format("offset {} for record {} (header {}, records of {})",
                        offset, count, f.header_bytes, f.record_bytes));
      }
      Open(file);
      if (!SkipTo(offset)) {
        throw Error(fmt::format(
            "{}: the state's offset {} is past its end ({} bytes{}): the file "
            "changed since the state was saved",
            *path_, offset, offset_, Decoded()));
      }
      if (d_->lines() && !AtLineStart()) {
        throw Error(fmt::format(
            "{}: the state's offset {} is not at the start of a line: the "
            "file changed since the state was saved",
            *path_, offset));
      }
      count_ = count;
    }

   private:
    void Open(size_t index) {
      const std::string& path = d_->files_[index];
      records::RequireRegularFiles({path}, kSourcesNeedRegularFiles);
      file_handle_ = std::make_unique<records::ReadableFile>(path);
      path_ = std::make_shared<const std::string>(path);
      const PlainFraming& f = d_->framing_;
      compression_ = d_->options_.compression.value_or(
          records::CompressionFromSuffix(path));
      if (!d_->lines() && compression_ == records::Compression::kNone) {
        const uint64_t size = file_handle_->size();
        const uint64_t around = f.header_bytes + f.footer_bytes;
        if (size < around || (size - around) % f.record_bytes != 0) {
          throw Error(BodyError(size));
        }
      }
      stream_ = records::OpenInputStream(file_handle_.get(), compression_);
      buffer_.resize(std::max<size_t>(
          {d_->options_.buffer_bytes, size_t{1},
           static_cast<size_t>(f.record_bytes + f.footer_bytes)}));
      begin_ = end_ = 0;
      eof_ = false;
      offset_ = 0;
      count_ = 0;
    }

    // The file is done with (ended, or failed): the next GetNext opens the
    // next one, and a state saved meanwhile says so.
    void NextFile() {
      stream_.reset();
      file_handle_.reset();
      ++file_;
      offset_ = 0;
      count_ = 0;
    }

    std::string BodyError(uint64_t size) const {
      const PlainFraming& f = d_->framing_;
      const uint64_t around = f.header_bytes + f.footer_bytes;
      if (size < around) {
        return fmt::format(
            "{}: {} bytes{}, fewer than its header ({} bytes) and footer ({} "
            "bytes)",
            *path_, size, Decoded(), f.header_bytes, f.footer_bytes);
      }
      return fmt::format(
          "{}: without its header ({} bytes) and footer ({} bytes), its body "
          "is {} bytes{}, not a whole number of records of {} bytes",
          *path_, f.header_bytes, f.footer_bytes, size - around, Decoded(),
          f.record_bytes);
    }
    std::string Decoded() const {
      return compression_ == records::Compression::kNone
                 ? std::string()
                 : fmt::format(" decoded ({})",
                               records::CompressionName(compression_));
    }

    // Reads more of the stream after what the buffer holds, moving that to
    // the buffer's front first; false once the stream has ended.  A full
    // buffer (a line longer than it; records' buffers hold a record and
    // the footer) grows, to no more than max_line_bytes + 1: a line that
    // fills that is too long.
    bool Fill() {
      if (eof_) return false;
      if (begin_ > 0) {
        std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
        end_ -= begin_;
        begin_ = 0;
      }
      if (end_ == buffer_.size()) {
        const size_t grown = buffer_.size() * 2;
        const uint64_t max = d_->options_.max_line_bytes;
        buffer_.resize(max < grown ? static_cast<size_t>(max) + 1 : grown);
      }
      size_t got;
      try {
        got = stream_->Read(buffer_.data() + end_, buffer_.size() - end_);
      } catch (const records::DecompressionError& e) {
        throw records::UndecodableFile(*path_, compression_, e);
      }
      if (got == 0) {
        eof_ = true;
        return false;
      }
      end_ += got;
      return true;
    }
    // Holds at least `n` unread bytes, unless the stream ends first.
    bool Have(size_t n) {
      while (end_ - begin_ < n) {
        if (!Fill()) return false;
      }
      return true;
    }
    void Consume(size_t n) {
      begin_ += n;
      offset_ += n;
    }

    void SkipHeader() {
      // An uncompressed file's size was checked as it was opened.
      if (!SkipTo(d_->framing_.header_bytes)) throw Error(BodyError(offset_));
    }
    // Decodes and drops bytes up to stream offset `offset` (>= offset_);
    // an uncompressed file seeks there.  false: the stream ends first
    // (offset_ is then its end).
    bool SkipTo(uint64_t offset) {
      if (compression_ == records::Compression::kNone && begin_ == end_ &&
          offset_ == file_handle_->position()) {
        const uint64_t to = std::min(offset, file_handle_->size());
        file_handle_->Seek(to);
        offset_ = to;
        if (to > 0) {
          char last = 0;
          file_handle_->ReadAt(to - 1, &last, 1);
          last_skipped_ = last;
        }
        return to == offset;
      }
      while (offset_ < offset) {
        if (begin_ == end_ && !Fill()) return false;
        const size_t n = static_cast<size_t>(
            std::min<uint64_t>(offset - offset_, end_ - begin_));
        last_skipped_ = buffer_[begin_ + n - 1];
        Consume(n);
      }
      return true;
    }
    // After SkipTo: whether the position can be a line's start.
    bool AtLineStart() {
      return last_skipped_ == '\n' || (begin_ == end_ && !Fill());
    }

    // The next line into value_ (a view of the buffer, or of stripped_);
    // false at the end of the file.  Throws Error for a line longer than
    // max_line_bytes, having read no more than max_line_bytes + 1 of it.
    bool NextLine() {
      size_t scanned = 0;  // bytes after begin_ known to hold no '\n'
      while (true) {
        const char* from = buffer_.data() + begin_ + scanned;
        const auto* nl = static_cast<const char*>(
            std::memchr(from, '\n', end_ - begin_ - scanned));
        if (nl != nullptr) {
          const size_t length =
              static_cast<size_t>(nl - buffer_.data()) - begin_;
          if (length > d_->options_.max_line_bytes) LineTooLong();
          TakeLine(length);
          Consume(length + 1);
          return true;
        }
        scanned = end_ - begin_;
        if (scanned > d_->options_.max_line_bytes) LineTooLong();
        if (!Fill()) break;
      }
      // The last line, without '\n': a line only if something is left
      // once the '\r's are gone, as TensorFlow's reader decides.
      const size_t length = end_ - begin_;
      TakeLine(length);
      Consume(length);
      return !value_.empty();
    }
    [[noreturn]] void LineTooLong() const {
      throw Error(fmt::format(
          "{}: line {}, at byte {}{}, is longer than {} bytes, the most a "
          "line may hold (max_line_bytes): is the file text, with line ends?",
          *path_, count_ + 1, offset_,
          compression_ == records::Compression::kNone
              ? std::string()
              : fmt::format(" of the {}-decoded stream",
                            records::CompressionName(compression_)),
          d_->options_.max_line_bytes));
    }
    void TakeLine(size_t length) {
      const char* line = buffer_.data() + begin_;
      value_ = std::string_view(line, length);
      if (std::memchr(line, '\r', length) != nullptr) {
        stripped_.assign(line, length);
        stripped_.erase(std::remove(stripped_.begin(), stripped_.end(), '\r'),
                        stripped_.end());
        value_ = stripped_;
      }
    }

    // The next record into value_ (a view of the buffer); false at the end
    // of the file's body.
    bool NextRecord() {
      const PlainFraming& f = d_->framing_;
      const size_t record = static_cast<size_t>(f.record_bytes);
      if (Have(record + static_cast<size_t>(f.footer_bytes))) {
        value_ = std::string_view(buffer_.data() + begin_, record);
        Consume(record);
        return true;
      }
      const uint64_t left = end_ - begin_;
      if (left != f.footer_bytes) throw Error(BodyError(offset_ + left));
      return false;
    }

    const PlainFileDataset* d_;
    std::unique_ptr<records::ReadableFile> file_handle_;
    std::unique_ptr<records::InputStream> stream_;  // null: no file open
    std::shared_ptr<const std::string> path_;
    records::Compression compression_ = records::Compression::kNone;
    std::vector<char> buffer_;
    size_t begin_ = 0, end_ = 0;  // the unread bytes in buffer_
    bool eof_ = false;
    char last_skipped_ = 0;
    // The element read last: valid until the next read fills the buffer.
    std::string_view value_;
    std::string stripped_;  // a line without its '\r's
    size_t file_ = 0;
    uint64_t offset_ = 0;  // stream offset of buffer_[begin_]
    uint64_t count_ = 0;   // elements read from the open file
  };

  std::vector<std::string> files_;
  PlainFraming framing_;
  PlainFileOptions options_;
};

}  // namespace

DatasetPtr PlainFile(std::vector<std::string> files, PlainFraming framing,
                     PlainFileOptions options) {
  return std::make_shared<PlainFileDataset>(std::move(files), framing, options);
}

}  // namespace recflow::pipeline::stages
