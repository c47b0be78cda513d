#include "records/file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <system_error>

#include "records/errors.h"
#include "records/io_faults.h"

namespace recflow::records {
namespace {

// Linux refuses single reads and writes above this (0x7ffff000).
constexpr size_t kMaxIo = size_t{1} << 30;

// The system calls below, each through the fault seam (io_faults.h).  A
// short transfer is at least one byte, so it is never mistaken for the end.
ssize_t ReadCall(int fd, char* dst, size_t n, const std::string& path) {
  const IoFault f = CheckIoFault(IoOp::kRead, path, n);
  if (f.error != 0) {
    errno = f.error;
    return -1;
  }
  return read(fd, dst, std::min(n, std::max<size_t>(f.max_bytes, 1)));
}

ssize_t PreadCall(int fd, char* dst, size_t n, uint64_t offset,
                  const std::string& path) {
  const IoFault f = CheckIoFault(IoOp::kRead, path, n);
  if (f.error != 0) {
    errno = f.error;
    return -1;
  }
  return pread(fd, dst, std::min(n, std::max<size_t>(f.max_bytes, 1)),
               static_cast<off_t>(offset));
}

ssize_t WritevCall(int fd, iovec* iov, int count, const std::string& path) {
  size_t total = 0;
  for (int i = 0; i < count; ++i) total += iov[i].iov_len;
  const IoFault f = CheckIoFault(IoOp::kWrite, path, total);
  if (f.error != 0) {
    errno = f.error;
    return -1;
  }
  size_t budget = std::max<size_t>(f.max_bytes, 1);
  int used = 0;
  for (; used < count && budget > 0; ++used) {
    iov[used].iov_len = std::min(iov[used].iov_len, budget);
    budget -= iov[used].iov_len;
  }
  return writev(fd, iov, used);
}

int SyncCall(int fd, const std::string& path) {
  const IoFault f = CheckIoFault(IoOp::kSync, path, 0);
  if (f.error != 0) {
    errno = f.error;
    return -1;
  }
  return fdatasync(fd);
}

int RenameCall(const std::string& from, const std::string& to) {
  const IoFault f = CheckIoFault(IoOp::kRename, to, 0);
  if (f.error != 0) {
    errno = f.error;
    return -1;
  }
  return rename(from.c_str(), to.c_str());
}

std::string UniqueTempPath(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  const std::string dir = DirectoryOf(path);
  const size_t slash = path.rfind('/');
  const std::string name =
      slash == std::string::npos ? path : path.substr(slash + 1);
  return fmt::format("{}/.{}.tmp-{}-{}", dir, name, getpid(),
                     counter.fetch_add(1));
}

// Makes the entry of `path` (just renamed into place) durable.  Errors name
// `path`, the file the caller wrote.
void SyncDirectory(const std::string& path) {
  const std::string dir = DirectoryOf(path);
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    throw IoError(path,
                  fmt::format("in place, but cannot open its directory {} "
                              "to make that durable",
                              dir),
                  errno);
  }
  const IoFault f = CheckIoFault(IoOp::kSync, dir, 0);
  const int rc = f.error != 0 ? -1 : fsync(fd);
  const int err = f.error != 0 ? f.error : errno;
  close(fd);
  // Some file systems (and /dev/shm-like mounts) cannot sync directories.
  if (rc != 0 && err != EINVAL && err != EROFS) {
    throw IoError(path,
                  fmt::format("in place, but the fsync of its directory {} "
                              "failed, so that may not survive a crash",
                              dir),
                  err);
  }
}

}  // namespace

std::string DirectoryOf(std::string_view path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string_view::npos) return ".";
  if (slash == 0) return "/";
  return std::string(path.substr(0, slash));
}

ReadableFile::ReadableFile(std::string path) : path_(std::move(path)) {
  fd_ = open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw IoError(path_, "cannot open for reading", errno);
  struct stat st;
  if (fstat(fd_, &st) != 0) {
    const int err = errno;
    close(fd_);
    throw IoError(path_, "cannot stat", err);
  }
  if (S_ISDIR(st.st_mode)) {
    close(fd_);
    throw IoError(path_, "is a directory, not a record file");
  }
  regular_ = S_ISREG(st.st_mode);
  size_ = regular_ ? static_cast<uint64_t>(st.st_size) : 0;
  if (regular_) posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
}

ReadableFile::~ReadableFile() {
  if (fd_ >= 0) close(fd_);
}

size_t ReadableFile::Read(char* dst, size_t n) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r =
        ReadCall(fd_, dst + done, std::min(n - done, kMaxIo), path_);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw IoError(path_, fmt::format("read at byte {} failed", position_),
                    errno);
    }
    if (r == 0) break;
    done += static_cast<size_t>(r);
    position_ += static_cast<uint64_t>(r);
  }
  return done;
}

void ReadableFile::Seek(uint64_t offset) {
  if (lseek(fd_, static_cast<off_t>(offset), SEEK_SET) < 0) {
    throw IoError(path_, fmt::format("cannot seek to byte {}", offset), errno);
  }
  position_ = offset;
}

size_t ReadableFile::ReadAt(uint64_t offset, char* dst, size_t n) const {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = PreadCall(fd_, dst + done, std::min(n - done, kMaxIo),
                                offset + done, path_);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw IoError(
          path_,
          fmt::format("read of {} bytes at byte {} failed", n, offset + done),
          errno);
    }
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  return done;
}

namespace {
// Creates the folders above `path` that do not exist (mode 0755, as
// mkdir -p), so that writing PREFIX/x/y works as TensorFlow's and Beam's
// writers do.  Throws IoError for `shown` (the final name of the file)
// naming the folder that could not be made.
void CreateParentDirectories(const std::string& path,
                             const std::string& shown) {
  const std::filesystem::path parent =
      std::filesystem::path(path).parent_path();
  if (parent.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(parent, ec);
  if (ec) {
    throw IoError(shown, fmt::format("cannot create its folder {}: {}",
                                     parent.string(), ec.message()));
  }
}

// open(2), and when a folder above `path` is missing, those folders made
// and open(2) again.  `shown` as CreateParentDirectories.
int OpenCreating(const std::string& path, int flags, const std::string& shown) {
  int fd = open(path.c_str(), flags, 0644);
  if (fd < 0 && errno == ENOENT) {
    CreateParentDirectories(path, shown);
    fd = open(path.c_str(), flags, 0644);
  }
  return fd;
}
}  // namespace

WritableFile::WritableFile(std::string path, bool atomic)
    : path_(std::move(path)) {
  if (atomic) {
    temp_path_ = UniqueTempPath(path_);
    fd_ = OpenCreating(temp_path_, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                       path_);
    if (fd_ < 0) {
      throw IoError(path_,
                    fmt::format("cannot create temporary file {}", temp_path_),
                    errno);
    }
  } else {
    fd_ = OpenCreating(path_, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, path_);
    if (fd_ < 0) throw IoError(path_, "cannot open for writing", errno);
  }
  struct stat st;
  regular_ = fstat(fd_, &st) == 0 && S_ISREG(st.st_mode);
}

WritableFile::~WritableFile() { Abandon(); }

void WritableFile::Abandon() {
  if (fd_ < 0 && !finished_) return;
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  finished_ = false;
  if (!temp_path_.empty()) {
    unlink(temp_path_.c_str());
    temp_path_.clear();
  } else if (regular_) {
    unlink(path_.c_str());
  }
}

void WritableFile::Append(std::string_view data) { Append3(data, {}, {}); }

void WritableFile::Append3(std::string_view a, std::string_view b,
                           std::string_view c) {
  if (fd_ < 0) throw IoError(path_, "write after close");
  iovec iov[3] = {{const_cast<char*>(a.data()), a.size()},
                  {const_cast<char*>(b.data()), b.size()},
                  {const_cast<char*>(c.data()), c.size()}};
  int first = 0;
  size_t left = a.size() + b.size() + c.size();
  while (left > 0) {
    while (iov[first].iov_len == 0) ++first;
    // Keep each call under the kernel's per-call limit.
    iovec chunk[3];
    int count = 0;
    size_t budget = kMaxIo;
    for (int i = first; i < 3 && budget > 0; ++i) {
      if (iov[i].iov_len == 0) continue;
      chunk[count] = iov[i];
      chunk[count].iov_len = std::min(iov[i].iov_len, budget);
      budget -= chunk[count].iov_len;
      ++count;
    }
    const ssize_t w = WritevCall(fd_, chunk, count, path_);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw IoError(
          path_, fmt::format("write at byte {} failed", bytes_written_), errno);
    }
    size_t done = static_cast<size_t>(w);
    bytes_written_ += done;
    left -= done;
    for (int i = first; i < 3 && done > 0; ++i) {
      const size_t take = std::min(done, iov[i].iov_len);
      iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + take;
      iov[i].iov_len -= take;
      done -= take;
    }
  }
}

void WritableFile::Sync() {
  if (fd_ < 0) throw IoError(path_, "sync after close");
  if (regular_ && SyncCall(fd_, path_) != 0) {
    throw IoError(path_, "fsync failed", errno);
  }
}

void WritableFile::Close() {
  Finish();
  Commit();
}

void WritableFile::Finish() {
  if (fd_ < 0) throw IoError(path_, "finished twice, or after a failure");
  if (!temp_path_.empty()) Sync();
  const int rc = close(fd_);
  const int err = errno;
  fd_ = -1;
  finished_ = true;
  if (rc != 0) {
    Abandon();
    throw IoError(path_, "close failed", err);
  }
}

void WritableFile::Commit() {
  if (!finished_) throw IoError(path_, "committed before it was finished");
  finished_ = false;
  if (temp_path_.empty()) return;
  if (RenameCall(temp_path_, path_) != 0) {
    const int err = errno;
    unlink(temp_path_.c_str());
    temp_path_.clear();
    throw IoError(path_, "cannot rename the temporary file into place", err);
  }
  temp_path_.clear();
  SyncDirectory(path_);
}

void MakeDirectories(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    throw IoError(dir,
                  fmt::format("cannot create this folder: {}", ec.message()));
  }
}

}  // namespace recflow::records
