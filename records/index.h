// Record indexes: where each record of a file lies, for random access.
//
// Uncompressed files use the text format of NVIDIA DALI's tfrecord2idx and
// the Python `tfrecord` package, so their users can use ours and we theirs:
// one line per record, "offset size", where offset is the byte offset of the
// record's frame in the file and size = 16 + payload length.
//
// ZSTD files written by recflow consist of independent frames that each hold
// whole records; their index (docs/FORMATS.md) starts with the line
// "#recflow-zstd-index v1", then one line per record:
// "frame_offset frame_bytes offset_in_frame size", where the frame's bytes
// are [frame_offset, frame_offset + frame_bytes) of the file and the record
// is [offset_in_frame, offset_in_frame + size) of its decoded content.
// ZLIB and GZIP streams cannot be entered in the middle and have no index.
#ifndef RECFLOW_RECORDS_INDEX_H_
#define RECFLOW_RECORDS_INDEX_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "records/aligned_buffer.h"
#include "records/compression.h"
#include "records/file.h"
#include "records/tfrecord_reader.h"

namespace recflow::records {

struct IndexEntry {
  // Uncompressed: offset of the frame in the file.  ZSTD: offset of the
  // frame in the decoded content of its zstd frame.
  uint64_t offset = 0;
  uint64_t size = 0;  // 16 + payload length
  // ZSTD only: the zstd frame holding the record.
  uint64_t frame_offset = 0;
  uint64_t frame_bytes = 0;

  bool operator==(const IndexEntry&) const = default;
};

struct Index {
  Compression compression = Compression::kNone;  // kNone or kZstd
  std::vector<IndexEntry> entries;
};

inline constexpr std::string_view kZstdIndexHeader = "#recflow-zstd-index v1";

// Reads every record of `record_path` (verifying both CRCs) and returns its
// index.  Throws RecordError on damage, IoError for I/O errors and for a
// path that is not a regular file (a pipe cannot be read at offsets), and
// Error for ZLIB/GZIP files and for ZSTD files whose records span frames.
Index BuildIndex(const std::string& record_path);

// A ZSTD record's entry: the record at `offset` of the decoded stream,
// `size` bytes with its framing, located in the frame of `frames` (in
// stream order) that holds it.  `*next` is where the search starts and is
// left at that frame, so records located in order walk the frames once.
// kNoFrame: no frame of `frames` reaches the record (yet, while a reader
// is still decoding); kSpans: the record runs past its frame's end, where
// no index can reach it.  *entry is set for kInFrame only.
enum class FrameFit { kInFrame, kNoFrame, kSpans };
FrameFit LocateInFrame(const std::vector<ZstdFrame>& frames, size_t* next,
                       uint64_t offset, uint64_t size, IndexEntry* entry);

// Writes `index` to `index_path` atomically.
void WriteIndex(const std::string& index_path, const Index& index);

// Reads and validates an index: well-formed lines, sizes of at least 16,
// records in increasing, non-overlapping order, and, where `file_size` is
// given (not 0), within the file.  Errors (Error) name the index file and
// line.
Index ReadIndex(const std::string& index_path, uint64_t file_size = 0);

// Throws Error (naming both files) unless `index` reaches the end of the
// `file_size`-byte file it indexes: its last record (zstd: frame) ends
// there.  A file that grew after it was indexed would otherwise have its
// newer records left out by whatever reads through the index.
void CheckIndexCoversFile(const Index& index, const std::string& index_path,
                          const std::string& record_path, uint64_t file_size);

// The index of every record of `record_path` for a reader that must reach
// all of them (the global shuffle, TFRecordDataSource): FILE.idx when it
// exists (ReadIndex, then CheckIndexCoversFile: an index of a file that
// grew since would leave its newer records out), else one built by reading
// the file (BuildIndex), after calling `before_building` (when set) with
// the missing index's path, so that a caller can say why it waits.
// `file_size` is the file's size now.  Throws as those do.
Index LoadOrBuildIndex(
    const std::string& record_path, uint64_t file_size,
    const std::function<void(const std::string& index_path)>& before_building);

// FILE.idx beside a record file, checked against the records as a reader
// reads them (once): the index DALI, the range reader and the global
// shuffle would trust.  Used by `recflow verify` and Python's verify.
// Not thread-safe.
class IndexCheck {
 public:
  // Reads the index beside `record_path`, if there is one; an unreadable
  // one is the problem Finish() returns.
  explicit IndexCheck(const std::string& record_path);
  bool present() const { return present_; }
  // Record i, read at `offset` of the (decoded) stream, `frame` bytes long
  // with its framing.  `zstd_frames`: the ZSTD frames the reader has
  // decoded whole so far (ReaderOptions::track_zstd_frames), or null.  A
  // ZSTD record waits until its frame is whole; an uncompressed one is
  // compared at once.  Either way the file is read once.
  void Record(uint64_t i, uint64_t offset, uint64_t frame,
              Compression compression,
              const std::vector<ZstdFrame>* zstd_frames);
  // After every record was read: the count, and a zstd index against the
  // file's frames.  Returns the problem, "" when the index is the file's
  // (or there is none).
  std::string Finish(Compression compression, uint64_t records,
                     const std::vector<ZstdFrame>* zstd_frames);

 private:
  // A ZSTD record read but not yet compared: its number, stream offset and
  // size with its framing.
  struct Pending {
    uint64_t record, offset, size;
  };
  // Compares the pending ZSTD records whose frames are whole with their
  // entries.
  void MatchFrames(const std::vector<ZstdFrame>& frames);

  std::string path_;
  bool present_ = false;
  std::optional<Index> index_;
  std::deque<Pending> pending_;
  size_t frame_ = 0;  // the frame being matched
  std::string problem_;
};

struct VerifiedFile {
  uint64_t records = 0;
  bool index_present = false;
  std::string index_problem;  // "" when the index is the file's, or none
};

// Reads every record of `path` checking both CRCs and, in the same read,
// the index beside it (IndexCheck).  Throws RecordError for the first
// damage (the index is then not checked: the records are not where an
// index of the file could put them) and IoError.
VerifiedFile VerifyFile(const std::string& path, ReaderOptions options);

// The conventional index name: path + ".idx".
std::string IndexPathFor(std::string_view record_path);

// Random access to the records of a file through its index: record i costs
// one pread (uncompressed) or one pread and one frame decode (ZSTD; the last
// frame decoded is kept).  Both CRCs are checked.  Not thread-safe (use one
// per thread; the file is opened per instance).
class IndexedReader {
 public:
  IndexedReader(const std::string& record_path, Index index);
  // Shares `index` (not null) with its other users, where readers are made
  // per thread or per epoch over one index, instead of copying it.
  IndexedReader(const std::string& record_path,
                std::shared_ptr<const Index> index);
  ~IndexedReader();
  IndexedReader(const IndexedReader&) = delete;
  IndexedReader& operator=(const IndexedReader&) = delete;

  uint64_t size() const { return index_->entries.size(); }
  // The payload of record `i`, valid until the next Read() or destruction;
  // the frame's 4-byte data CRC follows it (StoredDataCrc).
  // Throws RecordError (naming the file, the record's offset and index)
  // when the bytes there are not that record, std::out_of_range for i >=
  // size().
  std::string_view Read(uint64_t i);

 private:
  std::string_view CheckFrame(uint64_t i, uint64_t offset, const char* frame,
                              uint64_t size) const;
  const char* ZstdFrame(const IndexEntry& e, uint64_t i);

  ReadableFile file_;
  std::shared_ptr<const Index> index_;
  std::vector<char> buffer_;
  std::vector<char> frame_;  // ZSTD: decoded content of the cached frame
  uint64_t cached_frame_offset_ = UINT64_MAX;
  bool frame_complete_ = false;  // frame_ holds the whole decoded frame
  void* dctx_ = nullptr;
};

// The two halves of IndexedReader::Read on an uncompressed file, for
// readers that do their own reads (the pipeline's batches of them): that
// the frame `entry` names lies in `file` (before a buffer is sized for it),
// and that the `bytes_read` bytes read from there into `frame` are record
// i's good frame (its length as the index says, both CRCs); returns the
// payload inside `frame`.  Both throw RecordError naming the file, offset
// and record.  Thread-safe.
void CheckIndexedFrameFits(const ReadableFile& file, uint64_t i,
                           const IndexEntry& entry);
std::string_view CheckIndexedFrame(const std::string& path, uint64_t i,
                                   const IndexEntry& entry, const char* frame,
                                   uint64_t bytes_read);

// One record named by a saved reference -- the offset of its frame in the
// uncompressed file `file` and its index there, as shuffle buffers save
// their records -- instead of an index entry: two preads (header, then
// payload and CRC) into `*buffer`, the frame checked as every reader checks
// one (records/tfrecord_format.h).  Returns the payload, which `*buffer`
// holds (with the 4-byte CRC after it).  Throws RecordError naming the file,
// offset and record when no good frame starts there.
std::string_view ReadRecordAt(const ReadableFile& file, uint64_t offset,
                              uint64_t record_index,
                              AlignedVector<char>* buffer);

}  // namespace recflow::records

#endif  // RECFLOW_RECORDS_INDEX_H_
