// The uncompressed byte stream of a record file: the file itself, or its
// content decoded through zlib, gzip or zstd.  Used by TFRecordReader; not
// thread-safe.
#ifndef RECFLOW_RECORDS_INPUT_STREAM_H_
#define RECFLOW_RECORDS_INPUT_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

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

}  // namespace recflow::records

#endif  // RECFLOW_RECORDS_INPUT_STREAM_H_
