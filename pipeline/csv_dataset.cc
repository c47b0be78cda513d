// The CSV source: one element per row, one scalar per column, typed as
// CsvOptions says or as the first data row suggests.
#include <fmt/format.h>

#include "pipeline/io.h"
#include "pipeline/stages.h"
#include "records/csv_reader.h"
#include "records/file_list.h"

namespace recflow::pipeline::stages {
namespace {

struct Column {
  std::string name;
  size_t field;  // index in the row
  DType dtype;
};

// What the first file's header and first data row decided: every file of
// the dataset, and of its shards (ShardByFiles), is read as these columns.
struct CsvSchema {
  std::string first_file;  // whose header every file must have
  std::vector<std::string> header;
  std::string hint;  // "; " and records::OtherDelimiterHint's, or ""
  std::vector<Column> columns;
};

// Reads `first`'s header and first data row; throws Error where they do
// not fit `options`.
std::shared_ptr<const CsvSchema> ReadSchema(const std::string& first,
                                            const CsvOptions& options) {
  try {
    records::CheckCsvDelimiter(options.delimiter);
  } catch (const records::Error& e) {
    throw Error(fmt::format("FromCsv: {}", e.what()));
  }
  records::RequireRegularFiles({first}, kSourcesNeedRegularFiles);
  records::CsvReader reader(first, options.delimiter, options.compression,
                            options.max_row_bytes);
  auto schema = std::make_shared<CsvSchema>();
  schema->first_file = first;
  std::vector<std::string>& header = schema->header;
  std::vector<std::string> row;
  uint64_t line;
  if (!reader.ReadRecord(&header, &line)) {
    throw Error(
        fmt::format("{}: empty; a CSV file starts with a header row", first));
  }
  const bool have_row = reader.ReadRecord(&row, &line);
  // A file of another delimiter reads as one column: said where a
  // column or a row's fields are missing.
  const std::string hint = records::OtherDelimiterHint(
      header, options.delimiter, "set the delimiter to");
  if (!hint.empty()) schema->hint = "; " + hint;
  // The columns taken: each is a component, named by the header.
  std::vector<bool> taken(header.size(), true);
  if (!options.select_columns.empty()) {
    for (size_t i = 0; i < header.size(); ++i) {
      taken[i] = std::find(options.select_columns.begin(),
                           options.select_columns.end(),
                           header[i]) != options.select_columns.end();
    }
  }
  try {
    records::CheckCsvHeader(first, header, taken);
  } catch (const records::CsvError& e) {
    throw Error(fmt::format("FromCsv: {}", e.what()));
  }
  for (size_t i = 0; i < header.size(); ++i) {
    if (!taken[i]) continue;
    const std::string& name = header[i];
    std::optional<DType> dtype;
    for (const auto& [key, d] : options.column_types) {
      if (key == name) dtype = d;
    }
    if (!dtype) {  // from the first row, as the converters' cells
      dtype = records::CellDType(records::InferCell(
          have_row && i < row.size() ? row[i] : std::string_view()));
    }
    if (*dtype != DType::kInt64 && *dtype != DType::kFloat32 &&
        *dtype != DType::kBytes) {
      throw Error(
          fmt::format("FromCsv: column '{}': {} columns are not "
                      "supported (int64, float32 or bytes)",
                      name, DTypeName(*dtype)));
    }
    schema->columns.push_back({name, i, *dtype});
  }
  for (const auto& [key, unused] : options.column_types) {
    if (std::find(header.begin(), header.end(), key) == header.end()) {
      throw Error(fmt::format(
          "FromCsv: column_types names '{}', which {} lacks (its columns: "
          "{}){}",
          key, first, fmt::join(header, ", "), schema->hint));
    }
  }
  for (const auto& want : options.select_columns) {
    if (std::none_of(schema->columns.begin(), schema->columns.end(),
                     [&](const Column& c) { return c.name == want; })) {
      throw Error(fmt::format("FromCsv: {} has no column '{}'{}", first, want,
                              schema->hint));
    }
  }
  return schema;
}

class CsvDataset final : public DatasetBase {
 public:
  CsvDataset(std::vector<std::string> files, CsvOptions options,
             std::shared_ptr<const CsvSchema> schema)
      : files_(std::move(files)),
        options_(std::move(options)),
        schema_(std::move(schema)) {}

  std::string Describe() const override {
    std::vector<std::string> cols;
    for (const auto& c : schema_->columns) {
      cols.push_back(fmt::format("{}:{}", c.name, DTypeName(c.dtype)));
    }
    return fmt::format("Csv({} files {:016x}, {}{})", files_.size(),
                       FilesFingerprint(files_), fmt::join(cols, " "),
                       options_.compression
                           ? fmt::format(", {}", records::CompressionName(
                                                     *options_.compression))
                           : std::string());
  }
  std::string StageName() const override { return "csv"; }
  std::shared_ptr<const DatasetBase> ShardByFiles(
      int64_t num_shards, int64_t index) const override {
    auto mine = FilesOfShard(files_, num_shards, index);
    if (!mine) return nullptr;
    return std::make_shared<CsvDataset>(std::move(*mine), options_, schema_);
  }
  std::unique_ptr<IteratorBase> MakeIteratorInternal(IteratorContext*,
                                                     uint64_t) const override {
    return std::make_unique<It>(this);
  }

 private:
  class It final : public IteratorBase {
   public:
    explicit It(const CsvDataset* d) : d_(d) {}

    bool GetNext(Element* out) override {
      while (true) {
        if (!reader_) {
          if (file_ >= d_->files_.size()) return false;
          try {
            Open(file_);
          } catch (...) {
            NextFile();  // its error in its place, then the next file
            throw;
          }
        }
        uint64_t line;
        bool got;
        try {
          got = reader_->ReadRecord(&fields_, &line);
        } catch (const records::CsvError& e) {
          ++rows_;
          if (!e.row_level()) NextFile();  // the file cannot be read on
          throw;
        }
        if (!got) {
          NextFile();
          continue;
        }
        ++rows_;
        Build(fields_, line, out);
        return true;
      }
    }

    void Save(StateWriter* w) override {
      w->BeginStage("csv");
      w->U64(file_);
      w->U64(rows_);
    }
    void Restore(StateReader* r) override {
      r->BeginStage("csv");
      file_ = r->U64();
      const uint64_t rows = r->U64();
      reader_.reset();
      if (file_ < d_->files_.size()) {
        Open(file_);
        std::vector<std::string> fields;
        uint64_t line;
        for (uint64_t i = 0; i < rows; ++i) {
          try {
            if (!reader_->ReadRecord(&fields, &line)) break;
          } catch (const records::CsvError& e) {
            if (!e.row_level()) throw;
          }
        }
      }
      rows_ = rows;
    }

   private:
    // Opens file `index` past its header, which must be the first file's.
    void Open(size_t index) {
      records::RequireRegularFiles({d_->files_[index]},
                                   kSourcesNeedRegularFiles);
      auto reader = std::make_unique<records::CsvReader>(
          d_->files_[index], d_->options_.delimiter, d_->options_.compression,
          d_->options_.max_row_bytes);
      std::vector<std::string> header;
      uint64_t line;
      if (!reader->ReadRecord(&header, &line) ||
          header != d_->schema_->header) {
        throw Error(fmt::format("{}:1: header differs from {}'s",
                                d_->files_[index], d_->schema_->first_file));
      }
      reader_ = std::move(reader);
      path_ = std::make_shared<const std::string>(d_->files_[index]);
      rows_ = 0;
    }
    // The current file is done with (ended, or failed): the next one is
    // opened by the next GetNext, and a state saved meanwhile says so.
    void NextFile() {
      reader_.reset();
      ++file_;
      rows_ = 0;
    }

    void Build(const std::vector<std::string>& fields, uint64_t line,
               Element* out) {
      if (fields.size() != d_->schema_->header.size()) {
        throw Error(fmt::format("{}:{}: {} fields, the header has {}{}", *path_,
                                line, fields.size(), d_->schema_->header.size(),
                                d_->schema_->hint));
      }
      out->components.clear();
      out->batch_origins.reset();
      out->origin = {path_, 0, rows_ - 1, std::nullopt};
      for (const Column& c : d_->schema_->columns) {
        const std::string& cell = fields[c.field];
        switch (c.dtype) {
          case DType::kInt64: {
            int64_t v = 0;
            if (!cell.empty() && !records::ParseInt64Cell(cell, &v)) {
              throw Error(records::CsvCellError(*path_, line, c.name, cell,
                                                records::CellType::kInt64));
            }
            out->components.push_back({c.name, Tensor::Scalar<int64_t>(v)});
            break;
          }
          case DType::kFloat32: {
            float v = 0;
            const records::FloatCell read =
                cell.empty() ? records::FloatCell::kOk
                             : records::ReadFloatCell(cell, &v);
            if (read != records::FloatCell::kOk) {
              throw Error(records::CsvCellError(
                  *path_, line, c.name, cell, records::CellType::kFloat, read));
            }
            out->components.push_back({c.name, Tensor::Scalar<float>(v)});
            break;
          }
          default:
            out->components.push_back({c.name, Tensor::BytesScalar(cell)});
            break;
        }
      }
    }

    const CsvDataset* d_;
    std::unique_ptr<records::CsvReader> reader_;
    std::vector<std::string> fields_;  // the last row's, reused
    std::shared_ptr<const std::string> path_;
    size_t file_ = 0;
    uint64_t rows_ = 0;  // data rows read from the current file
  };

  std::vector<std::string> files_;
  CsvOptions options_;
  std::shared_ptr<const CsvSchema> schema_;
};

}  // namespace

DatasetPtr Csv(std::vector<std::string> files, CsvOptions options) {
  if (files.empty()) throw Error("FromCsv: no files");
  std::shared_ptr<const CsvSchema> schema = ReadSchema(files[0], options);
  return std::make_shared<CsvDataset>(std::move(files), std::move(options),
                                      std::move(schema));
}

}  // namespace recflow::pipeline::stages
