#include "records/index.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <zstd.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <fstream>
#include <stdexcept>

#include "records/errors.h"
#include "records/file_list.h"
#include "records/tfrecord_format.h"

namespace recflow::records {
namespace {

// Whether [offset, offset + size) lies within `n` bytes (no overflow: the
// numbers come from an index file).
bool FitsIn(uint64_t offset, uint64_t size, uint64_t n) {
  return size <= n && offset <= n - size;
}

// Parses the unsigned integers of one index line into `out`; returns how
// many it found, or -1 when the line holds anything else.
int ParseNumbers(std::string_view line, uint64_t* out, int max) {
  int count = 0;
  size_t i = 0;
  while (true) {
    while (i < line.size() &&
           (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) {
      ++i;
    }
    if (i == line.size()) return count;
    if (count == max) return -1;
    const char* begin = line.data() + i;
    const auto [end, ec] =
        std::from_chars(begin, line.data() + line.size(), out[count]);
    if (ec != std::errc() || end == begin) return -1;
    i += static_cast<size_t>(end - begin);
    if (i < line.size() && line[i] != ' ' && line[i] != '\t' &&
        line[i] != '\r') {
      return -1;
    }
    ++count;
  }
}

}  // namespace

std::string IndexPathFor(std::string_view record_path) {
  return std::string(record_path) + ".idx";
}

Index BuildIndex(const std::string& record_path) {
  RequireRegularFiles({record_path},
                      "an index lists offsets to read a file at");
  ReaderOptions options;
  options.track_zstd_frames = true;
  TFRecordReader reader(record_path, options);
  Index index;
  index.compression = reader.compression();
  if (index.compression == Compression::kZlib ||
      index.compression == Compression::kGzip) {
    throw Error(fmt::format(
        "{}: a {} stream cannot be indexed: a reader cannot start in the "
        "middle of it (rewrite it with `recflow reshard --compression none` "
        "or `zstd`)",
        record_path, CompressionName(index.compression)));
  }
  std::string_view record;
  while (reader.ReadRecord(&record)) {
    index.entries.push_back(
        {reader.last_offset(), record.size() + kFrameOverhead, 0, 0});
  }
  if (index.compression == Compression::kNone) return index;

  // Map each record to the zstd frame that holds it.
  const std::vector<ZstdFrame>& frames = *reader.zstd_frames();
  size_t f = 0;
  for (size_t i = 0; i < index.entries.size(); ++i) {
    IndexEntry& e = index.entries[i];
    if (LocateInFrame(frames, &f, e.offset, e.size, &e) != FrameFit::kInFrame) {
      throw Error(fmt::format(
          "{}: record {} at byte offset {} spans zstd frames, so it cannot be "
          "reached through an index; rewrite the file with `recflow reshard "
          "--compression zstd`, which keeps records within frames",
          record_path, i, e.offset));
    }
  }
  return index;
}

FrameFit LocateInFrame(const std::vector<ZstdFrame>& frames, size_t* next,
                       uint64_t offset, uint64_t size, IndexEntry* entry) {
  size_t& f = *next;
  while (f < frames.size() &&
         frames[f].stream_offset + frames[f].stream_bytes <= offset) {
    ++f;
  }
  if (f == frames.size()) return FrameFit::kNoFrame;
  const ZstdFrame& frame = frames[f];
  if (offset + size > frame.stream_offset + frame.stream_bytes) {
    return FrameFit::kSpans;
  }
  *entry = {offset - frame.stream_offset, size, frame.file_offset,
            frame.file_bytes};
  return FrameFit::kInFrame;
}

void WriteIndex(const std::string& index_path, const Index& index) {
  if (index.compression != Compression::kNone &&
      index.compression != Compression::kZstd) {
    throw Error(
        fmt::format("{}: only uncompressed and zstd files have an "
                    "index",
                    index_path));
  }
  WritableFile file(index_path, /*atomic=*/true);
  std::string text;
  text.reserve(index.entries.size() * 24 + 64);
  if (index.compression == Compression::kZstd) {
    text.append(kZstdIndexHeader);
    text.push_back('\n');
  }
  for (const IndexEntry& e : index.entries) {
    if (index.compression == Compression::kZstd) {
      fmt::format_to(std::back_inserter(text), "{} {} {} {}\n", e.frame_offset,
                     e.frame_bytes, e.offset, e.size);
    } else {
      fmt::format_to(std::back_inserter(text), "{} {}\n", e.offset, e.size);
    }
    if (text.size() >= (1 << 20)) {
      file.Append(text);
      text.clear();
    }
  }
  file.Append(text);
  file.Close();
}

Index ReadIndex(const std::string& index_path, uint64_t file_size) {
  ReadableFile file(index_path);
  std::string text;
  char chunk[1 << 16];
  while (size_t got = file.Read(chunk, sizeof chunk)) text.append(chunk, got);

  Index index;
  size_t line_start = 0;
  uint64_t line_number = 0;
  uint64_t previous_end = 0;  // for zstd: within the current frame
  uint64_t previous_frame_end = 0;
  uint64_t current_frame = UINT64_MAX;
  auto fail = [&](const std::string& what) {
    return Error(fmt::format("{}:{}: {}", index_path, line_number, what));
  };
  while (line_start < text.size()) {
    size_t line_end = text.find('\n', line_start);
    if (line_end == std::string::npos) line_end = text.size();
    const std::string_view line(text.data() + line_start,
                                line_end - line_start);
    line_start = line_end + 1;
    ++line_number;
    if (line_number == 1 && line.starts_with(kZstdIndexHeader)) {
      index.compression = Compression::kZstd;
      continue;
    }
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    uint64_t v[4];
    const bool zstd = index.compression == Compression::kZstd;
    const int n = ParseNumbers(line, v, zstd ? 4 : 2);
    if (n != (zstd ? 4 : 2)) {
      throw fail(zstd ? "expected 'frame_offset frame_bytes offset_in_frame "
                        "size' (four unsigned integers)"
                      : "expected 'offset size' (two unsigned integers)");
    }
    IndexEntry e;
    if (zstd) {
      e = {v[2], v[3], v[0], v[1]};
    } else {
      e = {v[0], v[1], 0, 0};
    }
    if (e.size > UINT64_MAX - e.offset ||
        e.frame_bytes > UINT64_MAX - e.frame_offset) {
      throw fail("offset plus size overflows 64 bits");
    }
    if (e.size < kFrameOverhead) {
      throw fail(
          fmt::format("record size {} is below the 16 bytes of "
                      "framing every record has",
                      e.size));
    }
    if (zstd) {
      if (e.frame_offset != current_frame) {
        if (e.frame_offset < previous_frame_end) {
          throw fail(
              fmt::format("frame at {} overlaps the previous frame, "
                          "which ends at {}",
                          e.frame_offset, previous_frame_end));
        }
        current_frame = e.frame_offset;
        previous_frame_end = e.frame_offset + e.frame_bytes;
        previous_end = 0;
      }
      if (e.offset < previous_end) {
        throw fail(
            fmt::format("record at {} in its frame overlaps the "
                        "previous record, which ends at {}",
                        e.offset, previous_end));
      }
      previous_end = e.offset + e.size;
      if (file_size != 0 && previous_frame_end > file_size) {
        throw fail(
            fmt::format("frame [{}, {}) lies past the end of the "
                        "{}-byte file",
                        e.frame_offset, previous_frame_end, file_size));
      }
    } else {
      if (e.offset < previous_end) {
        throw fail(
            fmt::format("record at {} overlaps the previous record, "
                        "which ends at {}",
                        e.offset, previous_end));
      }
      previous_end = e.offset + e.size;
      if (file_size != 0 && previous_end > file_size) {
        throw fail(
            fmt::format("record [{}, {}) lies past the end of the "
                        "{}-byte file",
                        e.offset, previous_end, file_size));
      }
    }
    index.entries.push_back(e);
  }
  return index;
}

void CheckIndexCoversFile(const Index& index, const std::string& index_path,
                          const std::string& record_path, uint64_t file_size) {
  uint64_t end = 0;
  if (!index.entries.empty()) {
    const IndexEntry& last = index.entries.back();
    end = index.compression == Compression::kZstd
              ? last.frame_offset + last.frame_bytes
              : last.offset + last.size;
  }
  if (end != file_size) {
    throw Error(fmt::format(
        "{}: its {} records end at byte {}, but {} has {} bytes: the file "
        "changed after it was indexed (`recflow index {}` indexes it again)",
        index_path, index.entries.size(), end, record_path, file_size,
        record_path));
  }
}

Index LoadOrBuildIndex(
    const std::string& record_path, uint64_t file_size,
    const std::function<void(const std::string& index_path)>& before_building) {
  const std::string idx = IndexPathFor(record_path);
  struct stat st;
  if (::stat(idx.c_str(), &st) != 0) {
    if (before_building) before_building(idx);
    return BuildIndex(record_path);
  }
  Index index = ReadIndex(idx, file_size);
  CheckIndexCoversFile(index, idx, record_path, file_size);
  return index;
}

IndexedReader::IndexedReader(const std::string& record_path, Index index)
    : IndexedReader(record_path,
                    std::make_shared<const Index>(std::move(index))) {}

IndexedReader::IndexedReader(const std::string& record_path,
                             std::shared_ptr<const Index> index)
    : file_(record_path), index_(std::move(index)) {
  if (index_->compression == Compression::kZstd) {
    dctx_ = ZSTD_createDCtx();
    if (dctx_ == nullptr) throw IoError(record_path, "cannot create zstd");
  }
}

IndexedReader::~IndexedReader() {
  if (dctx_ != nullptr) ZSTD_freeDCtx(static_cast<ZSTD_DCtx*>(dctx_));
}

namespace {

// The frame of record i, at `offset` and `size` bytes long as its index
// says, checked as every reader checks one.
std::string_view CheckFrameAt(const std::string& path, uint64_t i,
                              uint64_t offset, const char* frame,
                              uint64_t size) {
  const uint64_t length = HeaderLength(frame);
  const FrameFault fault =
      CheckFrameHeader(frame, /*verify_crc=*/true, UINT64_MAX, size);
  if (fault == FrameFault::kLengthCrc) {
    throw RecordError(path, offset, i, FrameFaultKind(fault, true),
                      FrameFaultDetail(fault, true, frame, UINT64_MAX, size) +
                          " (is the index stale?)");
  }
  if (length + kFrameOverhead != size) {
    throw RecordError(path, offset, i, DamageKind::kImplausibleLength,
                      fmt::format("the index gives {} bytes but the record "
                                  "header says {} + 16 (is the index stale?)",
                                  size, length));
  }
  const char* data = frame + kHeaderBytes;
  if (!DataChecks(data, length)) {
    throw RecordError(path, offset, i, DamageKind::kDataCrcMismatch,
                      DataCrcDetail(data, length));
  }
  return {data, length};
}

}  // namespace

void CheckIndexedFrameFits(const ReadableFile& file, uint64_t i,
                           const IndexEntry& e) {
  if (!FitsIn(e.offset, e.size, file.size())) {
    throw RecordError(file.path(), e.offset, i, DamageKind::kTruncatedData,
                      fmt::format("the index gives {} bytes at byte {}, past "
                                  "the end of the {}-byte file",
                                  e.size, e.offset, file.size()));
  }
}

std::string_view CheckIndexedFrame(const std::string& path, uint64_t i,
                                   const IndexEntry& e, const char* frame,
                                   uint64_t bytes_read) {
  if (bytes_read != e.size) {
    throw RecordError(path, e.offset, i, DamageKind::kTruncatedData,
                      "the file is shorter than when it was opened");
  }
  return CheckFrameAt(path, i, e.offset, frame, e.size);
}

std::string_view IndexedReader::CheckFrame(uint64_t i, uint64_t offset,
                                           const char* frame,
                                           uint64_t size) const {
  return CheckFrameAt(file_.path(), i, offset, frame, size);
}

const char* IndexedReader::ZstdFrame(const IndexEntry& e, uint64_t i) {
  if (e.frame_offset == cached_frame_offset_ &&
      (frame_complete_ || FitsIn(e.offset, e.size, frame_.size()))) {
    return frame_.data();
  }
  cached_frame_offset_ = UINT64_MAX;
  // The index is not trusted for an allocation: the frame must lie in the
  // file before its bytes are read, and decoding stops once it has given
  // the bytes the index's records in this frame need (a frame that decodes
  // to far more -- a bomb -- never gets further than that).
  if (!FitsIn(e.frame_offset, e.frame_bytes, file_.size())) {
    throw RecordError(file_.path(), e.frame_offset, i,
                      DamageKind::kTruncatedData,
                      fmt::format("the index gives a zstd frame of {} bytes "
                                  "at byte {}, past the end of the {}-byte "
                                  "file",
                                  e.frame_bytes, e.frame_offset, file_.size()));
  }
  // Saturating: an index built by hand may hold sums past 64 bits.
  const auto end = [](const IndexEntry& r) {
    return r.size > UINT64_MAX - r.offset ? UINT64_MAX : r.offset + r.size;
  };
  uint64_t needed = end(e);
  for (uint64_t j = i + 1; j < index_->entries.size() &&
                           index_->entries[j].frame_offset == e.frame_offset;
       ++j) {
    needed = std::max(needed, end(index_->entries[j]));
  }
  buffer_.resize(e.frame_bytes);
  if (file_.ReadAt(e.frame_offset, buffer_.data(), e.frame_bytes) !=
      e.frame_bytes) {
    throw RecordError(file_.path(), e.frame_offset, i,
                      DamageKind::kTruncatedData,
                      fmt::format("the zstd frame of {} bytes the index "
                                  "points at runs past the end of the file",
                                  e.frame_bytes));
  }
  // Decode with a buffer that grows only as decoded bytes arrive: the
  // content size in the frame header is not trusted for an allocation.
  const unsigned long long content =
      ZSTD_getFrameContentSize(buffer_.data(), buffer_.size());
  if (content == ZSTD_CONTENTSIZE_ERROR) {
    throw RecordError(file_.path(), e.frame_offset, i,
                      DamageKind::kDecompressionError,
                      "the index points at bytes that are not a zstd frame "
                      "(is the index stale?)");
  }
  auto* dctx = static_cast<ZSTD_DCtx*>(dctx_);
  ZSTD_DCtx_reset(dctx, ZSTD_reset_session_only);
  frame_.resize(content == ZSTD_CONTENTSIZE_UNKNOWN
                    ? size_t{1} << 20
                    : std::min<unsigned long long>(content, size_t{4} << 20));
  ZSTD_inBuffer in{buffer_.data(), buffer_.size(), 0};
  size_t decoded = 0;
  frame_complete_ = false;
  while (decoded < needed) {
    if (decoded == frame_.size()) frame_.resize(frame_.size() * 2);
    ZSTD_outBuffer out{frame_.data() + decoded, frame_.size() - decoded, 0};
    const size_t rc = ZSTD_decompressStream(dctx, &out, &in);
    decoded += out.pos;
    if (ZSTD_isError(rc)) {
      throw RecordError(file_.path(), e.frame_offset, i,
                        DamageKind::kDecompressionError,
                        fmt::format("zstd frame at file byte {}: {}",
                                    e.frame_offset, ZSTD_getErrorName(rc)));
    }
    if (rc == 0) {
      frame_complete_ = true;
      break;
    }
    if (in.pos == in.size && out.pos < out.size) {
      throw RecordError(file_.path(), e.frame_offset, i,
                        DamageKind::kDecompressionError,
                        fmt::format("the zstd frame at file byte {} does not "
                                    "end within the {} bytes the index gives",
                                    e.frame_offset, e.frame_bytes));
    }
  }
  frame_.resize(decoded);
  cached_frame_offset_ = e.frame_offset;
  return frame_.data();
}

std::string_view IndexedReader::Read(uint64_t i) {
  if (i >= index_->entries.size()) {
    throw std::out_of_range(
        fmt::format("{}: record {} requested, the index "
                    "has {}",
                    file_.path(), i, index_->entries.size()));
  }
  const IndexEntry& e = index_->entries[i];
  if (index_->compression == Compression::kZstd) {
    const char* frame = ZstdFrame(e, i);
    if (!FitsIn(e.offset, e.size, frame_.size())) {
      throw RecordError(
          file_.path(), e.frame_offset, i, DamageKind::kImplausibleLength,
          fmt::format("the index puts the record at [{}, {}) of "
                      "a frame that decodes to {} bytes",
                      e.offset, e.offset + e.size, frame_.size()));
    }
    return CheckFrame(i, e.offset, frame + e.offset, e.size);
  }
  CheckIndexedFrameFits(file_, i, e);
  buffer_.resize(e.size);
  const size_t got = file_.ReadAt(e.offset, buffer_.data(), e.size);
  return CheckIndexedFrame(file_.path(), i, e, buffer_.data(), got);
}

std::string_view ReadRecordAt(const ReadableFile& file, uint64_t offset,
                              uint64_t record_index,
                              AlignedVector<char>* buffer) {
  const uint64_t left = file.size() > offset ? file.size() - offset : 0;
  char header[kHeaderBytes];
  if (left < kHeaderBytes ||
      file.ReadAt(offset, header, sizeof header) != sizeof header) {
    throw RecordError(file.path(), offset, record_index,
                      DamageKind::kTruncatedHeader,
                      fmt::format("the file ends {} bytes after the record's "
                                  "start, inside its 12-byte header",
                                  left));
  }
  const FrameFault fault =
      CheckFrameHeader(header, /*verify_crc=*/true, UINT64_MAX, left);
  if (fault != FrameFault::kNone) {
    throw RecordError(file.path(), offset, record_index,
                      FrameFaultKind(fault, true),
                      FrameFaultDetail(fault, true, header, UINT64_MAX, left));
  }
  const uint64_t length = HeaderLength(header);
  buffer->resize(length + kFooterBytes);
  if (file.ReadAt(offset + kHeaderBytes, buffer->data(), buffer->size()) !=
      buffer->size()) {
    throw RecordError(file.path(), offset, record_index,
                      DamageKind::kTruncatedData,
                      "the file is shorter than when it was opened");
  }
  if (!DataChecks(buffer->data(), length)) {
    throw RecordError(file.path(), offset, record_index,
                      DamageKind::kDataCrcMismatch,
                      DataCrcDetail(buffer->data(), length));
  }
  return {buffer->data(), length};
}

IndexCheck::IndexCheck(const std::string& record_path)
    : path_(IndexPathFor(record_path)) {
  struct stat st;
  if (::stat(path_.c_str(), &st) != 0) return;  // none: nothing to check
  present_ = true;
  try {
    index_ = ReadIndex(path_);
  } catch (const Error& e) {
    problem_ = e.what();
  }
}

void IndexCheck::Record(uint64_t i, uint64_t offset, uint64_t frame,
                        Compression compression,
                        const std::vector<ZstdFrame>* zstd_frames) {
  // An index of another kind of file is Finish's to report.
  if (!index_ || !problem_.empty() || index_->compression != compression) {
    return;
  }
  if (index_->compression == Compression::kZstd) {
    pending_.push_back({i, offset, frame});
    if (zstd_frames != nullptr) MatchFrames(*zstd_frames);
    return;
  }
  if (i >= index_->entries.size()) return;  // counted at the end
  const IndexEntry& e = index_->entries[i];
  if (e.offset != offset || e.size != frame) {
    problem_ = fmt::format(
        "{}: stale index: record {} is {} bytes at byte {} of the file, "
        "the index says {} bytes at byte {}",
        path_, i, frame, offset, e.size, e.offset);
  }
}

std::string IndexCheck::Finish(Compression compression, uint64_t records,
                               const std::vector<ZstdFrame>* zstd_frames) {
  if (!present_ || !problem_.empty()) return problem_;
  const bool zstd = compression == Compression::kZstd;
  if (compression != Compression::kNone && !zstd) {
    return fmt::format(
        "{}: an index beside a {} file, which cannot have "
        "one",
        path_, CompressionName(compression));
  }
  if (index_->compression != compression) {
    return fmt::format("{}: an index of a {} file beside a {} one", path_,
                       CompressionName(index_->compression),
                       CompressionName(compression));
  }
  if (index_->entries.size() != records) {
    return fmt::format("{}: stale index: {} records, the file has {}", path_,
                       index_->entries.size(), records);
  }
  if (zstd && zstd_frames != nullptr) MatchFrames(*zstd_frames);
  if (problem_.empty() && !pending_.empty()) {
    problem_ = fmt::format(
        "{}: stale index: record {} lies in no whole zstd frame of the "
        "file",
        path_, pending_.front().record);
  }
  return problem_;
}

void IndexCheck::MatchFrames(const std::vector<ZstdFrame>& frames) {
  while (!pending_.empty() && problem_.empty()) {
    const Pending& r = pending_.front();
    const uint64_t i = r.record;
    IndexEntry want;
    const FrameFit fit =
        LocateInFrame(frames, &frame_, r.offset, r.size, &want);
    if (fit == FrameFit::kNoFrame) return;  // not whole yet
    if (fit == FrameFit::kSpans) {
      problem_ = fmt::format(
          "{}: record {} spans two zstd frames, so no index can reach it "
          "(`recflow reshard --compression zstd` rewrites the file with "
          "whole records in each frame)",
          path_, i);
      return;
    }
    if (i < index_->entries.size() && !(index_->entries[i] == want)) {
      const IndexEntry& e = index_->entries[i];
      problem_ = fmt::format(
          "{}: stale index: record {} is {} bytes at byte {} of the zstd "
          "frame at file byte {} ({} bytes); the index says {} bytes at "
          "byte {} of the frame at {} ({} bytes)",
          path_, i, want.size, want.offset, want.frame_offset, want.frame_bytes,
          e.size, e.offset, e.frame_offset, e.frame_bytes);
    }
    pending_.pop_front();
  }
}

VerifiedFile VerifyFile(const std::string& path, ReaderOptions options) {
  IndexCheck index(path);
  options.track_zstd_frames = index.present();
  TFRecordReader reader(path, options);
  std::string_view record;
  uint64_t i = 0;
  for (; reader.ReadRecord(&record); ++i) {
    index.Record(i, reader.last_offset(), record.size() + kFrameOverhead,
                 reader.compression(), reader.zstd_frames());
  }
  VerifiedFile out;
  out.records = i;
  out.index_present = index.present();
  out.index_problem =
      index.Finish(reader.compression(), i, reader.zstd_frames());
  return out;
}

}  // namespace recflow::records
