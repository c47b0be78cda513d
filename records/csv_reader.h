// A CSV reader (RFC 4180: quoted fields, "" for a quote, CRLF or LF line
// ends, a UTF-8 byte order mark skipped, blank lines skipped as Python's
// csv.DictReader and pandas skip them; the field delimiter a comma or
// another single byte, e.g. a tab for TSV), for `recflow convert` and the
// pipeline's CSV source.  Not thread-safe.
#ifndef RECFLOW_RECORDS_CSV_READER_H_
#define RECFLOW_RECORDS_CSV_READER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "records/compression.h"
#include "records/dtype.h"
#include "records/errors.h"
#include "records/input_stream.h"

namespace recflow::records {

// Bad CSV, with "FILE:LINE: what".  row_level(): only this row is bad (the
// reader can go on with the next); otherwise the file cannot be read on.
class CsvError : public Error {
 public:
  CsvError(std::string what, bool row_level)
      : Error(std::move(what)), row_level_(row_level) {}
  bool row_level() const { return row_level_; }

 private:
  bool row_level_;
};

// Throws Error unless `delimiter` can separate CSV fields: any byte but a
// quote, CR or LF.
void CheckCsvDelimiter(char delimiter);
// How messages name a delimiter: "comma", "tab" or "';'".
std::string CsvDelimiterName(char delimiter);
// When `header` is a single column whose name holds a tab, ';' or '|'
// (and `delimiter` is not it): the file is most likely separated by that
// byte, and every row would be one cell.  What to say, ending in `give`
// and the byte's name ("the header is a single column whose name holds
// tabs: if tabs separate the columns, give --delimiter tab" for `give`
// "give --delimiter"), else "".
std::string OtherDelimiterHint(const std::vector<std::string>& header,
                               char delimiter, std::string_view give);
// Throws CsvError ("PATH:1: ...", not row-level) unless the names of the
// header's columns that are `taken` (all when `taken` is empty; else one
// flag per column) are non-empty UTF-8 and differ from one another: each
// becomes a feature or component name, and a second column of one name
// would hide the first one's cells.
void CheckCsvHeader(std::string_view path,
                    const std::vector<std::string>& header,
                    const std::vector<bool>& taken = {});

// A whole cell as a number (std::from_chars; nothing may follow it; one
// leading '+' is taken, as strtod and TensorFlow's decode_csv take it).
bool ParseInt64Cell(std::string_view cell, int64_t* value);
// How a cell reads as a float32: kOk (into *value); kNotNumber; or
// kOutOfRange, a finite number past float32's range (1e39), never stored
// as inf.  A number too small for float32 rounds to 0 or a subnormal, as
// any decimal rounds to the nearest float.  "nan" and "inf" are numbers.
enum class FloatCell { kOk, kNotNumber, kOutOfRange };
FloatCell ReadFloatCell(std::string_view cell, float* value);
// Whether a double in float32's finite range (or not finite: inf, nan).
bool FitsFloat32(double value);

// Typed cells, the one inference for the converters (CSV, JSON Lines) and
// the pipeline's CSV source: what a column holds, widened as cells are
// seen: int64 -> float; anything with text -> bytes.  kNone: no cell yet
// (or only empty ones).
enum class CellType { kNone, kInt64, kFloat, kBytes };
// kInt64 when the whole cell is an integer, kFloat when a number, kNone
// when empty, kBytes otherwise.
CellType InferCell(std::string_view cell);
CellType Widen(CellType a, CellType b);
// The error for a cell its column cannot hold, in the words the converter
// and the pipeline's CSV source share: `as` the column's type (kInt64 or
// kFloat) and, for kFloat, how the cell read.  "PATH:LINE: column 'c':
// expected an integer, found \"abc\"", "...: expected a number, found
// \"x\"", "...: 1e39 is outside float32's range (a float would be inf)".
std::string CsvCellError(std::string_view path, uint64_t line,
                         std::string_view column, std::string_view cell,
                         CellType as, FloatCell read = FloatCell::kNotNumber);
// The dtype of a column of `t`: int64, float32, or bytes (for text and for
// a column with no typed cell).
DType CellDType(CellType t);

class CsvReader {
 public:
  // Throws CsvError when the file cannot be opened, and Error for a
  // delimiter that cannot separate fields (a quote, CR or LF).  The file
  // may be compressed: `compression`, or by its name's suffix (.gz, .zz or
  // .zlib, .zst or .zstd) when std::nullopt (ByteReader).  A row whose
  // cells and delimiters are longer than `max_row_bytes` is a CsvError
  // (not row-level) as soon as it is known, read no further.
  explicit CsvReader(std::string path, char delimiter = ',',
                     std::optional<Compression> compression = std::nullopt,
                     uint64_t max_row_bytes = kDefaultMaxRowBytes);
  ~CsvReader();
  CsvReader(const CsvReader&) = delete;
  CsvReader& operator=(const CsvReader&) = delete;

  // Reads one record's fields; false at the end of the file (`fields`
  // empty).  `line` is the line the record starts on.  A file that cannot
  // be read or decoded is a CsvError (not row-level) naming it, after the
  // rows before; after a CsvError `fields` holds nothing of use.  The
  // strings already in `fields` are written over, keeping their capacity:
  // pass the same vector row after row.
  bool ReadRecord(std::vector<std::string>* fields, uint64_t* line);
  // Bytes of the file consumed so far (ByteReader::file_position).
  uint64_t position() const { return in_.file_position(); }
  const std::string& path() const { return path_; }

 private:
  bool ReadFields(std::vector<std::string>* fields, uint64_t* line);
  // Throws the CsvError for a row (starting on `line`) past
  // max_row_bytes_; `quote_opened`: the line of the quoted field it is in
  // (0: none).
  [[noreturn]] void RowTooLong(uint64_t line, uint64_t quote_opened) const;
  int Get() { return in_.Get(); }

  std::string path_;
  int delimiter_;  // as Get() returns bytes: 0-255
  size_t max_row_bytes_;
  ByteReader in_;
  uint64_t line_ = 1;
  bool first_ = true;
};

}  // namespace recflow::records

#endif  // RECFLOW_RECORDS_CSV_READER_H_
