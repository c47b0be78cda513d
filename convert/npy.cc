#include <fmt/ranges.h>
#include <zip.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "convert/sources.h"
#include "records/dtype.h"
#include "records/wire_format.h"

namespace recflow::convert {
namespace {

namespace fs = std::filesystem;
using records::DType;

// --- NumPy (.npy, and .npz archives of them) ----------------------------

// One member of a .npz archive, read through libzip (stored or deflated;
// libzip inflates it and checks its CRC-32 at the end).  The archive
// stays open while any of its members is read.
class ZipMemberStream final : public ByteStream {
 public:
  ZipMemberStream(std::shared_ptr<zip_t> archive, zip_uint64_t index,
                  std::string where)
      : archive_(std::move(archive)), where_(std::move(where)) {
    file_ = zip_fopen_index(archive_.get(), index, 0);
    if (file_ == nullptr) {
      InputError(fmt::format("{}: cannot open the member: {}", where_,
                             zip_strerror(archive_.get())));
    }
  }
  ~ZipMemberStream() override { zip_fclose(file_); }
  ZipMemberStream(const ZipMemberStream&) = delete;
  ZipMemberStream& operator=(const ZipMemberStream&) = delete;

  // Through a buffer: arrays are read a row at a time, members in turn,
  // and each read of a stored member seeks the shared file (8.6x slower
  // unbuffered, docs/PERFORMANCE.md).
  size_t Read(char* dst, size_t n) override {
    size_t done = 0;
    while (done < n) {
      if (pos_ == end_ && !Refill()) break;
      const size_t k = std::min(n - done, end_ - pos_);
      std::memcpy(dst + done, buffer_.data() + pos_, k);
      pos_ += k;
      done += k;
    }
    consumed_ += done;
    return done;
  }
  uint64_t consumed() const override { return consumed_; }
  // libzip checks the CRC-32 when a read reaches the member's end.
  void Finish() override {
    char rest[4096];
    while (Read(rest, sizeof rest) > 0) {
    }
  }

 private:
  bool Refill() {
    if (buffer_.empty()) buffer_.resize(kBufferBytes);
    const zip_int64_t got = zip_fread(file_, buffer_.data(), buffer_.size());
    if (got < 0) Fail();
    pos_ = 0;
    end_ = static_cast<size_t>(got);
    return got > 0;
  }

  [[noreturn]] void Fail() {
    zip_error_t* e = zip_file_get_error(file_);
    switch (zip_error_code_zip(e)) {
      case ZIP_ER_ZLIB:
      case ZIP_ER_COMPRESSED_DATA:
        InputError(where_ + ": deflate data is corrupt");
      case ZIP_ER_CRC:
        InputError(where_ + ": CRC-32 mismatch: the member's data is damaged");
      default:
        InputError(
            fmt::format("{}: cannot read: {}", where_, zip_error_strerror(e)));
    }
  }

  static constexpr size_t kBufferBytes = size_t{256} << 10;

  std::shared_ptr<zip_t> archive_;
  std::string where_;
  zip_file_t* file_ = nullptr;
  std::vector<char> buffer_;
  size_t pos_ = 0, end_ = 0;
  uint64_t consumed_ = 0;
};

// A .npy array read row by row (rows of the first axis).
class NpyArray {
 public:
  NpyArray(std::unique_ptr<ByteStream> stream, std::string where,
           std::string feature)
      : stream_(std::move(stream)),
        where_(std::move(where)),
        feature_(std::move(feature)) {
    char magic[8];
    stream_->ReadExactly(magic, 8, where_ + ": shorter than a .npy header");
    if (std::memcmp(magic, "\x93NUMPY", 6) != 0) {
      InputError(where_ + ": not a .npy file (no \\x93NUMPY magic)");
    }
    const int major = static_cast<unsigned char>(magic[6]);
    uint32_t header_len = 0;
    unsigned char len[4] = {};
    stream_->ReadExactly(reinterpret_cast<char*>(len), major == 1 ? 2 : 4,
                         where_ + ": truncated header");
    header_len = len[0] | (len[1] << 8) |
                 (major == 1 ? 0 : (len[2] << 16) | (uint32_t{len[3]} << 24));
    if (header_len > (1u << 20)) InputError(where_ + ": implausible header");
    std::string header(header_len, '\0');
    stream_->ReadExactly(header.data(), header_len,
                         where_ + ": truncated header");
    ParseHeader(header);
  }

  uint64_t rows() const { return rows_; }
  // "FILE" or "ARCHIVE:MEMBER", and the feature its values go to.
  const std::string& where() const { return where_; }
  const std::string& feature() const { return feature_; }

  void AddRow(records::ExampleBuilder* b) {
    // In steps of at most 1 MiB, so that a header claiming huge rows
    // cannot make us allocate more than the data there is.
    for (size_t got = 0; got < row_bytes_;) {
      const size_t step = std::min<size_t>(row_bytes_ - got, size_t{1} << 20);
      if (row_.size() < got + step) row_.resize(got + step);
      stream_->ReadExactly(row_.data() + got, step,
                           fmt::format("{}: data ends before row {} of {}",
                                       where_, row_index_, rows_));
      got += step;
    }
    ++row_index_;
    const char* p = row_.data();
    if (kind_ == 'f') {
      floats_.resize(elements_);
      for (size_t i = 0; i < elements_; ++i) {
        if (item_ == 4) {
          std::memcpy(&floats_[i], p + 4 * i, 4);
        } else if (item_ == 2) {
          uint16_t h;
          std::memcpy(&h, p + 2 * i, 2);
          floats_[i] = records::HalfToFloat(h);  // exact
        } else {
          double d;
          std::memcpy(&d, p + 8 * i, 8);
          // A float_list holds float32: a float64 past its range would be
          // inf, silently.
          if (!records::FitsFloat32(d)) {
            RowError(fmt::format(
                "{}: row {}: float64 value {} is outside float32's range",
                where_, row_index_ - 1, d));
          }
          floats_[i] = static_cast<float>(d);
        }
      }
      b->AddFloatList(feature_, floats_);
    } else if (kind_ == 'i' || kind_ == 'u' || kind_ == 'b') {
      ints_.resize(elements_);
      for (size_t i = 0; i < elements_; ++i) {
        uint64_t raw = 0;
        std::memcpy(&raw, p + item_ * i, item_);
        int64_t v;
        if (kind_ == 'i' && item_ < 8) {  // sign-extend
          const int shift = 64 - 8 * static_cast<int>(item_);
          v = static_cast<int64_t>(raw << shift) >> shift;
        } else {
          v = static_cast<int64_t>(raw);
          if (kind_ == 'u' && item_ == 8 && v < 0) {
            RowError(
                fmt::format("{}: row {}: uint64 value {} does not fit "
                            "in int64",
                            where_, row_index_ - 1, raw));
          }
        }
        ints_[i] = v;
      }
      b->AddInt64List(feature_, ints_);
    } else if (kind_ == 'U') {  // fixed-width UTF-32, NUL-padded: UTF-8
      strings_.resize(elements_);
      for (size_t i = 0; i < elements_; ++i) {
        std::string& out = strings_[i];
        out.clear();
        for (size_t k = 0; k < item_; ++k) {
          uint32_t c;
          std::memcpy(&c, p + 4 * (item_ * i + k), 4);
          if (c == 0) break;
          if (c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) {
            RowError(
                fmt::format("{}: row {}: {:#x} is not a Unicode code point",
                            where_, row_index_ - 1, c));
          }
          records::wire::AppendUtf8(c, &out);
        }
      }
      b->AddBytesList(feature_, strings_);
    } else {  // 'S': fixed-width byte strings, NUL-padded
      strings_.resize(elements_);
      for (size_t i = 0; i < elements_; ++i) {
        std::string_view s(p + item_ * i, item_);
        strings_[i] = std::string(s.substr(0, s.find('\0')));
      }
      b->AddBytesList(feature_, strings_);
    }
  }

  uint64_t consumed() const { return stream_->consumed(); }
  // After the last row: nothing may follow what the header counts (it
  // would be left out unseen: a second array saved into the same file, or
  // a header that lies; numpy.load ignores it), and a member's CRC-32 is
  // checked.
  void Finish() {
    char c;
    if (stream_->Read(&c, 1) != 0) {
      InputError(
          fmt::format("{}: more data after the {} rows its header "
                      "counts",
                      where_, rows_));
    }
    stream_->Finish();
  }

 private:
  void ParseHeader(const std::string& h) {
    // {'descr': '<f4', 'fortran_order': False, 'shape': (60000, 28, 28), }
    auto value_of = [&](const std::string& key) {
      const size_t k = h.find("'" + key + "'");
      if (k == std::string::npos) {
        InputError(fmt::format("{}: header has no '{}'", where_, key));
      }
      size_t v = h.find(':', k);
      if (v == std::string::npos) InputError(where_ + ": malformed header");
      return h.substr(v + 1);
    };
    std::string descr = value_of("descr");
    const size_t q1 = descr.find_first_not_of(' ');
    const size_t q2 = descr.find('\'', q1 + 1);
    if (q1 == std::string::npos || descr[q1] != '\'' ||
        q2 == std::string::npos) {
      InputError(where_ +
                 ": header's descr is not a simple dtype (record "
                 "arrays are not supported)");
    }
    descr = descr.substr(q1 + 1, q2 - q1 - 1);
    if (descr.size() >= 2 && descr[1] == 'O') {
      InputError(fmt::format(
          "{}: dtype '{}': an object array (pickled Python objects) cannot "
          "be read; save numbers or fixed-width strings (arr.astype('S') or "
          "'U')",
          where_, descr));
    }
    if (descr.size() < 3 ||
        (descr[0] != '<' && descr[0] != '|' && descr[0] != '=')) {
      InputError(
          fmt::format("{}: dtype '{}': only little-endian arrays are "
                      "supported (use arr.astype(arr.dtype."
                      "newbyteorder('<')))",
                      where_, descr));
    }
    kind_ = descr[1];
    item_ = std::strtoul(descr.c_str() + 2, nullptr, 10);
    const bool ok =
        (kind_ == 'f' && (item_ == 2 || item_ == 4 || item_ == 8)) ||
        ((kind_ == 'i' || kind_ == 'u') &&
         (item_ == 1 || item_ == 2 || item_ == 4 || item_ == 8)) ||
        (kind_ == 'b' && item_ == 1) ||
        ((kind_ == 'S' || kind_ == 'U') && item_ >= 1);
    if (!ok) {
      InputError(
          fmt::format("{}: dtype '{}' is not supported (floats, "
                      "integers, bool and fixed-width byte or Unicode "
                      "strings are)",
                      where_, descr));
    }
    // 'U' counts characters of 4 bytes each; every other kind, bytes.
    const size_t item_bytes = kind_ == 'U' ? 4 * item_ : item_;
    if (value_of("fortran_order").find("True") <
        value_of("fortran_order").find(',')) {
      InputError(where_ +
                 ": Fortran-ordered arrays are not supported "
                 "(save np.ascontiguousarray(arr))");
    }
    const std::string shape = value_of("shape");
    const size_t open = shape.find('('), close = shape.find(')');
    if (open == std::string::npos || close == std::string::npos) {
      InputError(where_ + ": malformed shape");
    }
    std::vector<uint64_t> dims;
    const std::string inner = shape.substr(open + 1, close - open - 1);
    size_t at = 0;
    while (at < inner.size()) {
      while (at < inner.size() && (inner[at] == ' ' || inner[at] == ',')) ++at;
      if (at >= inner.size()) break;
      char* end;
      dims.push_back(std::strtoull(inner.c_str() + at, &end, 10));
      at = static_cast<size_t>(end - inner.c_str());
      if (end == inner.c_str() + at && at < inner.size() &&
          !std::isdigit(static_cast<unsigned char>(inner[at])) &&
          inner[at] != ',' && inner[at] != ' ') {
        InputError(where_ + ": malformed shape " + shape);
      }
    }
    if (dims.empty()) {
      InputError(where_ + ": a 0-d array has no rows to convert");
    }
    rows_ = dims[0];
    // A row becomes one tf.train.Example, which protobuf caps at 2 GiB:
    // a larger row (or a product that overflows) is a damaged header, not
    // an allocation to attempt.
    constexpr uint64_t kMaxRowBytes = uint64_t{1} << 31;
    uint64_t elements = 1, bytes = 0;
    bool overflow = false;
    for (size_t i = 1; i < dims.size(); ++i) {
      overflow |= __builtin_mul_overflow(elements, dims[i], &elements);
    }
    overflow |= __builtin_mul_overflow(elements, item_bytes, &bytes);
    if (overflow || bytes > kMaxRowBytes) {
      InputError(
          fmt::format("{}: shape {} makes rows of more than {} bytes, "
                      "more than a tf.train.Example can hold",
                      where_, shape, kMaxRowBytes));
    }
    elements_ = static_cast<size_t>(elements);
    row_bytes_ = static_cast<size_t>(bytes);
  }

  std::unique_ptr<ByteStream> stream_;
  std::string where_;
  std::string feature_;
  char kind_ = 0;
  size_t item_ = 0;
  uint64_t rows_ = 0;
  size_t elements_ = 0;
  size_t row_bytes_ = 0;
  uint64_t row_index_ = 0;
  std::string row_;
  std::vector<float> floats_;
  std::vector<int64_t> ints_;
  std::vector<std::string> strings_;
};
std::string Stem(const std::string& path) {
  return fs::path(path).stem().string();
}

// Arrays side by side: row i of every array makes Example i.
class ArraysSource final : public BuildingSource {
 public:
  explicit ArraysSource(std::vector<std::unique_ptr<NpyArray>> arrays,
                        uint64_t total_bytes, const std::string& what)
      : arrays_(std::move(arrays)), total_bytes_(total_bytes), what_(what) {
    if (arrays_.empty()) InputError(what + ": no arrays");
    // One feature per array: a second array of one name (x.npy from two
    // folders, or a member an archive holds twice) would hide the first.
    std::map<std::string_view, const NpyArray*> named;
    for (const auto& a : arrays_) {
      const auto [at, added] = named.emplace(a->feature(), a.get());
      if (!added) {
        InputError(fmt::format(
            "{} and {} both name feature '{}'{}; feature names must differ",
            at->second->where(), a->where(), a->feature(),
            at->second->where() == a->where() ? " (the archive holds it twice)"
                                              : ""));
      }
    }
    rows_ = arrays_[0]->rows();
    for (const auto& a : arrays_) {
      if (a->rows() != rows_) {
        InputError(
            fmt::format("{}: arrays have different lengths along the "
                        "first axis ({} and {})",
                        what, rows_, a->rows()));
      }
    }
  }
  bool Next(records::ExampleBuilder* b) override {
    if (row_ == rows_) {
      if (!finished_) {
        finished_ = true;
        for (auto& a : arrays_) a->Finish();
      }
      return false;
    }
    ++row_;
    for (auto& a : arrays_) a->AddRow(b);
    return true;
  }
  std::string RowName() const override {
    return fmt::format("{}: row {}", what_, row_ - 1);
  }
  std::optional<uint64_t> rows() const override { return rows_; }
  uint64_t bytes_read() const override {
    uint64_t n = 0;
    for (const auto& a : arrays_) n += a->consumed();
    return n;
  }
  uint64_t total_bytes() const override { return total_bytes_; }

 private:
  std::vector<std::unique_ptr<NpyArray>> arrays_;
  uint64_t total_bytes_;
  std::string what_;  // the archive, or the .npy files
  uint64_t rows_ = 0;
  uint64_t row_ = 0;
  bool finished_ = false;
};

}  // namespace

// The .npy members of a zip archive (numpy.savez / savez_compressed), in
// the archive's order; other members are ignored.
std::unique_ptr<ExampleSource> OpenNpz(const std::string& path) {
  int code = 0;
  zip_t* z = zip_open(path.c_str(), ZIP_RDONLY, &code);
  if (z == nullptr) {
    if (code == ZIP_ER_NOZIP) InputError(path + ": not a zip archive (.npz)");
    zip_error_t e;
    zip_error_init_with_code(&e, code);
    const std::string what = zip_error_strerror(&e);
    zip_error_fini(&e);
    if (code == ZIP_ER_OPEN || code == ZIP_ER_READ || code == ZIP_ER_NOENT) {
      InputError(fmt::format("{}: cannot open: {}", path, what));
    }
    InputError(fmt::format("{}: broken zip archive: {}", path, what));
  }
  std::shared_ptr<zip_t> archive(z, zip_discard);
  const zip_int64_t entries = zip_get_num_entries(z, 0);
  std::vector<std::unique_ptr<NpyArray>> arrays;
  uint64_t bytes = 0;
  for (zip_int64_t i = 0; i < entries; ++i) {
    zip_stat_t st;
    zip_stat_init(&st);
    if (zip_stat_index(z, static_cast<zip_uint64_t>(i), 0, &st) != 0 ||
        (st.valid & ZIP_STAT_NAME) == 0) {
      InputError(fmt::format("{}: broken zip directory entry {}: {}", path, i,
                             zip_strerror(z)));
    }
    const std::string name = st.name;
    if (name.size() < 4 || name.substr(name.size() - 4) != ".npy") continue;
    if ((st.valid & ZIP_STAT_COMP_METHOD) != 0 &&
        st.comp_method != ZIP_CM_STORE && st.comp_method != ZIP_CM_DEFLATE) {
      InputError(
          fmt::format("{}: member {}: compression method {} (only "
                      "stored and deflated are used by numpy)",
                      path, name, st.comp_method));
    }
    if ((st.valid & ZIP_STAT_SIZE) != 0) bytes += st.size;
    const std::string where = fmt::format("{}: member {}", path, name);
    arrays.push_back(std::make_unique<NpyArray>(
        std::make_unique<ZipMemberStream>(archive, static_cast<zip_uint64_t>(i),
                                          where),
        path + ":" + name, name.substr(0, name.size() - 4)));
  }
  if (arrays.empty()) InputError(path + ": no .npy members");
  // Progress counts the members' bytes as numpy wrote them (inflated).
  return std::make_unique<ArraysSource>(std::move(arrays), bytes, path);
}

std::unique_ptr<ExampleSource> OpenNpy(const std::vector<std::string>& files) {
  std::vector<std::unique_ptr<NpyArray>> arrays;
  uint64_t bytes = 0;
  for (const auto& f : files) {
    bytes += FileSize(f);
    arrays.push_back(std::make_unique<NpyArray>(std::make_unique<FileStream>(f),
                                                f, Stem(f)));
  }
  return std::make_unique<ArraysSource>(
      std::move(arrays), bytes, fmt::format("{}", fmt::join(files, ", ")));
}

}  // namespace recflow::convert
