#include "records/csv_reader.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

namespace recflow::records {

bool ParseInt64Cell(std::string_view cell, int64_t* value) {
  const char* end = cell.data() + cell.size();
  const auto [stop, ec] = std::from_chars(cell.data(), end, *value);
  return ec == std::errc() && stop == end;
}

bool ParseFloatCell(std::string_view cell, float* value) {
  const char* end = cell.data() + cell.size();
  const auto [stop, ec] = std::from_chars(cell.data(), end, *value);
  return ec == std::errc() && stop == end;
}

CellType InferCell(std::string_view cell) {
  if (cell.empty()) return CellType::kNone;
  int64_t i;
  float f;
  if (ParseInt64Cell(cell, &i)) return CellType::kInt64;
  if (ParseFloatCell(cell, &f)) return CellType::kFloat;
  return CellType::kBytes;
}

CellType Widen(CellType a, CellType b) {
  return static_cast<CellType>(
      std::max(static_cast<int>(a), static_cast<int>(b)));
}

DType CellDType(CellType t) {
  switch (t) {
    case CellType::kInt64:
      return DType::kInt64;
    case CellType::kFloat:
      return DType::kFloat32;
    case CellType::kNone:
    case CellType::kBytes:
      break;
  }
  return DType::kBytes;
}

void CheckCsvDelimiter(char delimiter) {
  if (delimiter == '"' || delimiter == '\n' || delimiter == '\r') {
    throw Error(fmt::format(
        "CSV delimiter {}: a quote or line end cannot separate fields",
        CsvDelimiterName(delimiter)));
  }
}

std::string CsvDelimiterName(char delimiter) {
  if (delimiter == ',') return "comma";
  if (delimiter == '\t') return "tab";
  const auto byte = static_cast<unsigned char>(delimiter);
  if (byte >= 0x20 && byte < 0x7f) return fmt::format("'{}'", delimiter);
  return fmt::format("byte {:#04x}", byte);
}

CsvReader::CsvReader(std::string path, char delimiter)
    : path_(std::move(path)),
      delimiter_(static_cast<unsigned char>(delimiter)) {
  CheckCsvDelimiter(delimiter);
  f_ = std::fopen(path_.c_str(), "rb");
  if (f_ == nullptr) {
    throw CsvError(
        fmt::format("{}: cannot open: {}", path_, std::strerror(errno)),
        /*row_level=*/false);
  }
}

CsvReader::~CsvReader() {
  if (f_) std::fclose(f_);
}

uint64_t CsvReader::position() const {
  return static_cast<uint64_t>(std::ftell(f_));
}

bool CsvReader::ReadRecord(std::vector<std::string>* fields, uint64_t* line) {
  fields->clear();
  int c = Get();
  if (c == EOF) return false;
  if (first_ && c == 0xEF) {  // a UTF-8 byte order mark
    if (Get() != 0xBB || Get() != 0xBF) {
      throw CsvError(
          fmt::format("{}:1: starts with a broken byte order mark", path_),
          false);
    }
    c = Get();
  }
  first_ = false;
  *line = line_;
  std::string field;
  while (true) {
    if (c == '"') {
      // Quoted: up to the closing quote; "" is a quote.
      while (true) {
        c = Get();
        if (c == EOF) {
          throw CsvError(
              fmt::format("{}:{}: a quoted field is not closed", path_, *line),
              false);
        }
        if (c == '"') {
          c = Get();
          if (c != '"') break;
        }
        if (c == '\n') ++line_;
        field.push_back(static_cast<char>(c));
      }
      if (c != delimiter_ && c != '\n' && c != '\r' && c != EOF) {
        const uint64_t at = line_;
        const char unexpected = static_cast<char>(c);
        // Skip the rest of the row so that the next one can be read.
        while (c != '\n' && c != EOF) c = Get();
        ++line_;
        const auto byte = static_cast<unsigned char>(unexpected);
        throw CsvError(
            fmt::format("{}:{}: unexpected {} after a closing quote (a "
                        "quoted field ends at a {} or the line's end)",
                        path_, at,
                        byte >= 0x20 && byte < 0x7f
                            ? fmt::format("'{}'", unexpected)
                            : fmt::format("byte {:#04x}", byte),
                        CsvDelimiterName(static_cast<char>(delimiter_))),
            true);
      }
    } else {
      while (c != delimiter_ && c != '\n' && c != '\r' && c != EOF) {
        field.push_back(static_cast<char>(c));
        c = Get();
      }
    }
    fields->push_back(std::move(field));
    field.clear();
    if (c == delimiter_) {
      c = Get();
      continue;
    }
    if (c == '\r') {
      c = Get();
      if (c != '\n' && c != EOF) std::ungetc(c, f_);
    }
    ++line_;
    return true;
  }
}

}  // namespace recflow::records
