#include "records/parallel_scan.h"

#include <algorithm>
#include <exception>
#include <thread>
#include <vector>

#include "records/tfrecord_format.h"

namespace recflow::records {
namespace {

// Bytes examined per read while looking for a synchronisation point.
constexpr size_t kSyncWindow = size_t{1} << 20;
constexpr size_t kNone = SIZE_MAX;

// The first offset in [from, limit) where a record header checks, its
// length is plausible and fits in the file, and, when the record lies in
// the window read, its data CRC checks too.  `limit` when there is none.
uint64_t FindSync(const ReadableFile& file, uint64_t from, uint64_t limit,
                  uint64_t max_record_bytes) {
  std::vector<char> window(kSyncWindow + kHeaderBytes - 1);
  for (uint64_t base = from; base < limit; base += kSyncWindow) {
    const size_t got = file.ReadAt(base, window.data(),
                                   static_cast<size_t>(std::min<uint64_t>(
                                       window.size(), file.size() - base)));
    for (size_t i = 0;
         i < kSyncWindow && base + i < limit && i + kHeaderBytes <= got; ++i) {
      const char* header = window.data() + i;
      if (CheckFrameHeader(header, /*verify_crc=*/true, max_record_bytes,
                           file.size() - (base + i)) != FrameFault::kNone) {
        continue;
      }
      const uint64_t length = HeaderLength(header);
      if (i + kFrameOverhead + length <= got &&
          !DataChecks(header + kHeaderBytes, length)) {
        continue;
      }
      return base + i;
    }
  }
  return limit;
}

struct Segment {
  uint64_t start = 0;
  uint64_t records = 0;
  uint64_t payload_bytes = 0;
  uint64_t stream_bytes = 0;
  size_t landed = kNone;  // the segment whose start this chain reached
  std::exception_ptr error;
};

// Reads from segment `i`'s start until the chain of records lands exactly
// on a later segment's start, or the file ends.
void ReadSegment(const std::string& path, const ReaderOptions& options,
                 std::vector<Segment>& segments, size_t i) {
  Segment& s = segments[i];
  ReaderOptions o = options;
  o.start_offset = s.start;
  uint64_t next = s.start;
  try {
    TFRecordReader reader(path, o);
    size_t target = i + 1;
    std::string_view record;
    while (true) {
      while (target < segments.size() && next > segments[target].start) {
        ++target;
      }
      if (target < segments.size() && next == segments[target].start) {
        s.landed = target;
        break;
      }
      if (!reader.ReadRecord(&record)) break;
      ++s.records;
      s.payload_bytes += record.size();
      next = reader.last_offset() + record.size() + kFrameOverhead;
    }
  } catch (...) {
    s.error = std::current_exception();
  }
  s.stream_bytes = next - s.start;
}

ScanResult ScanSequentially(const std::string& path,
                            const ReaderOptions& options) {
  TFRecordReader reader(path, options);
  std::string_view record;
  while (reader.ReadRecord(&record)) {
  }
  const ReadStats stats = reader.stats();
  return {stats.records,        stats.payload_bytes,
          stats.stream_bytes,   reader.file_bytes_read(),
          reader.compression(), 1};
}

}  // namespace

ScanResult ScanFile(const std::string& path, const ReaderOptions& options,
                    int threads, uint64_t min_segment_bytes) {
  if (threads <= 0) {
    threads =
        static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  ReadableFile file(path);
  const Compression compression =
      options.compression.value_or(DetectCompression(file));
  const uint64_t by_size =
      min_segment_bytes == 0 ? threads : file.size() / min_segment_bytes;
  const int n = static_cast<int>(
      std::min<uint64_t>(static_cast<uint64_t>(threads), by_size));
  if (n < 2 || compression != Compression::kNone || !file.is_regular() ||
      !options.verify_checksums || options.salvage ||
      options.start_offset != 0) {
    return ScanSequentially(path, options);
  }

  std::vector<Segment> segments(1);
  for (int k = 1; k < n; ++k) {
    const uint64_t from = file.size() / n * k;
    const uint64_t limit = k + 1 < n ? file.size() / n * (k + 1) : file.size();
    const uint64_t sync = FindSync(file, from, limit, options.max_record_bytes);
    if (sync < limit) {
      segments.emplace_back();
      segments.back().start = sync;
    }
  }
  std::vector<std::thread> workers;
  for (size_t i = 1; i < segments.size(); ++i) {
    workers.emplace_back([&, i] { ReadSegment(path, options, segments, i); });
  }
  ReadSegment(path, options, segments, 0);
  for (auto& w : workers) w.join();

  // Follow the chain from byte 0; segments it skipped over are discarded.
  ScanResult result;
  result.compression = compression;
  result.threads = static_cast<int>(segments.size());
  for (size_t i = 0; i != kNone; i = segments[i].landed) {
    const Segment& s = segments[i];
    if (s.error) {
      try {
        std::rethrow_exception(s.error);
      } catch (const RecordError& e) {
        // The segment counted from its own start: make the index global.
        throw RecordError(e.path(), e.offset(),
                          e.record_index() + result.records, e.kind(),
                          e.detail());
      }
    }
    result.records += s.records;
    result.payload_bytes += s.payload_bytes;
    result.stream_bytes += s.stream_bytes;
  }
  result.file_bytes = result.stream_bytes;  // uncompressed: the same bytes
  return result;
}

}  // namespace recflow::records
