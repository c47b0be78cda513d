// Helpers shared by the tests: temporary directories, file bytes, and a
// record writer that is independent of records/ (for golden comparisons).
#ifndef RECFLOW_TESTS_TEST_UTIL_H_
#define RECFLOW_TESTS_TEST_UTIL_H_

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "records/tfrecord_reader.h"
#include "records/tfrecord_writer.h"

namespace recflow::testing {

// Every codec a record file can be written with.
inline constexpr records::Compression kAllCompressions[] = {
    records::Compression::kNone, records::Compression::kZlib,
    records::Compression::kGzip, records::Compression::kZstd};

// A fresh directory under the system's temporary directory, removed with
// everything in it when the object goes away.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string File(const std::string& name) const {
    return (path_ / name).string();
  }
  // Names of the entries in the directory, sorted (hidden ones included).
  std::vector<std::string> List() const;

 private:
  std::filesystem::path path_;
};

std::string ReadFileBytes(const std::string& path);
void WriteFileBytes(const std::string& path, const std::string& bytes);

// Bitwise CRC-32C, straight from the definition; shares no code with
// records/crc32c.cc.
uint32_t ReferenceCrc32c(const std::string& data);
uint32_t ReferenceMask(uint32_t crc);

// `state` with its last 4 bytes replaced by the masked CRC-32C of the rest:
// an iterator state (pipeline/state.h) changed on purpose and made to pass
// the CRC, so that only the stages' own checks can refuse it.
std::string WithStateCrc(std::string_view state);

// TFRecord framing written from the definition, independent of records/.
std::string ReferenceFrame(const std::string& payload);
// Decodes a whole uncompressed TFRecord stream from the definition,
// checking both CRCs; returns false on any damage.
bool ReferenceDecode(const std::string& stream,
                     std::vector<std::string>* payloads);

// `n` payloads of random bytes with sizes in [0, max_size], seeded.
std::vector<std::string> RandomPayloads(size_t n, size_t max_size,
                                        uint64_t seed);

// Writes `records` to `path` with records::TFRecordWriter and closes it.
void WriteRecords(const std::string& path,
                  const std::vector<std::string>& records,
                  records::WriterOptions options = {});
void WriteRecords(const std::string& path,
                  const std::vector<std::string>& records,
                  records::Compression compression);
// Every record of `path`, read with records::TFRecordReader.
std::vector<std::string> ReadRecords(const std::string& path,
                                     records::ReaderOptions options = {});

// A .npy file's bytes: header for `descr` ("<f4") and `shape` ("(3, 2)"),
// then `data`.
std::string NpyBytes(const std::string& descr, const std::string& shape,
                     const std::string& data);
// The same with the header's descr as written there: "'<f4'", or a record
// array's "[('a', '<i4')]".
std::string NpyBytesWithDescr(const std::string& descr,
                              const std::string& shape,
                              const std::string& data);
// The bytes of a vector's elements.
template <typename T>
std::string Raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()),
                     v.size() * sizeof(T));
}
// A zip archive as numpy.savez writes it (stored) or savez_compressed
// (deflated), built by hand.
std::string Zip(const std::vector<std::pair<std::string, std::string>>& files,
                bool compress);
// `data` as one whole stream of `compression` (zlib, gzip, zstd; none: as
// is), written with the codec libraries directly, not through records/.
std::string Compressed(const std::string& data,
                       records::Compression compression);
// `v` as 4 big-endian bytes (IDX headers).
std::string Be32(uint32_t v);
// The smallest headers the images converter sizes: a PNG of 4 x 3 pixels
// (IHDR) and a JPEG of 7 x 5 (SOF0), each followed by filler bytes.
std::string TinyPng();
std::string TinyJpeg();

// Caps this process's address space (RLIMIT_AS) at `bytes`, for tests that
// show an input cannot make the process allocate what it claims; run it in
// a child (a death test).  Returns false, capping nothing, under
// AddressSanitizer or ThreadSanitizer, whose shadow memory needs far more
// address space than any cap a test would set.
bool CapAddressSpace(uint64_t bytes);
// Whether CapAddressSpace can cap anything in this build (false under a
// sanitizer, whichever way the compiler says so: GCC defines
// __SANITIZE_ADDRESS__, clang 14 only __has_feature); tests that need the
// cap skip, saying why, when it cannot.
bool AddressSpaceCanBeCapped();

// The threads of this process (Linux: /proc/self/task).
size_t ThreadsNow();
// ThreadsNow() once it is at most `want`, waiting up to 5 s for it to get
// there: a thread that has been joined stays listed until the kernel has
// finished its exit, a moment later (longer on a busy machine; CI once
// counted one too many), while one left running stays listed for good.
size_t ThreadsOnceExitsSettle(size_t want);

// The fixtures directory, or "" when it is not there.
std::string FixturesDir();

}  // namespace recflow::testing

#endif  // RECFLOW_TESTS_TEST_UTIL_H_
