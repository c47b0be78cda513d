#include <algorithm>

#include "convert/ring.h"
#include "convert/sources.h"
#include "records/csv_reader.h"

namespace recflow::convert {
namespace {

using records::DType;

// --- CSV (RFC 4180) -----------------------------------------------------

// Rows are read by records::CsvReader.  Its CsvError is caught here where
// it is row-level (the row is counted or skipped like a ConvertError's);
// one that ends the file leaves this source as it is.
using records::CsvReader;

// The typing pass's chunks: rows of one file, read in turn, typed on every
// core, merged in input order.  A slot keeps its cells' storage.
struct TypingChunk {
  std::vector<std::vector<std::string>> rows;  // the first `used` are read
  std::vector<uint64_t> lines;                 // of rows[i]
  size_t used = 0;
  uint64_t bad = 0;  // rows with a row-level CsvError: counted, not typed
  size_t file = 0;   // files_[file] holds the rows
  uint64_t bytes_read = 0;  // of all files, once these rows were read
  // Typed: each column's type over the chunk's rows, and its integers
  // that a float32 rounds.
  std::vector<CellType> types;
  std::vector<RoundedRun> rounded;
};

class CsvSource final : public ExampleSource {
 public:
  CsvSource(std::vector<std::string> files, const records::FeatureSpec* spec,
            char delimiter, uint64_t max_row_bytes,
            const std::function<void(const ConvertProgress&)>& typing)
      : files_(std::move(files)),
        delimiter_(delimiter),
        max_row_bytes_(max_row_bytes) {
    try {
      records::CheckCsvDelimiter(delimiter_);
    } catch (const records::Error& e) {
      InputError(e.what());
    }
    for (const auto& f : files_) total_bytes_ += FileSize(f);
    // First pass: header, column types, and the row count.  Rows are
    // read on one thread (a quoted cell may hold a newline, so only the
    // reader knows where a row ends), typed on every core, and merged in
    // input order, so that the first inexact integer named is the
    // input's first.  A chunk holds one file's rows.
    InexactIntegers inexact;
    TypingReports reports(typing, total_bytes_);
    std::unique_ptr<CsvReader> reader;
    size_t file_index = 0;
    uint64_t files_bytes = 0;  // of the files read before `reader`
    // Opens files_[index] and reads its header: the first file's is the
    // header; every other file's must be the same.
    auto open = [&](size_t index) {
      const std::string& path = files_[index];
      reader = std::make_unique<CsvReader>(path, delimiter_, std::nullopt,
                                           max_row_bytes_);
      std::vector<std::string> fields;
      uint64_t line;
      if (!reader->ReadRecord(&fields, &line)) {
        InputError(
            fmt::format("{}: empty; a CSV file starts with a header "
                        "row",
                        path));
      }
      if (header_.empty()) {
        try {
          records::CheckCsvHeader(path, fields);
        } catch (const records::CsvError& e) {
          InputError(e.what());
        }
        header_ = fields;
        types_.assign(header_.size(), CellType::kNone);
        header_hint_ = records::OtherDelimiterHint(header_, delimiter_,
                                                   "give --delimiter");
      } else if (fields != header_) {
        InputError(
            fmt::format("{}:1: header differs from {}'s", path, files_[0]));
      }
    };
    if (!files_.empty()) open(0);
    const size_t columns = header_.size();
    auto read = [&](TypingChunk& c) {
      c.used = 0;
      c.bad = 0;
      size_t bytes = 0;
      while (c.used + c.bad < kTypingRows && bytes < kTypingBytes) {
        if (reader == nullptr) break;  // every file read
        c.file = file_index;
        if (c.used == c.rows.size()) {
          c.rows.emplace_back();
          c.lines.emplace_back();
        }
        try {
          if (!reader->ReadRecord(&c.rows[c.used], &c.lines[c.used])) {
            files_bytes += reader->position();
            reader.reset();
            if (++file_index < files_.size()) open(file_index);
            if (c.used + c.bad > 0) break;
            continue;
          }
        } catch (const records::CsvError& e) {
          if (!e.row_level()) throw;
          ++c.bad;  // a row, counted, that types nothing
          continue;
        }
        for (const std::string& cell : c.rows[c.used]) bytes += cell.size();
        ++c.used;
      }
      if (c.used + c.bad == 0) return false;
      c.bytes_read = files_bytes + (reader ? reader->position() : 0);
      return true;
    };
    auto type = [columns](TypingChunk& c) {
      c.types.assign(columns, CellType::kNone);
      c.rounded.resize(columns);
      for (RoundedRun& r : c.rounded) r.Clear();
      for (size_t row = 0; row < c.used; ++row) {
        const std::vector<std::string>& fields = c.rows[row];
        for (size_t i = 0; i < fields.size() && i < columns; ++i) {
          const CellType t = InferCell(fields[i]);
          c.types[i] = Widen(c.types[i], t);
          // Past 2^24 an integer has at least 8 digits.
          int64_t v;
          if (t == CellType::kInt64 && fields[i].size() >= 8 &&
              records::ParseInt64Cell(fields[i], &v)) {
            if (auto rounded = InexactIntegers::Rounded(v)) {
              c.rounded[i].Note(
                  *rounded, [&] { return fields[i]; }, c.lines[row]);
            }
          }
        }
      }
    };
    auto merge = [&](TypingChunk& c) {
      rows_ += c.used + c.bad;
      reports.Rows(c.used + c.bad, [&c] { return c.bytes_read; });
      const std::string& path = files_[c.file];
      for (size_t i = 0; i < columns; ++i) {
        types_[i] = Widen(types_[i], c.types[i]);
        c.rounded[i].AddTo(&inexact, i, path);
      }
    };
    RunRing<TypingChunk>(kTypingChunks, read, type, merge);
    if (!header_hint_.empty()) {
      warnings_.push_back(fmt::format("{}:1: {}", files_[0], header_hint_));
    }
    for (size_t i = 0; i < header_.size(); ++i) {
      types_[i] = FromSpec(spec, header_[i], types_[i]);
      if (types_[i] == CellType::kNone && rows_ > 0) {
        warnings_.push_back(
            UntypedWarning("column", header_[i], "empty in every row"));
      }
      if (auto w = inexact.Warning(i, header_[i], "column", types_[i])) {
        warnings_.push_back(std::move(*w));
      }
    }
    // The spec types columns by name: one the header lacks is a misspelt
    // or wrong column, not a feature to leave out silently.
    if (spec != nullptr) {
      for (const auto& [name, config] : spec->features) {
        if (std::find(header_.begin(), header_.end(), name) == header_.end()) {
          InputError(
              fmt::format("{}:1: --spec names column '{}', which the "
                          "header ({}) does not have",
                          files_[0], name, fmt::join(header_, ", ")));
        }
      }
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
      } catch (const records::CsvError& e) {
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

  void Build(const Row& row, records::ExampleBuilder* b) const override {
    const std::vector<std::string>& fields = row.fields;
    const uint64_t line = row.line;
    if (fields.size() != header_.size()) {
      RowError(fmt::format("{}:{}: {} fields, the header has {}{}{}", row.path,
                           line, fields.size(), header_.size(),
                           header_hint_.empty() ? "" : "; ", header_hint_));
    }
    for (size_t i = 0; i < fields.size(); ++i) {
      const std::string& cell = fields[i];
      if (cell.empty()) continue;  // absent in this record
      switch (types_[i]) {
        case CellType::kInt64: {
          int64_t v;
          if (!records::ParseInt64Cell(cell, &v)) {
            RowError(records::CsvCellError(row.path, line, header_[i], cell,
                                           CellType::kInt64));
          }
          b->AddInt64(header_[i], v);
          break;
        }
        case CellType::kFloat: {
          float v;
          const records::FloatCell read = records::ReadFloatCell(cell, &v);
          if (read != records::FloatCell::kOk) {
            RowError(records::CsvCellError(row.path, line, header_[i], cell,
                                           CellType::kFloat, read));
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
  std::vector<std::string> warnings() const override { return warnings_; }

 private:
  void Open(size_t index) {
    file_index_ = index;
    reader_.reset();
    if (index >= files_.size()) return;
    reader_ = std::make_unique<CsvReader>(files_[index], delimiter_,
                                          std::nullopt, max_row_bytes_);
    std::vector<std::string> header;
    uint64_t line;
    reader_->ReadRecord(&header, &line);
  }

  std::vector<std::string> files_;
  char delimiter_;
  uint64_t max_row_bytes_;
  std::vector<std::string> header_;
  std::string header_hint_;  // OtherDelimiterHint's, or ""
  std::vector<CellType> types_;
  std::vector<std::string> warnings_;
  std::unique_ptr<CsvReader> reader_;
  size_t file_index_ = 0;
  uint64_t rows_ = 0;
  uint64_t total_bytes_ = 0;
  uint64_t bytes_done_ = 0;
};

}  // namespace

std::unique_ptr<ExampleSource> OpenCsv(
    std::vector<std::string> files, const records::FeatureSpec* spec,
    char delimiter, uint64_t max_row_bytes,
    const std::function<void(const ConvertProgress&)>& typing) {
  return std::make_unique<CsvSource>(std::move(files), spec, delimiter,
                                     max_row_bytes, typing);
}

}  // namespace recflow::convert
