// The uncompressed byte stream of a record file: the file itself, or its
// content decoded through zlib, gzip or zstd.  Used by TFRecordReader and,
// through ByteReader, by the text formats' readers; not thread-safe.
#ifndef RECFLOW_RECORDS_INPUT_STREAM_H_
#define RECFLOW_RECORDS_INPUT_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "records/compression.h"
#include "records/errors.h"
#include "records/file.h"

namespace recflow::records {

// The compressed input cannot be decoded.  `compressed_offset` is how far
// into the file the decoder had read.
class DecompressionError : public Error {
 public:
  DecompressionError(std::string detail, uint64_t compressed_offset);
  const std::string& detail() const { return detail_; }
  uint64_t compressed_offset() const { return compressed_offset_; }

 private:
  std::string detail_;
  uint64_t compressed_offset_;
};

// A zstd frame: where it lies in the file and in the decoded stream.
struct ZstdFrame {
  uint64_t file_offset;    // first byte of the frame in the file
  uint64_t file_bytes;     // compressed size
  uint64_t stream_offset;  // first decoded byte in the uncompressed stream
  uint64_t stream_bytes;   // decoded size
};

class InputStream {
 public:
  virtual ~InputStream() = default;
  // Reads up to `n` decoded bytes; returns fewer only at the end of the
  // stream (0 there) or before an error: the bytes decoded before damage
  // are returned first and the next call throws (so that a reader gets
  // every record before it, as TensorFlow's does).  Throws IoError or
  // DecompressionError.
  size_t Read(char* dst, size_t n);
  // Bytes of the file consumed so far.
  virtual uint64_t file_position() const = 0;
  // For zstd, when frame tracking was asked for: the frames decoded so far.
  virtual const std::vector<ZstdFrame>* frames() const { return nullptr; }

 protected:
  // Decodes up to `n` bytes into dst, counting them in *done as it goes
  // (so that what was decoded before a throw is known); stops short only
  // at the end of the stream.
  virtual void ReadInto(char* dst, size_t n, size_t* done) = 0;

 private:
  std::exception_ptr pending_;  // an error met after some bytes
};

// Opens the stream of `file` (which must outlive it), decoding `compression`.
// `track_zstd_frames` records frame boundaries (used to build indexes).
std::unique_ptr<InputStream> OpenInputStream(ReadableFile* file,
                                             Compression compression,
                                             bool track_zstd_frames = false);

// `e`, met decoding `path` as `compression`, as an IoError that names the
// file: "PATH: cannot be decoded as gzip: DETAIL (at compressed byte N)".
IoError UndecodableFile(const std::string& path, Compression compression,
                        const DecompressionError& e);

// For a text format read as UTF-8 (`format`: "CSV", "JSON Lines"): when a
// file's first two bytes `a` `b` are a UTF-16 byte order mark (FF FE or FE
// FF; neither byte is ever UTF-8), the error that says so and how to
// convert the file (Excel's "Unicode text" and PowerShell's default output
// are UTF-16); otherwise "".
std::string Utf16FileError(std::string_view path, std::string_view format,
                           int a, int b);

// The longest row the text formats read by default: a CSV record's cells
// and delimiters, a JSON line.  A longer one is an error that ends the
// reading (a quote never closed, line ends lost, a JSON document read as
// JSON Lines): past it the reader would hold the rest of the file in
// memory.  256 MiB: far past the rows of text data (a 10-minute 16 kHz
// clip as a JSON list of numbers is about 100 MB; Arrow's CSV and JSON
// readers refuse a row longer than their 1 MiB block unless told, Python's
// csv a cell past 128 KiB), while a file of one such row is refused in
// about a second, holding two to three times the limit in memory
// (docs/RELIABILITY.md).
inline constexpr uint64_t kDefaultMaxRowBytes = uint64_t{256} << 20;

// The first byte in [p, end) that is `a`, `b` or `c`, else `end`: 16 bytes
// at a time (SSE2) while 16 are left, then one by one.  The CSV reader's
// scans for a cell's end (a delimiter, a quote, a line end) are most of
// its time; a byte-by-byte loop costs about seven instructions a byte.
inline const char* FindFirstOf(const char* p, const char* end, char a, char b,
                               char c) {
#if defined(__SSE2__)
  const __m128i va = _mm_set1_epi8(a), vb = _mm_set1_epi8(b),
                vc = _mm_set1_epi8(c);
  for (; end - p >= 16; p += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i hit =
        _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, va), _mm_cmpeq_epi8(v, vb)),
                     _mm_cmpeq_epi8(v, vc));
    if (const int mask = _mm_movemask_epi8(hit); mask != 0) {
      return p + __builtin_ctz(static_cast<unsigned>(mask));
    }
  }
#endif
  while (p != end && *p != a && *p != b && *p != c) ++p;
  return p;
}

// A file's decoded bytes one at a time or a line at a time, through a
// buffer: for the text formats (CSV byte by byte, JSON Lines by line),
// plain or compressed.  Not thread-safe.
class ByteReader {
 public:
  // Opens `path` (throws IoError), decoding `compression`; std::nullopt:
  // the one its name's suffix says (CompressionFromSuffix: .gz, .zz or
  // .zlib, .zst or .zstd; otherwise none).
  explicit ByteReader(std::string path,
                      std::optional<Compression> compression = std::nullopt);
  ~ByteReader();
  ByteReader(const ByteReader&) = delete;
  ByteReader& operator=(const ByteReader&) = delete;

  // The next byte (0-255), or -1 at the end.  Throws IoError naming the
  // file where it cannot be read or decoded, after the bytes before the
  // damage.
  int Get() {
    if (pos_ == end_ && !Refill()) return -1;
    return static_cast<unsigned char>(buffer_[pos_++]);
  }
  // Puts back the byte the last Get() or AppendUntil() returned (not -1),
  // once.
  void Unget() { --pos_; }
  // AppendUntil's answer when *out reached its `max_size`.
  static constexpr int kFull = -2;
  // No limit on `max_size` (the default; a larger one is none either).
  static constexpr size_t kNoMaxSize = std::string::npos - 1;
  // Appends to *out the bytes before the next `a`, `b` or `c`, and returns
  // that byte, consumed (0-255), or -1 at the end: what Get() would give
  // byte by byte, found a buffer at a time.  Returns kFull instead,
  // appending no more, once *out holds more than `max_size` bytes (at
  // most max_size + 1 as it appends; the rest unread), so that a file
  // without the byte sought is not read whole into memory.  Throws as
  // Get() does, after appending the bytes before the damage.
  int AppendUntil(std::string* out, char a, char b, char c,
                  size_t max_size = kNoMaxSize);
  // The next line into *line, without its '\n' (a '\r' before it is
  // kept: the caller's to judge); the last line needs no '\n'.  False at
  // the end, with *line empty.  What Get() would return byte by byte,
  // found a buffer at a time (memchr).  A line longer than `max_size` is
  // read only to max_size + 1 bytes (true; the rest is the next line's
  // start): the caller's to refuse.  Throws as Get() does, after
  // appending the bytes before the damage.
  bool GetLine(std::string* line, size_t max_size = kNoMaxSize);
  // The bytes before the next '\n' when the buffer holds that '\n', not
  // consumed (refilling the buffer first if it is used up); std::nullopt
  // when it does not (the line goes on past the buffer, or the file ends
  // without one).  Valid until the next call of any other method.  Throws
  // as Get() does.
  std::optional<std::string_view> BufferedLine() {
    if (pos_ == end_ && !Refill()) return std::nullopt;
    const char* from = buffer_.get() + pos_;
    const auto* newline =
        static_cast<const char*>(std::memchr(from, '\n', end_ - pos_));
    if (newline == nullptr) return std::nullopt;
    return std::string_view(from, newline - from);
  }
  // Consumes `n` bytes that BufferedLine() viewed (its line and '\n' at
  // most).
  void Skip(size_t n) { pos_ += n; }
  // Bytes of the file consumed so far (of the compressed file, read ahead
  // by the decoder's chunk, when it is compressed): for progress.
  uint64_t file_position() const;
  const std::string& path() const { return file_.path(); }
  Compression compression() const { return compression_; }

 private:
  bool Refill();
  // AppendUntil's and GetLine's loop: appends to *out the bytes before
  // the stop `find(from, end)` gives in each buffer's unread bytes (`end`
  // when none) and returns the stop byte, consumed; -1 at the end; kFull
  // once *out would pass `max_size`, which it may not pass on the call
  // (max_size + 1 bytes in all, the rest unread).  The whole buffer is
  // searched and the limit checked once per buffer.
  template <typename Find>
  int AppendUntilStop(std::string* out, size_t max_size, Find find);

  ReadableFile file_;
  Compression compression_;
  std::unique_ptr<InputStream> stream_;
  std::unique_ptr<char[]> buffer_;
  size_t pos_ = 0, end_ = 0;
};

}  // namespace recflow::records

#endif  // RECFLOW_RECORDS_INPUT_STREAM_H_
