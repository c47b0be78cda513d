// Reads TFRecord files: uncompressed, ZLIB, GZIP or ZSTD streams, both CRCs
// verified unless told otherwise, damage reported with where and what.
//
//   TFRecordReader reader("train-00000-of-00008.tfrecord");
//   std::string_view record;
//   while (reader.ReadRecord(&record)) Use(record);
//
// A reader is not thread-safe; use one per thread.  It allocates nothing per
// record when reading an uncompressed file: records are views into its read
// buffer.  Nothing read from the file is allocated for before it has been
// checked against what the file can hold (a hostile length field cannot make
// it allocate more than the file's real size implies).
#ifndef RECFLOW_RECORDS_TFRECORD_READER_H_
#define RECFLOW_RECORDS_TFRECORD_READER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "records/compression.h"
#include "records/errors.h"
#include "records/file.h"
#include "records/input_stream.h"

namespace recflow::records {

// Told about every range of the stream a salvaging reader skipped.  The model
// is LevelDB's log::Reader::Reporter.
class Reporter {
 public:
  virtual ~Reporter() = default;
  // `bytes` bytes of the uncompressed stream, from `error.offset()`, were
  // dropped because of `error`.  For a decompression error the bytes that
  // could not be decoded are not known; `bytes` counts what was decoded.
  virtual void Skipped(const RecordError& error, uint64_t bytes) = 0;
};

// Protobuf messages, and so tf.Examples, cannot exceed 2 GiB; a longer
// length is taken as damage unless the maximum is raised.
inline constexpr uint64_t kDefaultMaxRecordBytes = uint64_t{2} << 30;

struct ReaderOptions {
  // std::nullopt: detect from the first bytes and the name
  // (DetectCompression).
  std::optional<Compression> compression = std::nullopt;
  // Check the length CRC and the data CRC of every record.
  bool verify_checksums = true;
  // On damage, report to `reporter` and go on instead of throwing: a record
  // with a bad data CRC is skipped; after a bad length the reader scans
  // forward for the next offset whose 12-byte header checks.  Implies
  // verify_checksums.
  bool salvage = false;
  Reporter* reporter = nullptr;  // not owned; may be null
  // Lengths above this are damage (kImplausibleLength).
  uint64_t max_record_bytes = kDefaultMaxRecordBytes;
  // Size of the read buffer (it grows for records that do not fit).  1 MiB
  // keeps what was just read in the CPU's L2 cache while its CRCs are
  // checked (docs/PERFORMANCE.md).
  size_t buffer_bytes = size_t{1} << 20;
  // Uncompressed files only: start reading at this byte offset, which must
  // be where a record starts (offsets and indexes then count from it).
  uint64_t start_offset = 0;
  // Keep the zstd frame list (see zstd_frames()), for building indexes.
  bool track_zstd_frames = false;
};

struct ReadStats {
  uint64_t records = 0;          // records returned
  uint64_t damaged_records = 0;  // whole records skipped (bad data CRC)
  uint64_t payload_bytes = 0;    // their payload bytes
  uint64_t stream_bytes = 0;     // uncompressed stream bytes consumed so far
  uint64_t skipped_ranges = 0;
  uint64_t skipped_bytes = 0;  // stream bytes dropped by salvage
};

class TFRecordReader {
 public:
  // Opens `path`.  Throws IoError when it cannot be opened or read.
  explicit TFRecordReader(std::string path, ReaderOptions options = {});
  ~TFRecordReader();
  TFRecordReader(const TFRecordReader&) = delete;
  TFRecordReader& operator=(const TFRecordReader&) = delete;

  // Reads the next record.  Returns true and points `*record` at its
  // payload, or false at the end of the stream.  The view is valid until the
  // next call to ReadRecord() or the reader's destruction.
  // Throws RecordError on damage (unless salvaging) and IoError when the
  // operating system fails a read.  After an exception the reader is
  // finished: further calls return false.
  bool ReadRecord(std::string_view* record);

  // The record ReadRecord() returned last: its byte offset in the
  // uncompressed stream and its index.  A record's index (here and in
  // errors) counts the records before it in the stream: those returned and
  // those skipped whole for a bad data CRC.  Records lost inside a range
  // skipped after a bad length cannot be counted, so after such damage
  // indexes are those of the readable records.
  uint64_t last_offset() const { return last_offset_; }
  uint64_t last_index() const { return last_index_; }

  const std::string& path() const { return file_.path(); }
  Compression compression() const { return compression_; }
  ReadStats stats() const {
    ReadStats s = stats_;
    s.stream_bytes = pos_offset_;
    return s;
  }
  uint64_t file_size() const { return file_.size(); }
  // Bytes read from the file so far (compressed bytes for a compressed
  // stream); at the end, the file's size, also for a pipe.
  uint64_t file_bytes_read() const { return stream_->file_position(); }
  // The zstd frames decoded so far, when tracking was asked for; else null.
  const std::vector<ZstdFrame>* zstd_frames() const {
    return stream_->frames();
  }

 private:
  size_t Available() const { return static_cast<size_t>(end_ - pos_); }
  bool ReadNext(std::string_view* record);
  // Checks both CRCs of the complete short records buffered from pos_ in
  // one interleaved pass (crc32c::ValueMany) and advances verified_end_
  // past those that pass.
  void VerifyAhead();
  uint64_t RecordsSeen() const {
    return stats_.records + stats_.damaged_records;
  }
  // Makes at least `n` bytes available from pos_ unless the stream ends
  // first; returns whether it did.  May move the buffer.
  bool Fill(size_t n) { return Available() >= n || Refill(n); }
  bool Refill(size_t n);
  void Consume(size_t n);
  // Throws the RecordError for damage at stream offset `offset`.
  [[noreturn]] void Fail(DamageKind kind, uint64_t offset, std::string detail);
  // Damage at `offset` covering `bytes` bytes: throws (Fail) unless
  // salvaging; then counts it and tells the reporter.
  void Report(DamageKind kind, uint64_t offset, std::string detail,
              uint64_t bytes);
  // For a bad header at pos_: throws unless salvaging; then advances to the
  // next offset whose 12-byte header checks, or to the end, and reports the
  // skipped range.
  void Resynchronize(DamageKind kind, std::string detail);
  // Damage from which nothing more can be read: reports the rest of the
  // stream from `offset` as skipped and finishes.
  void SkipRestOfStream(DamageKind kind, uint64_t offset, std::string detail);

  ReaderOptions options_;
  ReadableFile file_;
  Compression compression_;
  // An uncompressed regular file: record lengths can be checked against
  // the file's size before anything is read or allocated.
  bool size_known_ = false;
  std::unique_ptr<InputStream> stream_;
  std::unique_ptr<char[]> buffer_;
  size_t capacity_ = 0;
  char* pos_ = nullptr;      // next unread byte
  char* end_ = nullptr;      // end of buffered bytes
  uint64_t pos_offset_ = 0;  // stream offset of pos_
  // Records starting below this stream offset have had both CRCs checked.
  uint64_t verified_end_ = 0;
  bool stream_end_ = false;
  bool finished_ = false;
  uint64_t last_offset_ = 0;
  uint64_t last_index_ = 0;
  ReadStats stats_;
};

}  // namespace recflow::records

#endif  // RECFLOW_RECORDS_TFRECORD_READER_H_
