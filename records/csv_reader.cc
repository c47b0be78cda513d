#include "records/csv_reader.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "records/wire_format.h"

namespace recflow::records {

namespace {
// The cell without one leading '+' that a digit or '.' follows (from_chars
// takes '-' only).
std::string_view WithoutPlus(std::string_view cell) {
  if (cell.size() >= 2 && cell[0] == '+' &&
      (std::isdigit(static_cast<unsigned char>(cell[1])) || cell[1] == '.')) {
    cell.remove_prefix(1);
  }
  return cell;
}
}  // namespace

bool ParseInt64Cell(std::string_view cell, int64_t* value) {
  cell = WithoutPlus(cell);
  const char* end = cell.data() + cell.size();
  const auto [stop, ec] = std::from_chars(cell.data(), end, *value);
  return ec == std::errc() && stop == end;
}

bool FitsFloat32(double value) {
  return !std::isfinite(value) ||
         std::fabs(value) <= std::numeric_limits<float>::max();
}

std::string CsvCellError(std::string_view path, uint64_t line,
                         std::string_view column, std::string_view cell,
                         CellType as, FloatCell read) {
  if (as == CellType::kFloat && read == FloatCell::kOutOfRange) {
    return fmt::format(
        "{}:{}: column '{}': {} is outside float32's range (a float would "
        "be inf)",
        path, line, column, cell);
  }
  return fmt::format("{}:{}: column '{}': expected {}, found \"{}\"", path,
                     line, column,
                     as == CellType::kInt64 ? "an integer" : "a number", cell);
}

FloatCell ReadFloatCell(std::string_view cell, float* value) {
  cell = WithoutPlus(cell);
  const char* end = cell.data() + cell.size();
  // As a double first: from_chars into a float reports 1e-50 as out of
  // range as it reports 1e39.
  double d = 0;
  const auto [stop, ec] = std::from_chars(cell.data(), end, d);
  if (stop != end || cell.empty()) return FloatCell::kNotNumber;
  if (ec == std::errc::result_out_of_range) {
    // Past double's range too: tiny (a negative exponent; from_chars took
    // the whole cell, so a digit or sign follows the 'e') rounds to 0,
    // huge is out of range.
    const size_t e = cell.find_first_of("eE");
    if (e == std::string_view::npos || cell[e + 1] != '-') {
      return FloatCell::kOutOfRange;
    }
    d = 0;
  } else if (ec != std::errc()) {
    return FloatCell::kNotNumber;
  }
  if (!FitsFloat32(d)) return FloatCell::kOutOfRange;
  *value = static_cast<float>(d);
  return FloatCell::kOk;
}

CellType InferCell(std::string_view cell) {
  if (cell.empty()) return CellType::kNone;
  int64_t i;
  float f;
  if (ParseInt64Cell(cell, &i)) return CellType::kInt64;
  // A number past float32's range is still a number: its column is float,
  // and the row with it is an error there, not a column of text.
  if (ReadFloatCell(cell, &f) != FloatCell::kNotNumber) return CellType::kFloat;
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

void CheckCsvHeader(std::string_view path,
                    const std::vector<std::string>& header,
                    const std::vector<bool>& taken) {
  std::unordered_map<std::string_view, size_t> first;  // name -> column
  for (size_t i = 0; i < header.size(); ++i) {
    if (!taken.empty() && !taken[i]) continue;
    const std::string& name = header[i];
    if (name.empty() || !wire::IsValidUtf8(name)) {
      throw CsvError(fmt::format("{}:1: column {} of the header: names must "
                                 "be non-empty UTF-8",
                                 path, i + 1),
                     /*row_level=*/false);
    }
    const auto [at, added] = first.emplace(name, i);
    if (!added) {
      throw CsvError(fmt::format("{}:1: columns {} and {} of the header are "
                                 "both named '{}'; names must differ",
                                 path, at->second + 1, i + 1, name),
                     /*row_level=*/false);
    }
  }
}

std::string CsvDelimiterName(char delimiter) {
  if (delimiter == ',') return "comma";
  if (delimiter == '\t') return "tab";
  const auto byte = static_cast<unsigned char>(delimiter);
  if (byte >= 0x20 && byte < 0x7f) return fmt::format("'{}'", delimiter);
  return fmt::format("byte {:#04x}", byte);
}

std::string OtherDelimiterHint(const std::vector<std::string>& header,
                               char delimiter, std::string_view give) {
  if (header.size() != 1) return "";
  for (const char c : {'\t', ';', '|'}) {
    if (c != delimiter && header[0].find(c) != std::string::npos) {
      return fmt::format(
          "the header is a single column whose name holds {}: if {} the "
          "columns, {} {}",
          c == '\t' ? "tabs" : fmt::format("'{}' characters", c),
          c == '\t' ? "tabs separate" : "they separate", give,
          CsvDelimiterName(c));
    }
  }
  return "";
}

namespace {
ByteReader OpenCsv(const std::string& path, char delimiter,
                   std::optional<Compression> compression) {
  CheckCsvDelimiter(delimiter);  // before the file is looked at
  try {
    return ByteReader(path, compression);
  } catch (const IoError& e) {
    throw CsvError(e.what(), /*row_level=*/false);
  }
}
}  // namespace

CsvReader::CsvReader(std::string path, char delimiter,
                     std::optional<Compression> compression,
                     uint64_t max_row_bytes)
    : path_(std::move(path)),
      delimiter_(static_cast<unsigned char>(delimiter)),
      max_row_bytes_(static_cast<size_t>(max_row_bytes)),
      in_(OpenCsv(path_, delimiter, compression)) {}

CsvReader::~CsvReader() = default;

bool CsvReader::ReadRecord(std::vector<std::string>* fields, uint64_t* line) {
  try {
    return ReadFields(fields, line);
  } catch (const IoError& e) {  // read or decoding; names the file
    throw CsvError(e.what(), /*row_level=*/false);
  }
}

void CsvReader::RowTooLong(uint64_t line, uint64_t quote_opened) const {
  const std::string why =
      quote_opened == 0
          ? std::string("is the file CSV, with its line ends?")
          : fmt::format(
                "it is in a quoted field opened on line {} and still open on "
                "line {}: is a quote not closed?",
                quote_opened, line_);
  throw CsvError(
      fmt::format("{}:{}: the row is longer than {} bytes (its cells and "
                  "delimiters), the most a row may hold (max_row_bytes): {}",
                  path_, line, max_row_bytes_, why),
      /*row_level=*/false);
}

bool CsvReader::ReadFields(std::vector<std::string>* fields, uint64_t* line) {
  // Most rows: a line in the buffer with no quote and no CR but its CRLF
  // end, neither blank nor the file's first (a byte order mark).  Split at
  // the delimiters in place, as the byte-by-byte reading below would.
  if (!first_) {
    if (const std::optional<std::string_view> text = in_.BufferedLine()) {
      std::string_view row = *text;
      if (!row.empty() && row.back() == '\r') row.remove_suffix(1);
      const char delimiter = static_cast<char>(delimiter_);
      const char* p = row.data();
      const char* const end = p + row.size();
      size_t n = 0;
      bool plain = !row.empty() && row.size() <= max_row_bytes_;
      while (plain) {
        const char* cell = p;
        p = FindFirstOf(p, end, delimiter, '"', '\r');
        if (p != end && *p != delimiter) {  // a quote or a CR
          plain = false;
          break;
        }
        if (n == fields->size()) fields->emplace_back();
        (*fields)[n++].assign(cell, p - cell);
        if (p == end) break;
        ++p;  // the delimiter
      }
      if (plain) {
        fields->resize(n);
        in_.Skip(text->size() + 1);
        *line = line_++;
        return true;
      }
    }
  }
  int c = Get();
  if (c == EOF) {
    fields->clear();
    return false;
  }
  if (first_ && c == 0xEF) {  // a UTF-8 byte order mark
    if (Get() != 0xBB || Get() != 0xBF) {
      throw CsvError(
          fmt::format("{}:1: starts with a broken byte order mark", path_),
          false);
    }
    c = Get();
  } else if (first_ && (c == 0xFF || c == 0xFE)) {
    const int next = Get();
    if (std::string utf16 = Utf16FileError(path_, "CSV", c, next);
        !utf16.empty()) {
      throw CsvError(std::move(utf16), false);
    }
    if (next != EOF) in_.Unget();
  }
  first_ = false;
  // Blank lines (nothing on them, not even a delimiter) are no rows, as
  // for Python's csv.DictReader and pandas: an editor's trailing empty
  // line is not a row of empty cells.
  while (c == '\n' || c == '\r') {
    if (c == '\r') {
      c = Get();
      if (c != '\n' && c != EOF) in_.Unget();
    }
    ++line_;
    c = Get();
    if (c == EOF) {
      fields->clear();
      return false;
    }
  }
  *line = line_;
  // Each cell is read into the string that held the last row's cell in its
  // place, so that a row of cells longer than the small-string buffer
  // allocates nothing once the first rows have been read.
  size_t n = 0;
  size_t before = 0;  // the row's bytes before this cell (cells, delimiters)
  while (true) {
    if (n == fields->size()) fields->emplace_back();
    std::string& field = (*fields)[n++];
    field.clear();
    const size_t room = max_row_bytes_ - before;  // for this cell
    if (c == '"') {
      // Quoted: up to the closing quote; "" is a quote.  The bytes between
      // quotes and newlines are taken a buffer at a time.
      const uint64_t opened = line_;
      while (true) {
        c = in_.AppendUntil(&field, '"', '\n', '"', room);
        if (c == ByteReader::kFull) RowTooLong(*line, opened);
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
    } else if (c != delimiter_ && c != '\n' && c != '\r' && c != EOF) {
      // Unquoted: up to the delimiter or the line's end.
      field.push_back(static_cast<char>(c));
      c = in_.AppendUntil(&field, static_cast<char>(delimiter_), '\n', '\r',
                          room);
      if (c == ByteReader::kFull) RowTooLong(*line, 0);
    }
    if (c == delimiter_) {
      before += field.size() + 1;
      if (before > max_row_bytes_) RowTooLong(*line, 0);
      c = Get();
      continue;
    }
    if (c == '\r') {
      c = Get();
      if (c != '\n' && c != EOF) in_.Unget();
    }
    ++line_;
    fields->resize(n);
    return true;
  }
}

}  // namespace recflow::records
