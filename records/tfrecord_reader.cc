#include "records/tfrecord_reader.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "records/crc32c.h"
#include "records/tfrecord_format.h"

namespace recflow::records {

TFRecordReader::TFRecordReader(std::string path, ReaderOptions options)
    : options_(options), file_(std::move(path)) {
  if (options_.salvage) options_.verify_checksums = true;
  if (options_.compression.has_value()) {
    compression_ = *options_.compression;
  } else {
    compression_ = DetectCompression(file_);
  }
  size_known_ = compression_ == Compression::kNone && file_.is_regular();
  if (options_.start_offset != 0) {
    if (compression_ != Compression::kNone) {
      throw Error(fmt::format(
          "{}: a {} stream cannot be read from byte {}; "
          "only uncompressed files can",
          file_.path(), CompressionName(compression_), options_.start_offset));
    }
    file_.Seek(options_.start_offset);
    pos_offset_ = verified_end_ = options_.start_offset;
  }
  stream_ = OpenInputStream(&file_, compression_, options_.track_zstd_frames);
  capacity_ = std::max<size_t>(options_.buffer_bytes, 64);
  buffer_.reset(new char[capacity_]);
  pos_ = end_ = buffer_.get();
}

TFRecordReader::~TFRecordReader() = default;

void TFRecordReader::Consume(size_t n) {
  pos_ += n;
  pos_offset_ += n;
}

bool TFRecordReader::Refill(size_t n) {
  if (stream_end_) return false;
  size_t available = Available();
  if (pos_ != buffer_.get()) {
    std::memmove(buffer_.get(), pos_, available);
    pos_ = buffer_.get();
    end_ = pos_ + available;
  }
  while (available < n) {
    if (end_ == buffer_.get() + capacity_) {
      // Where the file's size is known the caller has checked `n` against
      // it.  Elsewhere (compressed streams, pipes) grow at most twofold per
      // step and only as decoded bytes arrive, so a hostile length cannot
      // make the reader allocate more than twice what the stream holds.
      const size_t grown =
          size_known_ ? n : std::min(n, std::max(capacity_ * 2, size_t{64}));
      std::unique_ptr<char[]> bigger(new (std::nothrow) char[grown]);
      if (bigger == nullptr) {
        throw IoError(
            file_.path(),
            fmt::format("out of memory: cannot allocate {} bytes to read the "
                        "record at byte {} (record {}), which needs {}; lower "
                        "max_record_bytes to refuse such records outright",
                        grown, pos_offset_, RecordsSeen(), n));
      }
      std::memcpy(bigger.get(), pos_, available);
      buffer_ = std::move(bigger);
      capacity_ = grown;
      pos_ = buffer_.get();
      end_ = pos_ + available;
    }
    const size_t got = stream_->Read(
        end_, static_cast<size_t>(buffer_.get() + capacity_ - end_));
    if (got == 0) {
      stream_end_ = true;
      return false;
    }
    end_ += got;
    available += got;
  }
  return true;
}

void TFRecordReader::Fail(DamageKind kind, uint64_t offset,
                          std::string detail) {
  finished_ = true;
  throw RecordError(file_.path(), offset, RecordsSeen(), kind,
                    std::move(detail));
}

void TFRecordReader::Report(DamageKind kind, uint64_t offset,
                            std::string detail, uint64_t bytes) {
  if (!options_.salvage) Fail(kind, offset, std::move(detail));
  ++stats_.skipped_ranges;
  stats_.skipped_bytes += bytes;
  if (options_.reporter != nullptr) {
    options_.reporter->Skipped(RecordError(file_.path(), offset, RecordsSeen(),
                                           kind, std::move(detail)),
                               bytes);
  }
}

void TFRecordReader::SkipRestOfStream(DamageKind kind, uint64_t offset,
                                      std::string detail) {
  uint64_t bytes = pos_offset_ + Available() - offset;
  if (size_known_ && file_.size() > offset) bytes = file_.size() - offset;
  finished_ = true;
  Report(kind, offset, std::move(detail), bytes);
  Consume(Available());
}

void TFRecordReader::Resynchronize(DamageKind kind, std::string detail) {
  if (!options_.salvage) Fail(kind, pos_offset_, std::move(detail));
  const uint64_t start = pos_offset_;
  Consume(1);
  while (true) {
    while (Available() >= kHeaderBytes) {
      if (CheckFrameHeader(pos_, /*verify_crc=*/true, options_.max_record_bytes,
                           UINT64_MAX) == FrameFault::kNone) {
        Report(
            kind, start,
            fmt::format("{}; resynchronised at byte {}", detail, pos_offset_),
            pos_offset_ - start);
        return;
      }
      Consume(1);
    }
    if (!Fill(kHeaderBytes)) {
      Consume(Available());
      finished_ = true;
      Report(kind, start,
             fmt::format("{}; no valid record header follows", detail),
             pos_offset_ - start);
      return;
    }
  }
}

void TFRecordReader::VerifyAhead() {
  verified_end_ =
      pos_offset_ + static_cast<uint64_t>(VerifyFramesAhead(pos_, end_) - pos_);
}

bool TFRecordReader::ReadRecord(std::string_view* record) {
  if (finished_) return false;
  try {
    return ReadNext(record);
  } catch (const DecompressionError& e) {
    finished_ = true;
    const uint64_t offset = pos_offset_;
    const uint64_t bytes = Available();
    Consume(bytes);
    Report(DamageKind::kDecompressionError, offset, e.what(), bytes);
    return false;
  } catch (...) {
    finished_ = true;
    throw;
  }
}

bool TFRecordReader::ReadNext(std::string_view* record) {
  while (!finished_) {
    const uint64_t offset = pos_offset_;
    if (!Fill(kHeaderBytes)) {
      if (Available() == 0) {
        finished_ = true;
        return false;
      }
      SkipRestOfStream(
          DamageKind::kTruncatedHeader, offset,
          fmt::format("the stream ends {} bytes into the 12-byte header",
                      Available()));
      return false;
    }
    const uint64_t length = HeaderLength(pos_);
    bool checked = offset < verified_end_;
    if (options_.verify_checksums && !checked) {
      VerifyAhead();
      checked = offset < verified_end_;
    }
    const uint64_t frame = length + kFrameOverhead;
    const bool verify_length = options_.verify_checksums && !checked;
    const bool length_verified = options_.verify_checksums;
    const uint64_t left =
        !size_known_ ? UINT64_MAX
                     : (file_.size() > offset ? file_.size() - offset : 0);
    const FrameFault fault =
        CheckFrameHeader(pos_, verify_length, options_.max_record_bytes, left);
    if (fault != FrameFault::kNone) {
      std::string detail = FrameFaultDetail(fault, length_verified, pos_,
                                            options_.max_record_bytes, left);
      if (offset == 0) {
        detail += StartOfStreamHint(std::string_view(
            pos_, std::min<size_t>(Available(), kHeaderBytes)));
      }
      const DamageKind kind = FrameFaultKind(fault, length_verified);
      if (fault != FrameFault::kPastEnd) {
        // A damaged length: look for the next good header.
        Resynchronize(kind, std::move(detail));
        continue;
      }
      SkipRestOfStream(kind, offset, std::move(detail));
      return false;
    }
    if (!Fill(frame)) {
      SkipRestOfStream(
          DamageKind::kTruncatedData, offset,
          fmt::format("the stream ends {} bytes into a record of {} bytes "
                      "({} with its framing)",
                      Available(), length, frame));
      return false;
    }
    const char* data = pos_ + kHeaderBytes;
    if (options_.verify_checksums && !checked && !DataChecks(data, length)) {
      Report(DamageKind::kDataCrcMismatch, offset, DataCrcDetail(data, length),
             frame);
      ++stats_.damaged_records;
      Consume(frame);
      continue;
    }
    *record = std::string_view(data, length);
    last_offset_ = offset;
    last_index_ = RecordsSeen();
    ++stats_.records;
    stats_.payload_bytes += length;
    Consume(frame);
    return true;
  }
  return false;
}

}  // namespace recflow::records
