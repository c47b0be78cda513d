// Writes TFRecord files that TensorFlow reads (uncompressed, ZLIB, GZIP) and
// ZSTD files of independent frames (recflow's own; TensorFlow cannot read
// them, the `zstd` command can decompress them).
//
//   TFRecordWriter writer("out.tfrecord.gz", {.compression =
//   Compression::kGzip}); for (...) writer.Write(serialized_example);
//   writer.Close();  // the file appears under its name only now
//
// Buffered; not thread-safe.  By default the writer is atomic: bytes go to a
// hidden temporary file in the same directory and Close() fsyncs and renames
// it into place.  A writer destroyed without Close() (an exception, a
// crash's unwinding) leaves nothing under the final name.
#ifndef RECFLOW_RECORDS_TFRECORD_WRITER_H_
#define RECFLOW_RECORDS_TFRECORD_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "records/compression.h"
#include "records/index.h"

namespace recflow::records {

// Throws Error ("compression level L: zlib takes 1 to 9 ...") unless
// `level` is 0 or a level of `compression` (WriterOptions::level).
void CheckCompressionLevel(Compression compression, int level);

struct WriterOptions {
  Compression compression = Compression::kNone;
  // Codec level; 0 means the codec's default (zlib 6 as TensorFlow's
  // Z_DEFAULT_COMPRESSION, zstd 3).  ZLIB/GZIP take 1-9, ZSTD 1-22 (and
  // zstd's negative fast levels); another level, or one for an
  // uncompressed file, is an Error from the constructor
  // (CheckCompressionLevel), before any file is made.
  int level = 0;
  bool atomic = true;
  // ZSTD: a frame is closed once it holds at least this many bytes of
  // framed records; a record never spans two frames.
  size_t zstd_frame_bytes = size_t{1} << 20;
  // Collect the index of what is written (uncompressed and ZSTD only).
  bool build_index = false;
  // ZSTD: how many frames are compressed at once, on worker threads the
  // writer owns (1: on the calling thread).  The file's bytes do not
  // depend on it.  ZLIB/GZIP are one deflate stream and always use the
  // calling thread.
  int compression_threads = 1;
};

class TFRecordWriter {
 public:
  // Throws IoError when the file cannot be created, Error when build_index
  // is asked for ZLIB or GZIP.
  explicit TFRecordWriter(std::string path, WriterOptions options = {});
  ~TFRecordWriter();
  TFRecordWriter(const TFRecordWriter&) = delete;
  TFRecordWriter& operator=(const TFRecordWriter&) = delete;

  // Appends one record.  Throws IoError.
  void Write(std::string_view record);
  // Hands everything written so far to the operating system: ZLIB/GZIP
  // with a sync flush, ZSTD by closing the current frame.
  void Flush();
  // Ends the stream and makes the file durable and visible.  Throws
  // IoError; on failure nothing is left under the final name (atomic mode).
  void Close();
  // The two halves of Close(), for files that must appear together (the
  // shards of a dataset): Finish() ends the stream and makes it durable
  // under the temporary name; Commit() renames it into place.  A writer
  // finished but not committed leaves nothing behind when destroyed.
  // Commit() (and so Close()) removes an index of the file's name
  // (IndexPathFor(path()), FILE.idx) left by an earlier file: it does not
  // describe this one.  Write this file's index after Commit().
  void Finish();
  void Commit();

  const std::string& path() const { return path_; }
  uint64_t records_written() const { return records_; }
  // Uncompressed stream bytes (records with framing).
  uint64_t stream_bytes() const { return stream_bytes_; }
  // Bytes in the file so far (compressed size for compressed streams).
  uint64_t file_bytes() const;
  // The index of the records written (when build_index was set).  For ZSTD
  // complete only after Flush() or Close().
  const Index& index() const { return index_; }

  class Codec;  // the sink of framed bytes for one compression

 private:
  std::string path_;
  WriterOptions options_;
  std::unique_ptr<Codec> codec_;
  Index index_;
  uint64_t records_ = 0;
  uint64_t stream_bytes_ = 0;
  bool finished_ = false;
  bool committed_ = false;
};

}  // namespace recflow::records

#endif  // RECFLOW_RECORDS_TFRECORD_WRITER_H_
