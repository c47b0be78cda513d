#include "records/input_stream.h"

#include <fmt/format.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>

namespace recflow::records {
namespace {

// Compressed input is read in chunks of this size.
constexpr size_t kCompressedChunk = 256 << 10;

class FileInputStream final : public InputStream {
 public:
  explicit FileInputStream(ReadableFile* file) : file_(file) {}
  uint64_t file_position() const override { return file_->position(); }

 private:
  void ReadInto(char* dst, size_t n, size_t* done) override {
    *done = file_->Read(dst, n);
  }

  ReadableFile* const file_;
};

// ZLIB and GZIP through zlib's inflate.  Like TensorFlow's ZlibInputStream,
// a gzip stream may hold several members one after another (what `cat a.gz
// b.gz` gives); they decode as one stream.  A zlib stream must end where the
// file ends: trailing bytes are reported, not ignored.
class ZlibInputStream final : public InputStream {
 public:
  ZlibInputStream(ReadableFile* file, bool gzip)
      : file_(file), gzip_(gzip), in_(new char[kCompressedChunk]) {
    std::memset(&z_, 0, sizeof z_);
    if (inflateInit2(&z_, gzip ? MAX_WBITS + 16 : MAX_WBITS) != Z_OK) {
      throw IoError(file_->path(), "cannot initialise zlib");
    }
  }
  ~ZlibInputStream() override { inflateEnd(&z_); }

  uint64_t file_position() const override { return Consumed(); }

 private:
  void ReadInto(char* dst, size_t n, size_t* done_out) override {
    size_t& done = *done_out;
    while (done < n && !finished_) {
      if (z_.avail_in == 0 && !file_eof_) Refill();
      if (z_.avail_in == 0 && file_eof_) {
        if (member_started_) {
          throw DecompressionError(
              fmt::format("the {} stream ends early, inside a compressed "
                          "block (truncated file?)",
                          gzip_ ? "gzip" : "zlib"),
              file_->position());
        }
        finished_ = true;
        break;
      }
      z_.next_out = reinterpret_cast<Bytef*>(dst + done);
      const size_t want = std::min<size_t>(n - done, 1u << 30);
      z_.avail_out = static_cast<uInt>(want);
      const uInt before_in = z_.avail_in;
      const int rc = inflate(&z_, Z_NO_FLUSH);
      done += want - z_.avail_out;
      if (before_in != z_.avail_in) member_started_ = true;
      if (rc == Z_STREAM_END) {
        member_started_ = false;
        if (!gzip_) {
          ExpectEndOfFile();
          finished_ = true;
        } else {
          inflateReset(&z_);
        }
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        throw DecompressionError(
            fmt::format("{} data is corrupt ({})", gzip_ ? "gzip" : "zlib",
                        z_.msg != nullptr ? z_.msg : zError(rc)),
            Consumed());
      }
    }
  }

  uint64_t Consumed() const { return file_->position() - z_.avail_in; }

  void Refill() {
    const size_t got = file_->Read(in_.get(), kCompressedChunk);
    if (got == 0) file_eof_ = true;
    z_.next_in = reinterpret_cast<Bytef*>(in_.get());
    z_.avail_in = static_cast<uInt>(got);
  }

  void ExpectEndOfFile() {
    if (z_.avail_in == 0 && !file_eof_) Refill();
    if (z_.avail_in != 0) {
      throw DecompressionError(
          fmt::format("{} bytes follow the end of the zlib stream",
                      file_->size() > Consumed() ? file_->size() - Consumed()
                                                 : z_.avail_in),
          Consumed());
    }
  }

  ReadableFile* const file_;
  const bool gzip_;
  std::unique_ptr<char[]> in_;
  z_stream z_;
  bool file_eof_ = false;
  bool finished_ = false;
  bool member_started_ = false;
};

class ZstdInputStream final : public InputStream {
 public:
  ZstdInputStream(ReadableFile* file, bool track_frames)
      : file_(file),
        track_frames_(track_frames),
        in_(new char[kCompressedChunk]),
        dctx_(ZSTD_createDCtx()) {
    if (dctx_ == nullptr) throw IoError(file_->path(), "cannot create zstd");
  }
  ~ZstdInputStream() override { ZSTD_freeDCtx(dctx_); }

  uint64_t file_position() const override { return Consumed(); }
  const std::vector<ZstdFrame>* frames() const override {
    return track_frames_ ? &frames_ : nullptr;
  }

 private:
  void ReadInto(char* dst, size_t n, size_t* done_out) override {
    size_t& done = *done_out;
    while (done < n) {
      if (in_pos_ == in_size_) {
        if (file_eof_) break;
        in_size_ = file_->Read(in_.get(), kCompressedChunk);
        in_pos_ = 0;
        if (in_size_ == 0) {
          file_eof_ = true;
          break;
        }
      }
      ZSTD_inBuffer in{in_.get(), in_size_, in_pos_};
      ZSTD_outBuffer out{dst + done, n - done, 0};
      const size_t rc = ZSTD_decompressStream(dctx_, &out, &in);
      if (ZSTD_isError(rc)) {
        throw DecompressionError(
            fmt::format("zstd data is corrupt ({})", ZSTD_getErrorName(rc)),
            Consumed());
      }
      in_pos_ = in.pos;
      done += out.pos;
      frame_decoded_ += out.pos;
      in_frame_ = rc != 0;
      if (rc == 0) EndFrame();
    }
    if (file_eof_ && in_frame_) {
      throw DecompressionError(
          "the zstd stream ends inside a frame (truncated file?)", Consumed());
    }
  }

  uint64_t Consumed() const { return file_->position() - (in_size_ - in_pos_); }

  void EndFrame() {
    const uint64_t end = Consumed();
    if (track_frames_) {
      frames_.push_back({frame_file_start_, end - frame_file_start_,
                         stream_pos_, frame_decoded_});
    }
    stream_pos_ += frame_decoded_;
    frame_decoded_ = 0;
    frame_file_start_ = end;
  }

  ReadableFile* const file_;
  const bool track_frames_;
  std::unique_ptr<char[]> in_;
  ZSTD_DCtx* const dctx_;
  size_t in_size_ = 0;
  size_t in_pos_ = 0;
  bool file_eof_ = false;
  bool in_frame_ = false;
  uint64_t frame_file_start_ = 0;
  uint64_t frame_decoded_ = 0;
  uint64_t stream_pos_ = 0;
  std::vector<ZstdFrame> frames_;
};

}  // namespace

size_t InputStream::Read(char* dst, size_t n) {
  if (pending_) std::rethrow_exception(pending_);
  size_t done = 0;
  try {
    ReadInto(dst, n, &done);
  } catch (const Error&) {
    if (done == 0) throw;
    pending_ = std::current_exception();
  }
  return done;
}

DecompressionError::DecompressionError(std::string detail,
                                       uint64_t compressed_offset)
    : Error(
          fmt::format("{} (at compressed byte {})", detail, compressed_offset)),
      detail_(std::move(detail)),
      compressed_offset_(compressed_offset) {}

std::unique_ptr<InputStream> OpenInputStream(ReadableFile* file,
                                             Compression compression,
                                             bool track_zstd_frames) {
  switch (compression) {
    case Compression::kNone:
      return std::make_unique<FileInputStream>(file);
    case Compression::kZlib:
      return std::make_unique<ZlibInputStream>(file, false);
    case Compression::kGzip:
      return std::make_unique<ZlibInputStream>(file, true);
    case Compression::kZstd:
      return std::make_unique<ZstdInputStream>(file, track_zstd_frames);
  }
  throw IoError(file->path(), "unknown compression");
}

namespace {
constexpr size_t kByteReaderBuffer = 64 << 10;
}  // namespace

std::string Utf16FileError(std::string_view path, std::string_view format,
                           int a, int b) {
  if (!((a == 0xFF && b == 0xFE) || (a == 0xFE && b == 0xFF))) return "";
  return fmt::format(
      "{}:1: starts with a UTF-16 byte order mark ({:02X} {:02X}); {} is "
      "read as UTF-8: convert the file first (iconv -f UTF-16 -t UTF-8)",
      path, a, b, format);
}

IoError UndecodableFile(const std::string& path, Compression compression,
                        const DecompressionError& e) {
  return IoError(path, fmt::format("cannot be decoded as {}: {}",
                                   CompressionName(compression), e.what()));
}

ByteReader::ByteReader(std::string path, std::optional<Compression> compression)
    : file_(std::move(path)),
      compression_(compression.value_or(CompressionFromSuffix(file_.path()))),
      stream_(OpenInputStream(&file_, compression_)),
      buffer_(new char[kByteReaderBuffer]) {}

ByteReader::~ByteReader() = default;

bool ByteReader::Refill() {
  pos_ = end_ = 0;
  try {
    end_ = stream_->Read(buffer_.get(), kByteReaderBuffer);
  } catch (const DecompressionError& e) {
    throw UndecodableFile(file_.path(), compression_, e);
  }
  return end_ > 0;
}

template <typename Find>
int ByteReader::AppendUntilStop(std::string* out, size_t max_size, Find find) {
  while (pos_ < end_ || Refill()) {
    const char* from = buffer_.get() + pos_;
    const char* end = buffer_.get() + end_;
    const char* stop = find(from, end);
    const size_t take = stop - from;
    const size_t room = max_size - out->size();
    if (take > room) {  // past max_size: max_size + 1 bytes in all
      out->append(from, room + 1);
      pos_ += room + 1;
      return kFull;
    }
    out->append(from, take);
    if (stop != end) {
      pos_ += take + 1;
      return static_cast<unsigned char>(*stop);
    }
    pos_ = end_;
  }
  return -1;
}

bool ByteReader::GetLine(std::string* line, size_t max_size) {
  line->clear();
  const int stop =
      AppendUntilStop(line, max_size, [](const char* from, const char* end) {
        const void* newline = std::memchr(from, '\n', end - from);
        return newline != nullptr ? static_cast<const char*>(newline) : end;
      });
  return stop != -1 || !line->empty();
}

int ByteReader::AppendUntil(std::string* out, char a, char b, char c,
                            size_t max_size) {
  if (out->size() > max_size) return kFull;
  return AppendUntilStop(out, max_size,
                         [a, b, c](const char* from, const char* end) {
                           return FindFirstOf(from, end, a, b, c);
                         });
}

uint64_t ByteReader::file_position() const {
  const uint64_t read = stream_->file_position();
  // Uncompressed, the unread part of the buffer is the file's too.
  return compression_ == Compression::kNone ? read - (end_ - pos_) : read;
}

}  // namespace recflow::records
