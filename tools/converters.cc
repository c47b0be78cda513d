#include "tools/converters.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "records/csv_reader.h"
#include "records/wire_format.h"

namespace recflow::tools {
namespace {

namespace fs = std::filesystem;
using records::DType;
using records::ExampleBuilder;

[[noreturn]] void InputError(const std::string& what) {
  throw ConvertError(what, /*row_level=*/false);
}
[[noreturn]] void RowError(const std::string& what) {
  throw ConvertError(what, /*row_level=*/true);
}

uint64_t FileSize(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    InputError(fmt::format("{}: cannot stat: {}", path, std::strerror(errno)));
  }
  return static_cast<uint64_t>(st.st_size);
}

// A FILE* that closes itself.
struct File {
  explicit File(const std::string& path) : path(path) {
    f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) {
      InputError(
          fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
    }
  }
  ~File() {
    if (f) std::fclose(f);
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  std::string path;
  FILE* f = nullptr;
};

// A source that builds each Example while reading it (arrays, IDX,
// images: the work is in the reading).
class BuildingSource : public ExampleSource {
 public:
  bool NextRow(Row* row) final {
    builder_.Clear();
    row->built = true;
    row->error.clear();
    try {
      if (!Next(&builder_)) return false;
      row->example.assign(builder_.Serialize());
    } catch (const ConvertError& e) {
      if (!e.row_level()) throw;
      row->error = e.what();
    }
    return true;
  }

 protected:
  // Writes the next row into `b`; false at the end.  Throws ConvertError.
  virtual bool Next(ExampleBuilder* b) = 0;

 private:
  ExampleBuilder builder_;
};

// --- Typed cells (CSV and JSON Lines) -----------------------------------

// What a column or key holds, widened as rows are seen: int64 -> float;
// anything with text -> bytes.
enum class CellType { kNone, kInt64, kFloat, kBytes };

CellType InferCell(std::string_view s) {
  int64_t i;
  float f;
  if (records::ParseInt64Cell(s, &i)) return CellType::kInt64;
  if (records::ParseFloatCell(s, &f)) return CellType::kFloat;
  return CellType::kBytes;
}

CellType Widen(CellType a, CellType b) {
  return static_cast<CellType>(
      std::max(static_cast<int>(a), static_cast<int>(b)));
}

CellType FromSpec(const records::FeatureSpec* spec, const std::string& name,
                  CellType inferred) {
  const records::FeatureConfig* c = spec ? spec->Find(name) : nullptr;
  if (c == nullptr) return inferred;
  switch (c->dtype) {
    case DType::kInt64:
      return CellType::kInt64;
    case DType::kFloat32:
      return CellType::kFloat;
    case DType::kBytes:
      return CellType::kBytes;
  }
  return inferred;
}

// --- CSV (RFC 4180) -----------------------------------------------------

// records::CsvReader, its errors as ConvertErrors.
class CsvReader {
 public:
  explicit CsvReader(const std::string& path) {
    try {
      reader_ = std::make_unique<records::CsvReader>(path);
    } catch (const records::CsvError& e) {
      InputError(e.what());
    }
  }
  bool ReadRecord(std::vector<std::string>* fields, uint64_t* line) {
    try {
      return reader_->ReadRecord(fields, line);
    } catch (const records::CsvError& e) {
      throw ConvertError(e.what(), e.row_level());
    }
  }
  uint64_t position() const { return reader_->position(); }
  const std::string& path() const { return reader_->path(); }

 private:
  std::unique_ptr<records::CsvReader> reader_;
};

class CsvSource final : public ExampleSource {
 public:
  CsvSource(std::vector<std::string> files, const records::FeatureSpec* spec)
      : files_(std::move(files)) {
    for (const auto& f : files_) total_bytes_ += FileSize(f);
    // First pass: header, column types, and the row count.
    for (const auto& path : files_) {
      CsvReader reader(path);
      std::vector<std::string> fields;
      uint64_t line;
      if (!reader.ReadRecord(&fields, &line)) {
        InputError(
            fmt::format("{}: empty; a CSV file starts with a header "
                        "row",
                        path));
      }
      if (header_.empty()) {
        header_ = fields;
        for (const auto& name : header_) {
          if (name.empty() || !records::wire::IsValidUtf8(name)) {
            InputError(
                fmt::format("{}:1: header names must be non-empty "
                            "UTF-8",
                            path));
          }
        }
        types_.assign(header_.size(), CellType::kNone);
      } else if (fields != header_) {
        InputError(
            fmt::format("{}:1: header differs from {}'s", path, files_[0]));
      }
      while (true) {
        try {
          if (!reader.ReadRecord(&fields, &line)) break;
        } catch (const ConvertError& e) {
          if (!e.row_level()) throw;
          ++rows_;
          continue;
        }
        ++rows_;
        for (size_t i = 0; i < fields.size() && i < types_.size(); ++i) {
          if (!fields[i].empty()) {
            types_[i] = Widen(types_[i], InferCell(fields[i]));
          }
        }
      }
    }
    for (size_t i = 0; i < header_.size(); ++i) {
      types_[i] = FromSpec(spec, header_[i], types_[i]);
    }
    Open(0);
  }

  bool NextRow(Row* row) override {
    row->built = false;
    row->error.clear();
    while (true) {
      if (reader_ == nullptr) return false;
      try {
        if (reader_->ReadRecord(&row->fields, &row->line)) break;
      } catch (const ConvertError& e) {
        if (!e.row_level()) throw;
        row->error = e.what();
        break;
      }
      bytes_done_ += FileSize(reader_->path());
      Open(file_index_ + 1);
    }
    row->path = reader_->path();
    return true;
  }

  void Build(const Row& row, ExampleBuilder* b) const override {
    const std::vector<std::string>& fields = row.fields;
    const uint64_t line = row.line;
    if (fields.size() != header_.size()) {
      RowError(fmt::format("{}:{}: {} fields, the header has {}", row.path,
                           line, fields.size(), header_.size()));
    }
    for (size_t i = 0; i < fields.size(); ++i) {
      const std::string& cell = fields[i];
      if (cell.empty()) continue;  // absent in this record
      switch (types_[i]) {
        case CellType::kInt64: {
          int64_t v;
          if (!records::ParseInt64Cell(cell, &v)) {
            RowError(
                fmt::format("{}:{}: column '{}': expected an integer, "
                            "found \"{}\"",
                            row.path, line, header_[i], cell));
          }
          b->AddInt64(header_[i], v);
          break;
        }
        case CellType::kFloat: {
          float v;
          if (!records::ParseFloatCell(cell, &v)) {
            RowError(
                fmt::format("{}:{}: column '{}': expected a number, "
                            "found \"{}\"",
                            row.path, line, header_[i], cell));
          }
          b->AddFloat(header_[i], v);
          break;
        }
        default:
          b->AddBytes(header_[i], cell);
          break;
      }
    }
  }

  std::optional<uint64_t> rows() const override { return rows_; }
  uint64_t bytes_read() const override {
    return bytes_done_ + (reader_ ? reader_->position() : 0);
  }
  uint64_t total_bytes() const override { return total_bytes_; }

 private:
  void Open(size_t index) {
    file_index_ = index;
    reader_.reset();
    if (index >= files_.size()) return;
    reader_ = std::make_unique<CsvReader>(files_[index]);
    std::vector<std::string> header;
    uint64_t line;
    reader_->ReadRecord(&header, &line);
  }

  std::vector<std::string> files_;
  std::vector<std::string> header_;
  std::vector<CellType> types_;
  std::unique_ptr<CsvReader> reader_;
  size_t file_index_ = 0;
  uint64_t rows_ = 0;
  uint64_t total_bytes_ = 0;
  uint64_t bytes_done_ = 0;
};

// --- JSON Lines ---------------------------------------------------------

CellType JsonType(const nlohmann::json& v) {
  if (v.is_number_integer()) return CellType::kInt64;
  if (v.is_boolean()) return CellType::kInt64;
  if (v.is_number()) return CellType::kFloat;
  if (v.is_string()) return CellType::kBytes;
  return CellType::kNone;
}

class JsonlSource final : public ExampleSource {
 public:
  JsonlSource(std::vector<std::string> files, const records::FeatureSpec* spec)
      : files_(std::move(files)) {
    for (const auto& f : files_) total_bytes_ += FileSize(f);
    // First pass: the type of every key (numbers widen int64 -> float;
    // strings and numbers under one key are an error in the rows that
    // disagree with the first seen) and the row count.
    for (const auto& path : files_) {
      File file(path);
      std::string line;
      while (ReadLine(file.f, &line)) {
        if (IsBlank(line)) continue;
        ++rows_;
        nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
        if (!row.is_object()) continue;  // reported in the second pass
        for (const auto& [key, value] : row.items()) {
          CellType t = CellType::kNone;
          if (value.is_array()) {
            for (const auto& e : value) t = Widen(t, JsonType(e));
          } else {
            t = JsonType(value);
          }
          CellType& known = types_[key];
          if (known == CellType::kNone ||
              (known != CellType::kBytes && t != CellType::kBytes)) {
            known = Widen(known, t);
          }
        }
      }
    }
    for (auto& [key, type] : types_) type = FromSpec(spec, key, type);
    Open(0);
  }

  bool NextRow(Row* r) override {
    r->built = false;
    r->error.clear();
    while (true) {
      if (file_ == nullptr) return false;
      if (ReadLine(file_->f, &r->text)) {
        ++line_number_;
        if (!IsBlank(r->text)) break;
        continue;
      }
      bytes_done_ += FileSize(file_->path);
      Open(file_index_ + 1);
    }
    r->path = file_->path;
    r->line = line_number_;
    return true;
  }

  void Build(const Row& r, ExampleBuilder* b) const override {
    const nlohmann::json row = nlohmann::json::parse(r.text, nullptr, false);
    if (row.is_discarded() || !row.is_object()) {
      RowError(fmt::format("{}:{}: expected one JSON object per line", r.path,
                           r.line));
    }
    std::vector<int64_t> ints;
    std::vector<float> floats;
    std::vector<std::string> strings;
    for (const auto& [key, value] : row.items()) {
      if (value.is_null()) continue;  // absent
      const auto known = types_.find(key);
      const CellType type =
          known == types_.end() ? CellType::kNone : known->second;
      const nlohmann::json values =
          value.is_array() ? value : nlohmann::json::array({value});
      if (!records::wire::IsValidUtf8(key)) {
        RowError(fmt::format("{}:{}: key is not UTF-8", r.path, r.line));
      }
      try {
        switch (type) {
          case CellType::kInt64: {
            ints.clear();
            for (const auto& e : values) {
              if (!e.is_number_integer() && !e.is_boolean()) throw 0;
              ints.push_back(e.is_boolean() ? e.get<bool>() : e.get<int64_t>());
            }
            b->AddInt64List(key, ints);
            break;
          }
          case CellType::kFloat: {
            floats.clear();
            for (const auto& e : values) {
              if (!e.is_number() && !e.is_boolean()) throw 0;
              floats.push_back(e.is_boolean() ? e.get<bool>() : e.get<float>());
            }
            b->AddFloatList(key, floats);
            break;
          }
          case CellType::kBytes: {
            strings.clear();
            for (const auto& e : values) {
              if (!e.is_string()) throw 0;
              strings.push_back(e.get<std::string>());
            }
            b->AddBytesList(key, strings);
            break;
          }
          case CellType::kNone:
            if (!values.empty()) throw 0;
            break;
        }
      } catch (int) {
        RowError(fmt::format(
            "{}:{}: key '{}': expected {} values (numbers, strings, or "
            "lists of one of them), found {}",
            r.path, r.line, key,
            type == CellType::kBytes   ? "string"
            : type == CellType::kFloat ? "numeric"
            : type == CellType::kInt64 ? "integer"
                                       : "no",
            value.dump().substr(0, 80)));
      }
    }
  }

  std::optional<uint64_t> rows() const override { return rows_; }
  uint64_t bytes_read() const override {
    return bytes_done_ +
           (file_ ? static_cast<uint64_t>(std::ftell(file_->f)) : 0);
  }
  uint64_t total_bytes() const override { return total_bytes_; }

 private:
  static bool ReadLine(FILE* f, std::string* line) {
    line->clear();
    int c;
    while ((c = getc_unlocked(f)) != EOF && c != '\n') {
      line->push_back(static_cast<char>(c));
    }
    return c != EOF || !line->empty();
  }
  static bool IsBlank(const std::string& s) {
    return s.find_first_not_of(" \t\r") == std::string::npos;
  }
  void Open(size_t index) {
    file_index_ = index;
    file_.reset();
    line_number_ = 0;
    if (index < files_.size()) file_ = std::make_unique<File>(files_[index]);
  }

  std::vector<std::string> files_;
  std::map<std::string, CellType> types_;
  std::unique_ptr<File> file_;
  size_t file_index_ = 0;
  uint64_t line_number_ = 0;
  uint64_t rows_ = 0;
  uint64_t total_bytes_ = 0;
  uint64_t bytes_done_ = 0;
};

// --- NumPy (.npy, and .npz archives of them) ----------------------------

// A sequential byte stream: a file, or a member of a zip archive.
class ByteStream {
 public:
  virtual ~ByteStream() = default;
  virtual size_t Read(char* dst, size_t n) = 0;
  virtual uint64_t consumed() const = 0;  // input bytes read so far
  // Reads exactly n bytes or throws naming `what`.
  void ReadExactly(char* dst, size_t n, const std::string& what) {
    if (Read(dst, n) != n) InputError(what);
  }
};

class FileStream final : public ByteStream {
 public:
  explicit FileStream(const std::string& path) : file_(path) {}
  size_t Read(char* dst, size_t n) override {
    const size_t got = std::fread(dst, 1, n, file_.f);
    consumed_ += got;
    return got;
  }
  uint64_t consumed() const override { return consumed_; }

 private:
  File file_;
  uint64_t consumed_ = 0;
};

// One member of a zip archive: stored, or deflated (raw deflate).
class ZipMemberStream final : public ByteStream {
 public:
  ZipMemberStream(const std::string& path, uint64_t offset, uint64_t size,
                  bool deflated, const std::string& name)
      : file_(path), left_(size), deflated_(deflated), name_(name) {
    if (std::fseek(file_.f, static_cast<long>(offset), SEEK_SET) != 0) {
      InputError(
          fmt::format("{}: member {}: cannot seek to its data", path, name));
    }
    if (deflated_) {
      std::memset(&z_, 0, sizeof z_);
      inflateInit2(&z_, -MAX_WBITS);
    }
  }
  ~ZipMemberStream() override {
    if (deflated_) inflateEnd(&z_);
  }

  size_t Read(char* dst, size_t n) override {
    if (!deflated_) {
      const size_t got = std::fread(
          dst, 1, static_cast<size_t>(std::min<uint64_t>(n, left_)), file_.f);
      left_ -= got;
      consumed_ += got;
      return got;
    }
    size_t done = 0;
    while (done < n && !ended_) {
      if (z_.avail_in == 0 && left_ > 0) {
        const size_t got = std::fread(
            in_, 1, static_cast<size_t>(std::min<uint64_t>(sizeof in_, left_)),
            file_.f);
        if (got == 0) break;
        left_ -= got;
        consumed_ += got;
        z_.next_in = reinterpret_cast<Bytef*>(in_);
        z_.avail_in = static_cast<uInt>(got);
      }
      z_.next_out = reinterpret_cast<Bytef*>(dst + done);
      z_.avail_out = static_cast<uInt>(n - done);
      const int rc = inflate(&z_, Z_NO_FLUSH);
      done = n - z_.avail_out;
      if (rc == Z_STREAM_END) {
        ended_ = true;
      } else if (rc != Z_OK &&
                 !(rc == Z_BUF_ERROR && z_.avail_in == 0 && left_ > 0)) {
        InputError(fmt::format("{}: member {}: deflate data is corrupt",
                               file_.path, name_));
      }
    }
    return done;
  }
  uint64_t consumed() const override { return consumed_; }

 private:
  File file_;
  uint64_t left_;
  bool deflated_;
  std::string name_;
  z_stream z_;
  char in_[1 << 16];
  bool ended_ = false;
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

  void AddRow(ExampleBuilder* b) {
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
        } else {
          double d;
          std::memcpy(&d, p + 8 * i, 8);
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
    const size_t q1 = descr.find('\'');
    const size_t q2 = descr.find('\'', q1 + 1);
    if (q1 == std::string::npos || q2 == std::string::npos) {
      InputError(where_ +
                 ": header's descr is not a simple dtype (record "
                 "arrays are not supported)");
    }
    descr = descr.substr(q1 + 1, q2 - q1 - 1);
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
    const bool ok = (kind_ == 'f' && (item_ == 4 || item_ == 8)) ||
                    ((kind_ == 'i' || kind_ == 'u') &&
                     (item_ == 1 || item_ == 2 || item_ == 4 || item_ == 8)) ||
                    (kind_ == 'b' && item_ == 1) ||
                    (kind_ == 'S' && item_ >= 1);
    if (!ok) {
      InputError(
          fmt::format("{}: dtype '{}' is not supported (floats, "
                      "integers, bool and fixed-width byte strings "
                      "are)",
                      where_, descr));
    }
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
    overflow |= __builtin_mul_overflow(elements, item_, &bytes);
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
      : arrays_(std::move(arrays)), total_bytes_(total_bytes) {
    if (arrays_.empty()) InputError(what + ": no arrays");
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
  bool Next(ExampleBuilder* b) override {
    if (row_ == rows_) return false;
    ++row_;
    for (auto& a : arrays_) a->AddRow(b);
    return true;
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
  uint64_t rows_ = 0;
  uint64_t row_ = 0;
};

uint32_t Le32(const unsigned char* p) {
  return p[0] | (p[1] << 8) | (p[2] << 16) | (uint32_t{p[3]} << 24);
}
uint16_t Le16(const unsigned char* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
uint64_t Le64(const unsigned char* p) {
  return Le32(p) | (uint64_t{Le32(p + 4)} << 32);
}

// The .npy members of a zip archive (numpy.savez / savez_compressed).
std::vector<std::unique_ptr<NpyArray>> OpenNpz(const std::string& path) {
  File file(path);
  const uint64_t size = FileSize(path);
  // The end-of-central-directory record is in the last 64 KiB + 22 bytes.
  const uint64_t tail_size = std::min<uint64_t>(size, 65557);
  std::vector<unsigned char> tail(tail_size);
  std::fseek(file.f, static_cast<long>(size - tail_size), SEEK_SET);
  if (std::fread(tail.data(), 1, tail_size, file.f) != tail_size) {
    InputError(path + ": cannot read the zip directory");
  }
  int64_t eocd = -1;
  for (int64_t i = static_cast<int64_t>(tail_size) - 22; i >= 0; --i) {
    if (Le32(&tail[i]) == 0x06054b50) {
      eocd = i;
      break;
    }
  }
  if (eocd < 0) InputError(path + ": not a zip archive (.npz)");
  uint64_t entries = Le16(&tail[eocd + 10]);
  uint64_t dir_size = Le32(&tail[eocd + 12]);
  uint64_t dir_offset = Le32(&tail[eocd + 16]);
  if (dir_offset == 0xffffffff || entries == 0xffff) {
    // ZIP64: the locator precedes the EOCD record.
    if (eocd < 20 || Le32(&tail[eocd - 20]) != 0x07064b50) {
      InputError(path + ": ZIP64 archive without its locator");
    }
    const uint64_t z64 = Le64(&tail[eocd - 12]);
    unsigned char rec[56];
    std::fseek(file.f, static_cast<long>(z64), SEEK_SET);
    if (std::fread(rec, 1, 56, file.f) != 56 || Le32(rec) != 0x06064b50) {
      InputError(path + ": broken ZIP64 directory record");
    }
    entries = Le64(rec + 32);
    dir_size = Le64(rec + 40);
    dir_offset = Le64(rec + 48);
  }
  if (dir_offset + dir_size > size) InputError(path + ": broken zip directory");
  std::vector<unsigned char> dir(dir_size);
  std::fseek(file.f, static_cast<long>(dir_offset), SEEK_SET);
  if (std::fread(dir.data(), 1, dir_size, file.f) != dir_size) {
    InputError(path + ": cannot read the zip directory");
  }
  std::vector<std::unique_ptr<NpyArray>> arrays;
  size_t at = 0;
  for (uint64_t e = 0; e < entries; ++e) {
    if (at + 46 > dir.size() || Le32(&dir[at]) != 0x02014b50) {
      InputError(path + ": broken zip directory entry");
    }
    const uint16_t method = Le16(&dir[at + 10]);
    uint64_t csize = Le32(&dir[at + 20]);
    const uint16_t name_len = Le16(&dir[at + 28]);
    const uint16_t extra_len = Le16(&dir[at + 30]);
    const uint16_t comment_len = Le16(&dir[at + 32]);
    uint64_t local = Le32(&dir[at + 42]);
    const uint64_t usize32 = Le32(&dir[at + 24]);
    if (at + 46 + name_len + extra_len > dir.size()) {
      InputError(path + ": broken zip directory entry");
    }
    const std::string name(reinterpret_cast<const char*>(&dir[at + 46]),
                           name_len);
    // ZIP64 extra field: the sizes and offset that did not fit.
    size_t x = at + 46 + name_len;
    const size_t x_end = x + extra_len;
    while (x + 4 <= x_end) {
      const uint16_t id = Le16(&dir[x]), len = Le16(&dir[x + 2]);
      if (id == 0x0001) {
        size_t f = x + 4;
        if (usize32 == 0xffffffff && f + 8 <= x_end) f += 8;
        if (csize == 0xffffffff && f + 8 <= x_end) {
          csize = Le64(&dir[f]);
          f += 8;
        }
        if (local == 0xffffffff && f + 8 <= x_end) local = Le64(&dir[f]);
      }
      x += 4 + len;
    }
    at += 46 + name_len + extra_len + comment_len;
    if (name.size() < 4 || name.substr(name.size() - 4) != ".npy") continue;
    if (method != 0 && method != 8) {
      InputError(
          fmt::format("{}: member {}: compression method {} (only "
                      "stored and deflated are used by numpy)",
                      path, name, method));
    }
    unsigned char lh[30];
    std::fseek(file.f, static_cast<long>(local), SEEK_SET);
    if (std::fread(lh, 1, 30, file.f) != 30 || Le32(lh) != 0x04034b50) {
      InputError(fmt::format("{}: member {}: broken local header", path, name));
    }
    const uint64_t data = local + 30 + Le16(lh + 26) + Le16(lh + 28);
    arrays.push_back(std::make_unique<NpyArray>(
        std::make_unique<ZipMemberStream>(path, data, csize, method == 8, name),
        path + ":" + name, name.substr(0, name.size() - 4)));
  }
  if (arrays.empty()) InputError(path + ": no .npy members");
  return arrays;
}

// --- IDX (MNIST) --------------------------------------------------------

class GzFile {
 public:
  explicit GzFile(const std::string& path) : path_(path) {
    f_ = gzopen(path.c_str(), "rb");  // reads plain files too
    if (f_ == nullptr) {
      InputError(
          fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
    }
    gzbuffer(f_, 1 << 18);
  }
  ~GzFile() { gzclose(f_); }
  void ReadExactly(void* dst, size_t n, const std::string& what) {
    const int got = gzread(f_, dst, static_cast<unsigned>(n));
    if (got < 0 || static_cast<size_t>(got) != n) {
      int err = 0;
      const char* msg = gzerror(f_, &err);
      InputError(fmt::format("{}: {}{}", path_, what,
                             err != Z_OK ? std::string(" (") + msg + ")" : ""));
    }
  }
  uint64_t consumed() { return static_cast<uint64_t>(gzoffset(f_)); }

 private:
  std::string path_;
  gzFile f_;
};

uint32_t Be32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (p[1] << 16) | (p[2] << 8) | p[3];
}

class IdxSource final : public BuildingSource {
 public:
  IdxSource(const std::string& images, const std::string& labels)
      : images_(images),
        labels_(labels),
        total_bytes_(FileSize(images) + FileSize(labels)) {
    unsigned char h[16];
    images_.ReadExactly(h, 16, "truncated IDX header");
    if (Be32(h) != 0x00000803) {
      InputError(
          fmt::format("{}: not an IDX file of unsigned bytes with 3 "
                      "dimensions (magic {:#010x}, expected "
                      "0x00000803)",
                      images, Be32(h)));
    }
    rows_ = Be32(h + 4);
    height_ = Be32(h + 8);
    width_ = Be32(h + 12);
    if (height_ == 0 || width_ == 0 ||
        uint64_t{height_} * width_ > (1u << 28)) {
      InputError(fmt::format("{}: implausible image size {}x{}", images,
                             height_, width_));
    }
    unsigned char l[8];
    labels_.ReadExactly(l, 8, "truncated IDX header");
    if (Be32(l) != 0x00000801) {
      InputError(
          fmt::format("{}: not an IDX file of unsigned bytes with 1 "
                      "dimension (magic {:#010x}, expected "
                      "0x00000801)",
                      labels, Be32(l)));
    }
    if (Be32(l + 4) != rows_) {
      InputError(fmt::format("{} holds {} images but {} holds {} labels",
                             images, rows_, labels, Be32(l + 4)));
    }
    image_.resize(uint64_t{height_} * width_);
  }
  bool Next(ExampleBuilder* b) override {
    if (row_ == rows_) return false;
    images_.ReadExactly(
        image_.data(), image_.size(),
        fmt::format("data ends inside image {} of {}", row_, rows_));
    unsigned char label;
    labels_.ReadExactly(
        &label, 1, fmt::format("data ends at label {} of {}", row_, rows_));
    ++row_;
    b->AddBytes("image", image_)
        .AddInt64("label", label)
        .AddInt64("height", height_)
        .AddInt64("width", width_);
    return true;
  }
  std::optional<uint64_t> rows() const override { return rows_; }
  uint64_t bytes_read() const override {
    return const_cast<GzFile&>(images_).consumed() +
           const_cast<GzFile&>(labels_).consumed();
  }
  uint64_t total_bytes() const override { return total_bytes_; }

 private:
  GzFile images_;
  GzFile labels_;
  uint64_t total_bytes_;
  uint32_t rows_ = 0, height_ = 0, width_ = 0;
  uint32_t row_ = 0;
  std::string image_;
};

// --- Image folders ------------------------------------------------------

std::string Lower(std::string s) {
  for (auto& c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Width and height from a PNG's IHDR or a JPEG's frame header; false if
// the bytes are neither.
bool ImageSize(const std::string& bytes, std::string* format, int64_t* height,
               int64_t* width) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  if (n >= 24 && std::memcmp(p, "\x89PNG\r\n\x1a\n", 8) == 0 &&
      std::memcmp(p + 12, "IHDR", 4) == 0) {
    *format = "png";
    *width = Be32(p + 16);
    *height = Be32(p + 20);
    return true;
  }
  if (n >= 4 && p[0] == 0xff && p[1] == 0xd8) {
    size_t at = 2;
    while (at + 4 <= n) {
      if (p[at] != 0xff) return false;
      const unsigned char marker = p[at + 1];
      if (marker == 0xff) {  // fill byte
        ++at;
        continue;
      }
      if (marker == 0xd8 || (marker >= 0xd0 && marker <= 0xd7) ||
          marker == 0x01) {
        at += 2;
        continue;
      }
      const size_t len = (p[at + 2] << 8) | p[at + 3];
      const bool sof = marker >= 0xc0 && marker <= 0xcf && marker != 0xc4 &&
                       marker != 0xc8 && marker != 0xcc;
      if (sof) {
        if (at + 9 > n) return false;
        *format = "jpeg";
        *height = (p[at + 5] << 8) | p[at + 6];
        *width = (p[at + 7] << 8) | p[at + 8];
        return true;
      }
      if (marker == 0xda || marker == 0xd9) return false;  // no frame header
      at += 2 + len;
    }
  }
  return false;
}

class ImagesSource final : public BuildingSource {
 public:
  explicit ImagesSource(const std::string& dir)
      : classes_(ImageClassNames(dir)) {
    for (size_t label = 0; label < classes_.size(); ++label) {
      std::vector<std::string> files;
      for (const auto& e :
           fs::directory_iterator(fs::path(dir) / classes_[label])) {
        const std::string ext = Lower(e.path().extension().string());
        if (e.is_regular_file() &&
            (ext == ".jpg" || ext == ".jpeg" || ext == ".png")) {
          files.push_back(e.path().string());
        }
      }
      std::sort(files.begin(), files.end());
      for (auto& f : files) {
        total_bytes_ += FileSize(f);
        items_.push_back({std::move(f), static_cast<int64_t>(label)});
      }
    }
    if (items_.empty()) {
      InputError(
          fmt::format("{}: no .jpg, .jpeg or .png files in its class "
                      "folders",
                      dir));
    }
  }
  bool Next(ExampleBuilder* b) override {
    if (next_ == items_.size()) return false;
    const Item& item = items_[next_++];
    FileStream in(item.path);
    bytes_.resize(FileSize(item.path));
    in.ReadExactly(bytes_.data(), bytes_.size(), item.path + ": short read");
    bytes_read_ += bytes_.size();
    std::string format;
    int64_t height = 0, width = 0;
    if (!ImageSize(bytes_, &format, &height, &width)) {
      RowError(
          fmt::format("{}: not a JPEG or PNG image (no frame header "
                      "found)",
                      item.path));
    }
    b->AddBytes("image/encoded", bytes_)
        .AddBytes("image/format", format)
        .AddInt64("image/height", height)
        .AddInt64("image/width", width)
        .AddInt64("image/class/label", item.label)
        .AddBytes("image/class/text", classes_[static_cast<size_t>(item.label)])
        .AddBytes("image/filename", fs::path(item.path).filename().string());
    return true;
  }
  std::optional<uint64_t> rows() const override { return items_.size(); }
  uint64_t bytes_read() const override { return bytes_read_; }
  uint64_t total_bytes() const override { return total_bytes_; }

 private:
  struct Item {
    std::string path;
    int64_t label;
  };
  std::vector<std::string> classes_;
  std::vector<Item> items_;
  size_t next_ = 0;
  std::string bytes_;
  uint64_t total_bytes_ = 0;
  uint64_t bytes_read_ = 0;
};

}  // namespace

void ExampleSource::Build(const Row& row, ExampleBuilder*) const {
  throw ConvertError(
      fmt::format("{}:{}: internal error: this source builds its rows "
                  "while reading them",
                  row.path, row.line),
      /*row_level=*/false);
}

std::vector<std::string> ImageClassNames(const std::string& directory) {
  std::error_code ec;
  if (!fs::is_directory(directory, ec)) {
    InputError(directory +
               ": not a directory (images expects one subfolder "
               "per class)");
  }
  std::vector<std::string> classes;
  for (const auto& e : fs::directory_iterator(directory)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && !name.empty() && name[0] != '.') {
      classes.push_back(name);
    }
  }
  std::sort(classes.begin(), classes.end());
  if (classes.empty()) {
    InputError(directory + ": no class subfolders");
  }
  return classes;
}

std::unique_ptr<ExampleSource> OpenSource(const std::string& format,
                                          const ConvertInputs& in) {
  auto need_files = [&] {
    if (in.files.empty()) InputError(format + ": no INPUT files given");
  };
  if (format == "csv") {
    need_files();
    return std::make_unique<CsvSource>(in.files, in.spec);
  }
  if (format == "jsonl") {
    need_files();
    return std::make_unique<JsonlSource>(in.files, in.spec);
  }
  if (format == "npy") {
    need_files();
    std::vector<std::unique_ptr<NpyArray>> arrays;
    uint64_t bytes = 0;
    for (const auto& f : in.files) {
      bytes += FileSize(f);
      arrays.push_back(std::make_unique<NpyArray>(
          std::make_unique<FileStream>(f), f, Stem(f)));
    }
    return std::make_unique<ArraysSource>(std::move(arrays), bytes, "npy");
  }
  if (format == "npz") {
    if (in.files.size() != 1) InputError("npz: give exactly one .npz file");
    return std::make_unique<ArraysSource>(OpenNpz(in.files[0]),
                                          FileSize(in.files[0]), in.files[0]);
  }
  if (format == "idx") {
    if (in.images.empty() || in.labels.empty()) {
      InputError("idx: give --images FILE and --labels FILE");
    }
    return std::make_unique<IdxSource>(in.images, in.labels);
  }
  if (format == "images") {
    if (in.files.size() != 1) {
      InputError(
          "images: give exactly one directory (one subfolder per "
          "class)");
    }
    return std::make_unique<ImagesSource>(in.files[0]);
  }
  InputError(
      fmt::format("unknown format '{}': expected csv, jsonl, npy, "
                  "npz, idx or images",
                  format));
}

}  // namespace recflow::tools
