#include "records/tfrecord_writer.h"

#include <fmt/format.h>
#include <zlib.h>
#include <zstd.h>

#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include "records/errors.h"
#include "records/file.h"
#include "records/tfrecord_format.h"

namespace recflow::records {

// Receives framed records and writes them, compressed or not, to the file.
class TFRecordWriter::Codec {
 public:
  Codec(const std::string& path, bool atomic, std::vector<IndexEntry>* entries)
      : file_(std::make_unique<WritableFile>(path, atomic)),
        entries_(entries) {}
  virtual ~Codec() = default;

  // One record: its 12-byte header, payload and 4-byte footer.
  virtual void Put(const char* header, std::string_view data,
                   const char* footer) = 0;
  virtual void Flush() = 0;
  // Ends the stream (everything buffered reaches the file).
  virtual void Finish() = 0;
  virtual uint64_t file_bytes() const { return file_->bytes_written(); }
  WritableFile& file() { return *file_; }

 protected:
  std::unique_ptr<WritableFile> file_;
  std::vector<IndexEntry>* const entries_;  // null unless building an index
};

namespace {

constexpr size_t kStagingBytes = size_t{1} << 20;

std::string_view View(const char* p, size_t n) { return {p, n}; }

// Lays one framed record out at `dst`, which has room for it.
void CopyFrame(char* dst, const char* header, std::string_view data,
               const char* footer) {
  std::memcpy(dst, header, kHeaderBytes);
  if (!data.empty()) std::memcpy(dst + kHeaderBytes, data.data(), data.size());
  std::memcpy(dst + kHeaderBytes + data.size(), footer, kFooterBytes);
}

class NoneCodec final : public TFRecordWriter::Codec {
 public:
  using Codec::Codec;

  void Put(const char* header, std::string_view data,
           const char* footer) override {
    const size_t frame = data.size() + kFrameOverhead;
    if (entries_ != nullptr) entries_->push_back({file_bytes(), frame, 0, 0});
    if (frame > kStagingBytes - used_) WriteStaging();
    if (frame <= kStagingBytes - used_) {
      CopyFrame(staging_.get() + used_, header, data, footer);
      used_ += frame;
    } else {
      file_->Append3(View(header, kHeaderBytes), data,
                     View(footer, kFooterBytes));
    }
  }
  void Flush() override { WriteStaging(); }
  void Finish() override { WriteStaging(); }
  uint64_t file_bytes() const override {
    return file_->bytes_written() + used_;
  }

 private:
  void WriteStaging() {
    if (used_ == 0) return;
    file_->Append(View(staging_.get(), used_));
    used_ = 0;
  }

  std::unique_ptr<char[]> staging_{new char[kStagingBytes]};
  size_t used_ = 0;
};

// ZLIB and GZIP: one deflate stream over all framed records, as
// TensorFlow's ZlibOutputBuffer writes it.
class ZlibCodec final : public TFRecordWriter::Codec {
 public:
  ZlibCodec(const std::string& path, bool atomic, bool gzip, int level)
      : Codec(path, atomic, nullptr) {
    std::memset(&z_, 0, sizeof z_);
    if (deflateInit2(&z_, level == 0 ? Z_DEFAULT_COMPRESSION : level,
                     Z_DEFLATED, gzip ? MAX_WBITS + 16 : MAX_WBITS, 8,
                     Z_DEFAULT_STRATEGY) != Z_OK) {
      throw IoError(path, fmt::format("cannot initialise zlib: {}",
                                      z_.msg ? z_.msg : "out of memory"));
    }
  }
  ~ZlibCodec() override { deflateEnd(&z_); }

  void Put(const char* header, std::string_view data,
           const char* footer) override {
    const size_t frame = data.size() + kFrameOverhead;
    if (frame > kStagingBytes - used_) DeflateStaging(Z_NO_FLUSH);
    if (frame <= kStagingBytes - used_) {
      CopyFrame(staging_.get() + used_, header, data, footer);
      used_ += frame;
    } else {
      Deflate(header, kHeaderBytes, Z_NO_FLUSH);
      Deflate(data.data(), data.size(), Z_NO_FLUSH);
      Deflate(footer, kFooterBytes, Z_NO_FLUSH);
    }
  }
  void Flush() override {
    DeflateStaging(Z_SYNC_FLUSH);
    WriteOut();
  }
  void Finish() override {
    DeflateStaging(Z_FINISH);
    WriteOut();
  }
  uint64_t file_bytes() const override {
    return file_->bytes_written() + out_used_;
  }

 private:
  void DeflateStaging(int flush) {
    Deflate(staging_.get(), used_, flush);
    used_ = 0;
  }

  void Deflate(const char* p, size_t n, int flush) {
    z_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(p));
    size_t left = n;
    while (true) {
      const uInt chunk = static_cast<uInt>(std::min<size_t>(left, 1u << 30));
      z_.avail_in = chunk;
      left -= chunk;
      const int mode = left == 0 ? flush : Z_NO_FLUSH;
      while (true) {
        if (out_used_ == kStagingBytes) WriteOut();
        z_.next_out = reinterpret_cast<Bytef*>(out_.get() + out_used_);
        z_.avail_out = static_cast<uInt>(kStagingBytes - out_used_);
        const int rc = deflate(&z_, mode);
        out_used_ = kStagingBytes - z_.avail_out;
        if (rc == Z_STREAM_ERROR) {
          throw IoError(file_->path(), "zlib compression failed");
        }
        if (mode == Z_FINISH) {
          if (rc == Z_STREAM_END) break;
        } else if (z_.avail_in == 0 && z_.avail_out != 0) {
          break;
        }
      }
      if (left == 0) break;
    }
  }

  void WriteOut() {
    if (out_used_ == 0) return;
    file_->Append(View(out_.get(), out_used_));
    out_used_ = 0;
  }

  z_stream z_;
  std::unique_ptr<char[]> staging_{new char[kStagingBytes]};
  size_t used_ = 0;
  std::unique_ptr<char[]> out_{new char[kStagingBytes]};
  size_t out_used_ = 0;
};

// ZSTD: records are gathered into a frame of about `frame_bytes` and each
// frame compressed on its own (with its content size and a checksum in the
// frame header), so an index can point at a frame and a reader decode just
// that frame.  Concatenated frames are a valid zstd stream.
//
// With `threads` > 1, up to 2 x threads frames are in flight: worker
// threads (each with its own ZSTD_CCtx) compress them at once and the
// writing thread appends them to the file in order — pzstd's approach, not
// ZSTD_c_nbWorkers, which splits one frame into jobs of several MB and so
// would not help 1 MB frames (the index's unit of random access).  The
// bytes are those a single thread writes: each frame is compressed alone.
class ZstdCodec final : public TFRecordWriter::Codec {
 public:
  ZstdCodec(const std::string& path, bool atomic, int level, size_t frame_bytes,
            int threads, std::vector<IndexEntry>* entries)
      : Codec(path, atomic, entries),
        level_(level == 0 ? 3 : level),
        frame_bytes_(frame_bytes),
        slots_(threads > 1 ? 2 * static_cast<size_t>(threads) : 1) {
    for (auto& job : slots_) job.in.reserve(frame_bytes_ + (64 << 10));
    cctx_ = NewContext();  // a bad level fails here, at once
    if (threads > 1) {
      ZSTD_freeCCtx(cctx_);
      cctx_ = nullptr;
      for (int t = 0; t < threads; ++t) {
        workers_.emplace_back([this] { Work(); });
      }
    }
  }
  ~ZstdCodec() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : workers_) t.join();
    ZSTD_freeCCtx(cctx_);
  }

  void Put(const char* header, std::string_view data,
           const char* footer) override {
    std::string& frame = slots_[next_].in;
    if (entries_ != nullptr) {
      entries_->push_back({frame.size(), data.size() + kFrameOverhead, 0, 0});
    }
    frame.append(header, kHeaderBytes);
    frame.append(data);
    frame.append(footer, kFooterBytes);
    if (frame.size() >= frame_bytes_) EndFrame();
  }
  void Flush() override {
    EndFrame();
    Drain(0);
  }
  void Finish() override { Flush(); }

 private:
  // One frame: its framed records, then (once compressed) its bytes.
  struct Job {
    std::string in;
    std::string out;
    size_t first_entry = 0, end_entry = 0;  // its records in *entries_
    bool done = false;  // compressed (set by a worker, under mu_)
    std::string error;  // from ZSTD, when compression failed
  };

  ZSTD_CCtx* NewContext() const {
    // The level was checked by CheckCompressionLevel.
    ZSTD_CCtx* cctx = ZSTD_createCCtx();
    if (cctx == nullptr) {
      throw IoError(file_->path(), "cannot create zstd context");
    }
    const size_t rc =
        ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level_);
    if (ZSTD_isError(rc)) {
      ZSTD_freeCCtx(cctx);
      throw IoError(file_->path(), fmt::format("zstd level {}: {}", level_,
                                               ZSTD_getErrorName(rc)));
    }
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
    return cctx;
  }

  static void Compress(ZSTD_CCtx* cctx, Job& job) {
    job.out.resize(ZSTD_compressBound(job.in.size()));
    const size_t n = ZSTD_compress2(cctx, job.out.data(), job.out.size(),
                                    job.in.data(), job.in.size());
    if (ZSTD_isError(n)) {
      job.error = ZSTD_getErrorName(n);
      job.out.clear();
    } else {
      job.out.resize(n);
    }
  }

  // A worker: compresses queued frames, oldest first.
  void Work() {
    // The level was checked in the constructor: only memory can fail here,
    // and then every frame this worker takes says so.
    ZSTD_CCtx* cctx = nullptr;
    try {
      cctx = NewContext();
    } catch (const std::exception&) {
    }
    std::unique_lock lock(mu_);
    while (true) {
      work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) break;
      Job* job = queue_.front();
      queue_.erase(queue_.begin());
      lock.unlock();
      if (cctx != nullptr) {
        Compress(cctx, *job);
      } else {
        job->error = "cannot create zstd context";
      }
      lock.lock();
      job->done = true;
      done_cv_.notify_all();
    }
    ZSTD_freeCCtx(cctx);
  }

  // Hands the filling frame on: compressed here (one thread), or queued for
  // the workers once the oldest frame in flight has been written, if every
  // slot is taken.
  void EndFrame() {
    Job& job = slots_[next_];
    if (job.in.empty()) return;
    job.first_entry = pending_entries_;
    job.end_entry = entries_ != nullptr ? entries_->size() : 0;
    pending_entries_ = job.end_entry;
    if (workers_.empty()) {
      Compress(cctx_, job);
      WriteJob(job);
      return;
    }
    {
      std::lock_guard lock(mu_);
      job.done = false;
      queue_.push_back(&job);
    }
    work_cv_.notify_one();
    ++in_flight_;
    next_ = (next_ + 1) % slots_.size();
    // The next slot to fill is the oldest in flight: write it first.
    Drain(slots_.size() - 1);
  }

  // Writes frames in order until at most `keep` are in flight.
  void Drain(size_t keep) {
    while (in_flight_ > keep) {
      Job& oldest =
          slots_[(next_ + slots_.size() - in_flight_) % slots_.size()];
      {
        std::unique_lock lock(mu_);
        done_cv_.wait(lock, [&] { return oldest.done; });
      }
      --in_flight_;
      WriteJob(oldest);
    }
  }

  void WriteJob(Job& job) {
    if (!job.error.empty()) {
      throw IoError(file_->path(),
                    fmt::format("zstd compression failed: {}", job.error));
    }
    const uint64_t frame_offset = file_->bytes_written();
    file_->Append(job.out);
    if (entries_ != nullptr) {
      for (size_t i = job.first_entry; i < job.end_entry; ++i) {
        (*entries_)[i].frame_offset = frame_offset;
        (*entries_)[i].frame_bytes = job.out.size();
      }
    }
    job.in.clear();
    if (job.in.capacity() > 4 * frame_bytes_) job.in.shrink_to_fit();
  }

  const int level_;
  const size_t frame_bytes_;
  ZSTD_CCtx* cctx_ = nullptr;  // one thread: compresses on the caller's
  std::vector<Job> slots_;     // a ring: next_ fills, those before fly
  size_t next_ = 0;
  size_t in_flight_ = 0;
  size_t pending_entries_ = 0;  // entries_ before this are in a job
  std::vector<std::thread> workers_;
  std::mutex mu_;  // guards queue_, stop_, and Job::done while in flight
  std::condition_variable work_cv_, done_cv_;
  std::vector<Job*> queue_;
  bool stop_ = false;
};

}  // namespace

void CheckCompressionLevel(Compression compression, int level) {
  if (level == 0) return;
  switch (compression) {
    case Compression::kNone:
      throw Error(
          fmt::format("compression level {}: an uncompressed file has no "
                      "level (zlib, gzip and zstd do)",
                      level));
    case Compression::kZlib:
    case Compression::kGzip:
      if (level < 1 || level > 9) {
        throw Error(fmt::format(
            "compression level {}: {} takes 1 to 9 (0: its default, 6)", level,
            CompressionName(compression)));
      }
      return;
    case Compression::kZstd:
      // ZSTD would clamp a level out of range; a writer asked for one says
      // so.
      if (level < ZSTD_minCLevel() || level > ZSTD_maxCLevel()) {
        throw Error(fmt::format(
            "compression level {}: zstd takes {} to {} (0: its default, 3)",
            level, ZSTD_minCLevel(), ZSTD_maxCLevel()));
      }
      return;
  }
}

TFRecordWriter::TFRecordWriter(std::string path, WriterOptions options)
    : path_(std::move(path)), options_(options) {
  try {
    CheckCompressionLevel(options_.compression, options_.level);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", path_, e.what()));
  }
  index_.compression = options_.compression;
  std::vector<IndexEntry>* entries =
      options_.build_index ? &index_.entries : nullptr;
  switch (options_.compression) {
    case Compression::kNone:
      codec_ = std::make_unique<NoneCodec>(path_, options_.atomic, entries);
      break;
    case Compression::kZlib:
    case Compression::kGzip:
      if (options_.build_index) {
        throw Error(fmt::format(
            "{}: {} streams cannot be indexed (a reader cannot start in the "
            "middle); use none or zstd",
            path_, CompressionName(options_.compression)));
      }
      codec_ = std::make_unique<ZlibCodec>(
          path_, options_.atomic, options_.compression == Compression::kGzip,
          options_.level);
      break;
    case Compression::kZstd:
      codec_ = std::make_unique<ZstdCodec>(
          path_, options_.atomic, options_.level, options_.zstd_frame_bytes,
          options_.compression_threads, entries);
      break;
  }
}

TFRecordWriter::~TFRecordWriter() = default;

void TFRecordWriter::Write(std::string_view record) {
  if (finished_) throw Error(fmt::format("{}: write after close", path_));
  char header[kHeaderBytes];
  char footer[kFooterBytes];
  EncodeHeader(header, record.size());
  EncodeFooter(footer, record.data(), record.size());
  codec_->Put(header, record, footer);
  ++records_;
  stream_bytes_ += record.size() + kFrameOverhead;
}

void TFRecordWriter::Flush() {
  if (finished_) throw Error(fmt::format("{}: flush after close", path_));
  codec_->Flush();
}

void TFRecordWriter::Close() {
  Finish();
  Commit();
}

void TFRecordWriter::Finish() {
  if (finished_) return;
  codec_->Finish();
  codec_->file().Finish();
  finished_ = true;
}

void TFRecordWriter::Commit() {
  if (!finished_) Finish();
  if (committed_) return;
  codec_->file().Commit();
  committed_ = true;
  // An index beside the file (FILE.idx) described the file this one
  // replaced.  A failure to remove it is left to the readers, which check
  // an index against its file before using it.
  std::error_code ignored;
  std::filesystem::remove(IndexPathFor(path_), ignored);
}

uint64_t TFRecordWriter::file_bytes() const { return codec_->file_bytes(); }

}  // namespace recflow::records
