// Plain files for the record readers and writers: a readable file with
// positional reads, and a writable file that is either complete under its
// final name or absent (atomic mode).  Every error is an IoError naming the
// path and the operation.
#ifndef RECFLOW_RECORDS_FILE_H_
#define RECFLOW_RECORDS_FILE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace recflow::records {

// An open file for reading.  Read() is sequential and not thread-safe;
// ReadAt() uses pread and may be called from several threads at once.
class ReadableFile {
 public:
  explicit ReadableFile(std::string path);  // throws IoError
  ~ReadableFile();
  ReadableFile(const ReadableFile&) = delete;
  ReadableFile& operator=(const ReadableFile&) = delete;

  const std::string& path() const { return path_; }
  // The size when the file was opened (0 for pipes and character devices).
  uint64_t size() const { return size_; }
  // True for a regular file, whose size() is meaningful.
  bool is_regular() const { return regular_; }

  // Reads up to `n` bytes from the current position; returns fewer only at
  // the end of the file, 0 there.
  size_t Read(char* dst, size_t n);
  // Moves the Read() position to `offset`.
  void Seek(uint64_t offset);
  // Reads up to `n` bytes at `offset`; returns fewer only at the end.
  size_t ReadAt(uint64_t offset, char* dst, size_t n) const;
  // Bytes consumed by Read() so far.
  uint64_t position() const { return position_; }
  // The descriptor, for reads the caller issues itself (io_uring); it
  // stays open while this object lives.
  int fd() const { return fd_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  bool regular_ = false;
  uint64_t position_ = 0;
};

// A file being written.  In atomic mode the bytes go to a hidden temporary
// file in the same directory ("." + name + ".tmp-" + unique suffix), which
// Close() fsyncs and renames over the final name, then fsyncs the directory;
// until then nothing exists under the final name.  Destroying a file that was
// not closed removes what was written (the temporary file in atomic mode,
// the partial file otherwise when it is a regular file), so a failed writer
// never leaves a file that looks complete.  Folders above `path` that do
// not exist are created (as mkdir -p; they stay if writing then fails).
// Not thread-safe.
class WritableFile {
 public:
  WritableFile(std::string path, bool atomic);  // throws IoError
  ~WritableFile();
  WritableFile(const WritableFile&) = delete;
  WritableFile& operator=(const WritableFile&) = delete;

  const std::string& path() const { return path_; }
  // Writes all of `data` (retrying short writes and EINTR).
  void Append(std::string_view data);
  // Writes `a` then `b` then `c` with one system call where possible.
  void Append3(std::string_view a, std::string_view b, std::string_view c);
  // fsync.
  void Sync();
  // Completes the file: Finish(), then Commit().  After Close() only path()
  // and bytes_written() may be used.
  void Close();
  // The two halves of Close(), for writers of several files that must
  // appear together (all shards, or none): Finish() fsyncs (atomic mode) and
  // closes the descriptor, leaving the temporary file; Commit() renames it
  // into place and fsyncs the directory.  A file finished but never
  // committed is removed by the destructor.
  void Finish();
  void Commit();
  // Drops what was written (see the class comment); idempotent.
  void Abandon();
  uint64_t bytes_written() const { return bytes_written_; }

 private:
  std::string path_;
  std::string temp_path_;  // empty unless atomic
  int fd_ = -1;
  bool regular_ = false;
  bool finished_ = false;
  uint64_t bytes_written_ = 0;
};

// The directory part of `path` ("." when there is none).
std::string DirectoryOf(std::string_view path);

// Creates the folder `dir` and those above it (mkdir -p); an existing
// folder is fine.  Throws IoError naming `dir` and the reason (a file in
// the way, no permission).
void MakeDirectories(const std::string& dir);

}  // namespace recflow::records

#endif  // RECFLOW_RECORDS_FILE_H_
