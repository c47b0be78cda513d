#include "test_util.h"

#include <sys/resource.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "records/crc32c.h"
#include "records/tfrecord_format.h"

namespace recflow::testing {

TempDir::TempDir() {
  std::string templ =
      (std::filesystem::temp_directory_path() / "recflow-test-XXXXXX").string();
  if (mkdtemp(templ.data()) == nullptr) {
    throw std::runtime_error("mkdtemp failed");
  }
  path_ = templ;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::vector<std::string> TempDir::List() const {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(path_)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string WithStateCrc(std::string_view state) {
  std::string out(state.substr(0, state.size() < 4 ? 0 : state.size() - 4));
  const uint32_t crc =
      records::crc32c::Mask(records::crc32c::Value(out.data(), out.size()));
  char bytes[4];
  records::EncodeLittleEndian<uint32_t>(bytes, crc);
  out.append(bytes, 4);
  return out;
}

std::string ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFileBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

uint32_t ReferenceCrc32c(const std::string& data) {
  uint32_t crc = 0xffffffffu;
  for (unsigned char byte : data) {
    crc ^= byte;
    for (int i = 0; i < 8; ++i) {
      crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
    }
  }
  return ~crc;
}

uint32_t ReferenceMask(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

namespace {
std::string Le(uint64_t v, int bytes) {
  std::string s;
  for (int i = 0; i < bytes; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
  return s;
}
uint64_t FromLe(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) {
    v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  }
  return v;
}
}  // namespace

std::string ReferenceFrame(const std::string& payload) {
  const std::string len = Le(payload.size(), 8);
  return len + Le(ReferenceMask(ReferenceCrc32c(len)), 4) + payload +
         Le(ReferenceMask(ReferenceCrc32c(payload)), 4);
}

bool ReferenceDecode(const std::string& stream,
                     std::vector<std::string>* payloads) {
  size_t at = 0;
  while (at < stream.size()) {
    if (stream.size() - at < 12) return false;
    const uint64_t len = FromLe(stream, at, 8);
    if (FromLe(stream, at + 8, 4) !=
        ReferenceMask(ReferenceCrc32c(stream.substr(at, 8)))) {
      return false;
    }
    if (len > stream.size() - at - 12 || stream.size() - at - 12 - len < 4) {
      return false;
    }
    std::string payload = stream.substr(at + 12, len);
    if (FromLe(stream, at + 12 + len, 4) !=
        ReferenceMask(ReferenceCrc32c(payload))) {
      return false;
    }
    payloads->push_back(std::move(payload));
    at += 16 + len;
  }
  return true;
}

std::vector<std::string> RandomPayloads(size_t n, size_t max_size,
                                        uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> out(n);
  for (auto& p : out) {
    p.resize(rng() % (max_size + 1));
    for (auto& c : p)
      c = static_cast<char>(rng() % 7 == 0 ? rng() : 'a' + rng() % 4);
  }
  return out;
}

void WriteRecords(const std::string& path,
                  const std::vector<std::string>& records,
                  records::WriterOptions options) {
  records::TFRecordWriter writer(path, options);
  for (const auto& r : records) writer.Write(r);
  writer.Close();
}

void WriteRecords(const std::string& path,
                  const std::vector<std::string>& records,
                  records::Compression compression) {
  records::WriterOptions options;
  options.compression = compression;
  WriteRecords(path, records, options);
}

std::vector<std::string> ReadRecords(const std::string& path,
                                     records::ReaderOptions options) {
  records::TFRecordReader reader(path, options);
  std::vector<std::string> out;
  std::string_view r;
  while (reader.ReadRecord(&r)) out.emplace_back(r);
  return out;
}

std::string FixturesDir() {
  const std::string dir = RECFLOW_FIXTURES_DIR;
  return std::filesystem::is_directory(dir) ? dir : "";
}

std::string NpyBytes(const std::string& descr, const std::string& shape,
                     const std::string& data) {
  return NpyBytesWithDescr("'" + descr + "'", shape, data);
}

std::string NpyBytesWithDescr(const std::string& descr,
                              const std::string& shape,
                              const std::string& data) {
  std::string header = "{'descr': " + descr +
                       ", 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(1);
  out.push_back(0);
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  return out + header + data;
}

std::string Zip(const std::vector<std::pair<std::string, std::string>>& files,
                bool compress) {
  auto le16 = [](std::string& s, uint32_t v) {
    s.push_back(static_cast<char>(v));
    s.push_back(static_cast<char>(v >> 8));
  };
  auto le32 = [&](std::string& s, uint32_t v) {
    le16(s, v & 0xffff);
    le16(s, v >> 16);
  };
  std::string out, dir;
  for (const auto& [name, data] : files) {
    std::string body = data;
    if (compress) {
      z_stream z{};
      deflateInit2(&z, 6, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
      body.resize(deflateBound(&z, data.size()));
      z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
      z.avail_in = static_cast<uInt>(data.size());
      z.next_out = reinterpret_cast<Bytef*>(body.data());
      z.avail_out = static_cast<uInt>(body.size());
      deflate(&z, Z_FINISH);
      body.resize(z.total_out);
      deflateEnd(&z);
    }
    const uint32_t crc = static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(data.data()),
              static_cast<uInt>(data.size())));
    const uint32_t offset = static_cast<uint32_t>(out.size());
    le32(out, 0x04034b50);
    le16(out, 20);
    le16(out, 0);
    le16(out, compress ? 8 : 0);
    le32(out, 0);
    le32(out, crc);
    le32(out, static_cast<uint32_t>(body.size()));
    le32(out, static_cast<uint32_t>(data.size()));
    le16(out, static_cast<uint32_t>(name.size()));
    le16(out, 0);
    out += name + body;
    le32(dir, 0x02014b50);
    le16(dir, 20);
    le16(dir, 20);
    le16(dir, 0);
    le16(dir, compress ? 8 : 0);
    le32(dir, 0);
    le32(dir, crc);
    le32(dir, static_cast<uint32_t>(body.size()));
    le32(dir, static_cast<uint32_t>(data.size()));
    le16(dir, static_cast<uint32_t>(name.size()));
    le16(dir, 0);
    le16(dir, 0);
    le16(dir, 0);
    le16(dir, 0);
    le32(dir, 0);
    le32(dir, offset);
    dir += name;
  }
  const uint32_t dir_offset = static_cast<uint32_t>(out.size());
  out += dir;
  le32(out, 0x06054b50);
  le16(out, 0);
  le16(out, 0);
  le16(out, static_cast<uint32_t>(files.size()));
  le16(out, static_cast<uint32_t>(files.size()));
  le32(out, static_cast<uint32_t>(dir.size()));
  le32(out, dir_offset);
  le16(out, 0);
  return out;
}

std::string Compressed(const std::string& data,
                       records::Compression compression) {
  switch (compression) {
    case records::Compression::kNone:
      return data;
    case records::Compression::kZstd: {
      std::string out(ZSTD_compressBound(data.size()), '\0');
      const size_t n =
          ZSTD_compress(out.data(), out.size(), data.data(), data.size(), 3);
      if (ZSTD_isError(n)) throw std::runtime_error(ZSTD_getErrorName(n));
      out.resize(n);
      return out;
    }
    case records::Compression::kZlib:
    case records::Compression::kGzip: {
      z_stream z{};
      // 15: a zlib header; 15 + 16: a gzip one.
      const int bits =
          compression == records::Compression::kGzip ? 15 + 16 : 15;
      deflateInit2(&z, 6, Z_DEFLATED, bits, 8, Z_DEFAULT_STRATEGY);
      std::string out(deflateBound(&z, data.size()) + 32, '\0');
      z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
      z.avail_in = static_cast<uInt>(data.size());
      z.next_out = reinterpret_cast<Bytef*>(out.data());
      z.avail_out = static_cast<uInt>(out.size());
      const int rc = deflate(&z, Z_FINISH);
      out.resize(z.total_out);
      deflateEnd(&z);
      if (rc != Z_STREAM_END) throw std::runtime_error("deflate did not end");
      return out;
    }
  }
  return data;
}

std::string Be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16),
          static_cast<char>(v >> 8), static_cast<char>(v)};
}

std::string TinyPng() {
  return std::string("\x89PNG\r\n\x1a\n", 8) + Be32(13) + "IHDR" + Be32(4) +
         Be32(3) + std::string("\x08\x02\0\0\0", 5) + "rest";
}

std::string TinyJpeg() {
  return std::string("\xff\xd8\xff\xe0\x00\x04\x00\x00", 8) +
         std::string("\xff\xc0\x00\x11\x08\x00\x05\x00\x07", 9) + "scan";
}

bool AddressSpaceCanBeCapped() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  return false;
#endif
#endif
  return true;
}

bool CapAddressSpace(uint64_t bytes) {
  if (!AddressSpaceCanBeCapped()) return false;
  const rlimit limit{bytes, bytes};
  return setrlimit(RLIMIT_AS, &limit) == 0;
}

size_t ThreadsNow() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& t :
       std::filesystem::directory_iterator("/proc/self/task")) {
    ++n;
  }
  return n;
}

size_t ThreadsOnceExitsSettle(size_t want) {
  size_t threads = ThreadsNow();
  for (int i = 0; i < 500 && threads > want; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    threads = ThreadsNow();
  }
  return threads;
}

}  // namespace recflow::testing
