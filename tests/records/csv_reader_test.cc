// records/csv_reader.h: RFC 4180 rows, and the one cell-type inference the
// converters and the pipeline's CSV source share.
#include "records/csv_reader.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <random>

#include "test_util.h"

namespace recflow::records {
namespace {

TEST(CsvCellTest, CellsReadAsTheNarrowestTypeAndColumnsWiden) {
  EXPECT_EQ(InferCell(""), CellType::kNone);
  EXPECT_EQ(InferCell("-12"), CellType::kInt64);
  EXPECT_EQ(InferCell("1.5e3"), CellType::kFloat);
  EXPECT_EQ(InferCell("12 "), CellType::kBytes);  // nothing may follow
  EXPECT_EQ(InferCell("x"), CellType::kBytes);
  EXPECT_EQ(Widen(CellType::kNone, CellType::kInt64), CellType::kInt64);
  EXPECT_EQ(Widen(CellType::kInt64, CellType::kFloat), CellType::kFloat);
  EXPECT_EQ(Widen(CellType::kFloat, CellType::kInt64), CellType::kFloat);
  EXPECT_EQ(Widen(CellType::kBytes, CellType::kFloat), CellType::kBytes);
  EXPECT_EQ(CellDType(CellType::kInt64), DType::kInt64);
  EXPECT_EQ(CellDType(CellType::kFloat), DType::kFloat32);
  EXPECT_EQ(CellDType(CellType::kBytes), DType::kBytes);
  EXPECT_EQ(CellDType(CellType::kNone), DType::kBytes);
}

// A leading '+' is a sign (strtod's, decode_csv's); a number too small for
// float32 is 0, not text; one too large is a number past float32's range,
// never inf.
TEST(CsvCellTest, SignsAndTheEdgesOfFloat32) {
  int64_t i = 0;
  float f = 1;
  EXPECT_TRUE(ParseInt64Cell("+5", &i));
  EXPECT_EQ(i, 5);
  EXPECT_EQ(InferCell("+5"), CellType::kInt64);
  EXPECT_EQ(InferCell("+.5"), CellType::kFloat);
  for (const char* text : {"+", "+-5", "++5", "+ 5", "-+5", "+x"}) {
    EXPECT_EQ(InferCell(text), CellType::kBytes) << text;
  }
  EXPECT_EQ(ReadFloatCell("1e-50", &f), FloatCell::kOk);
  EXPECT_EQ(f, 0.0f);
  EXPECT_EQ(ReadFloatCell("-1e-400", &f), FloatCell::kOk);
  EXPECT_EQ(f, 0.0f);
  EXPECT_EQ(ReadFloatCell("1e-40", &f), FloatCell::kOk);  // a subnormal
  EXPECT_GT(f, 0.0f);
  EXPECT_EQ(ReadFloatCell("3.4e38", &f), FloatCell::kOk);
  for (const char* text : {"1e39", "-3.5e38", "1e400"}) {
    EXPECT_EQ(ReadFloatCell(text, &f), FloatCell::kOutOfRange) << text;
    EXPECT_EQ(InferCell(text), CellType::kFloat) << text;
  }
  EXPECT_EQ(ReadFloatCell("inf", &f), FloatCell::kOk);
  EXPECT_TRUE(std::isinf(f));
  EXPECT_EQ(ReadFloatCell("nan", &f), FloatCell::kOk);
  EXPECT_EQ(ReadFloatCell("1e", &f), FloatCell::kNotNumber);
  EXPECT_EQ(ReadFloatCell("", &f), FloatCell::kNotNumber);
  EXPECT_TRUE(FitsFloat32(-3.4e38));
  EXPECT_FALSE(FitsFloat32(3.5e38));
}

TEST(CsvReaderTest, QuotedFieldsLineNumbersAndARowLevelError) {
  testing::TempDir dir;
  const std::string path = dir.File("a.csv");
  std::ofstream(path, std::ios::binary)
      << "\xEF\xBB\xBFname,note\r\n\"a,b\",\"say \"\"hi\"\"\"\r\n"
         "\"two\nlines\",x\nc,\"d\"e\n";
  CsvReader reader(path);
  std::vector<std::string> fields;
  uint64_t line = 0;
  ASSERT_TRUE(reader.ReadRecord(&fields, &line));
  EXPECT_EQ(fields, (std::vector<std::string>{"name", "note"}));
  EXPECT_EQ(line, 1u);
  ASSERT_TRUE(reader.ReadRecord(&fields, &line));
  EXPECT_EQ(fields, (std::vector<std::string>{"a,b", "say \"hi\""}));
  ASSERT_TRUE(reader.ReadRecord(&fields, &line));
  EXPECT_EQ(fields, (std::vector<std::string>{"two\nlines", "x"}));
  EXPECT_EQ(line, 3u);
  try {
    reader.ReadRecord(&fields, &line);
    FAIL() << "a quote followed by text was accepted";
  } catch (const CsvError& e) {
    EXPECT_TRUE(e.row_level());
    EXPECT_EQ(std::string(e.what()),
              path +
                  ":5: unexpected 'e' after a closing quote (a quoted "
                  "field ends at a comma or the line's end)");
  }
  EXPECT_FALSE(reader.ReadRecord(&fields, &line));
  EXPECT_TRUE(fields.empty());
  EXPECT_THROW(CsvReader(dir.File("missing.csv")), CsvError);
}

// One vector, row after row: its strings are written over (their capacity
// kept), and a row of fewer fields leaves none of the last row's behind.
TEST(CsvReaderTest, RowsReadIntoOneVectorHoldOnlyTheirOwnFields) {
  testing::TempDir dir;
  const std::string path = dir.File("a.csv");
  const std::string long_cell(100, 'x');
  std::ofstream(path, std::ios::binary)
      << long_cell << ",b,\"c\"\nd\n,\n\"e\"," << long_cell << "\n";
  CsvReader reader(path);
  std::vector<std::string> fields;
  uint64_t line = 0;
  ASSERT_TRUE(reader.ReadRecord(&fields, &line));
  EXPECT_EQ(fields, (std::vector<std::string>{long_cell, "b", "c"}));
  const char* const reused = fields[0].data();
  ASSERT_TRUE(reader.ReadRecord(&fields, &line));
  EXPECT_EQ(fields, (std::vector<std::string>{"d"}));
  EXPECT_EQ(fields[0].data(), reused);  // no new allocation
  ASSERT_TRUE(reader.ReadRecord(&fields, &line));
  EXPECT_EQ(fields, (std::vector<std::string>{"", ""}));
  ASSERT_TRUE(reader.ReadRecord(&fields, &line));
  EXPECT_EQ(fields, (std::vector<std::string>{"e", long_cell}));
  EXPECT_EQ(line, 4u);
  EXPECT_FALSE(reader.ReadRecord(&fields, &line));
  EXPECT_TRUE(fields.empty());
}

// `reader` reads exactly `rows`, each starting on its line of `lines`.
void ExpectRows(CsvReader* reader,
                const std::vector<std::vector<std::string>>& rows,
                const std::vector<uint64_t>& lines) {
  std::vector<std::string> fields;
  uint64_t at = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    ASSERT_TRUE(reader->ReadRecord(&fields, &at)) << r;
    ASSERT_EQ(fields, rows[r]) << r;
    ASSERT_EQ(at, lines[r]) << r;
  }
  EXPECT_FALSE(reader->ReadRecord(&fields, &at));
}

// Rows written as RFC 4180 says (quoted where a field holds the
// delimiter, a quote, \r or \n, and at random elsewhere; \n or \r\n line
// ends; blank lines between some) read back as written, each at its first
// line, with fields from empty to past the reader's 64 KiB buffer, over
// every codec and two delimiters.
// Random rows written as CSV: fields with quotes, line ends and
// delimiters in them (quoted), empty ones, some 60-80 KB long (across the
// reader's buffers), blank lines between, LF and CRLF ends.
struct RandomCsv {
  std::vector<std::vector<std::string>> rows;
  std::vector<uint64_t> lines;  // where each row starts
  std::string text;

  RandomCsv(std::mt19937& rng, char delimiter, int count) {
    uint64_t line = 1;
    for (int r = 0; r < count; ++r) {
      if (rng() % 10 == 0) {
        text += "\n";
        ++line;
      }
      std::vector<std::string>& row = rows.emplace_back();
      lines.push_back(line);
      const int fields = 1 + static_cast<int>(rng() % 5);
      for (int f = 0; f < fields; ++f) {
        const size_t n = rng() % 50 == 0 ? 60000 + rng() % 20000 : rng() % 30;
        std::string field(n, '\0');
        for (char& c : field) {
          const unsigned pick = rng() % 40;
          c = pick == 0   ? '"'
              : pick == 1 ? '\n'
              : pick == 2 ? '\r'
              : pick == 3 ? delimiter
                          : static_cast<char>('a' + pick % 26);
        }
        // An empty lone field would be a blank line, no row.
        const bool quoted =
            field.find_first_of(std::string("\"\n\r") + delimiter) !=
                std::string::npos ||
            (fields == 1 && field.empty()) || rng() % 4 == 0;
        if (f > 0) text += delimiter;
        if (quoted) {
          text += '"';
          for (const char c : field) {
            if (c == '"') text += '"';
            if (c == '\n') ++line;
            text += c;
          }
          text += '"';
        } else {
          text += field;
        }
        row.push_back(std::move(field));
      }
      text += rng() % 2 ? "\n" : "\r\n";
      ++line;
    }
  }
};

TEST(CsvReaderTest, WrittenRowsReadBackWithTheirLinesWhateverTheirFields) {
  testing::TempDir dir;
  std::mt19937 rng(9);
  for (const char delimiter : {',', '\t'}) {
    const RandomCsv csv(rng, delimiter, 600);
    for (const Compression c : testing::kAllCompressions) {
      SCOPED_TRACE(std::string(CompressionName(c)) + " " + delimiter);
      const std::string path = dir.File("rows");
      testing::WriteFileBytes(path, testing::Compressed(csv.text, c));
      CsvReader reader(path, delimiter, c);
      ASSERT_NO_FATAL_FAILURE(ExpectRows(&reader, csv.rows, csv.lines));
    }
  }
}

// max_row_bytes bounds a row's cells and delimiters: every row up to it
// is read whole, whatever its quoting, and the first longer one is a
// file-level error naming the line it starts on, read no further.
TEST(CsvReaderTest, ARowPastMaxRowBytesEndsTheFileWhereItStarts) {
  testing::TempDir dir;
  std::mt19937 rng(13);
  const RandomCsv csv(rng, ',', 300);
  const std::string path = dir.File("rows.csv");
  testing::WriteFileBytes(path, csv.text);
  std::vector<size_t> sizes;
  for (const auto& row : csv.rows) {
    size_t bytes = row.size() - 1;
    for (const auto& cell : row) bytes += cell.size();
    sizes.push_back(bytes);
  }
  // Caps at some rows' sizes exactly and one below, short and long rows.
  for (const size_t pick : {size_t{5}, size_t{40}, size_t{77}}) {
    for (const size_t max : {sizes[pick], sizes[pick] - 1}) {
      SCOPED_TRACE("max " + std::to_string(max));
      CsvReader reader(path, ',', std::nullopt, max);
      std::vector<std::string> fields;
      uint64_t line = 0;
      size_t r = 0;
      while (r < csv.rows.size() && sizes[r] <= max) {
        ASSERT_TRUE(reader.ReadRecord(&fields, &line)) << r;
        ASSERT_EQ(fields, csv.rows[r]) << r;
        ++r;
      }
      ASSERT_LT(r, csv.rows.size());
      try {
        reader.ReadRecord(&fields, &line);
        FAIL() << "row " << r << " of " << sizes[r] << " bytes was read";
      } catch (const CsvError& e) {
        EXPECT_FALSE(e.row_level());
        const std::string what = e.what();
        EXPECT_EQ(what.rfind(fmt::format("{}:{}: the row is longer than {} "
                                         "bytes (its cells and delimiters)",
                                         path, csv.lines[r], max),
                             0),
                  0u)
            << what;
      }
    }
  }
}

// The two ways a row grows past max_row_bytes, and what each error asks;
// blank lines and the quotes and line end around cells are not counted.
TEST(CsvReaderTest, ARowPastMaxRowBytesSaysWhetherAQuoteIsOpen) {
  testing::TempDir dir;
  const std::string path = dir.File("a.csv");
  const auto read = [&](const std::string& text, uint64_t max) {
    testing::WriteFileBytes(path, text);
    CsvReader reader(path, ',', std::nullopt, max);
    std::vector<std::string> fields;
    uint64_t line = 0;
    std::string got;
    try {
      while (reader.ReadRecord(&fields, &line)) {
        got += fmt::format("{}|", fmt::join(fields, ","));
      }
    } catch (const CsvError& e) {
      got += e.what();
    }
    return got;
  };
  const std::string text = "h,i\n\nab,c\r\n\"ab\",\"c\"\n,,\n";
  EXPECT_EQ(read(text, 4), "h,i|ab,c|ab,c|,,|");
  EXPECT_EQ(read(text, 3),
            "h,i|" + path +
                ":3: the row is longer than 3 bytes (its cells and "
                "delimiters), the most a row may hold (max_row_bytes): is the "
                "file CSV, with its line ends?");
  EXPECT_EQ(read("h\n\"x\n\ny\nz", 5),
            "h|" + path +
                ":2: the row is longer than 5 bytes (its cells and "
                "delimiters), the most a row may hold (max_row_bytes): it is "
                "in a quoted field opened on line 2 and still open on line 5: "
                "is a quote not closed?");
  EXPECT_EQ(read("h\n,,,,,,\n", 5),
            "h|" + path +
                ":2: the row is longer than 5 bytes (its "
                "cells and delimiters), the most a row "
                "may hold (max_row_bytes): is the file "
                "CSV, with its line ends?");
  EXPECT_EQ(read("h\n,,,,,\n", 5), "h|,,,,,|");
}

// Rows without quotes or a bare CR are split in the reader's buffer
// (ReadFields' in-place path), the others byte by byte; rows of both kinds
// next to each other, quotes inside an unquoted field (bytes like any
// other), bare CR and CRLF ends, blank lines, a trailing delimiter, and
// rows across the 64 KiB buffers' edges read as the grammar says.
TEST(CsvReaderTest, RowsReadInPlaceAndByteByByteAlike) {
  testing::TempDir dir;
  std::mt19937 rng(12);
  for (const char delimiter : {',', ';'}) {
    std::vector<std::vector<std::string>> rows;
    std::vector<uint64_t> lines;
    std::string text;
    uint64_t line = 1;
    bool bare_cr = false;  // the last row ended in a lone CR
    for (int r = 0; r < 3000; ++r) {
      // A blank line; after a lone CR an LF would make it a CRLF.
      if (rng() % 8 == 0) {
        text += bare_cr ? "\r" : rng() % 2 ? "\n" : "\r\n";
        ++line;
      }
      std::vector<std::string>& row = rows.emplace_back();
      lines.push_back(line);
      const int fields = 1 + static_cast<int>(rng() % 6);
      for (int f = 0; f < fields; ++f) {
        const size_t n = rng() % 200 == 0 ? 10000 + rng() % 60000 : rng() % 12;
        std::string field;
        for (size_t i = 0; i < n; ++i) {
          // A quote only after the field's first byte: bytes, unquoted.
          field += i > 0 && rng() % 20 == 0
                       ? '"'
                       : static_cast<char>('a' + rng() % 26);
        }
        if (f > 0) text += delimiter;
        // Some quoted, holding a delimiter, a CR or a quote of their own.
        if (rng() % 25 == 0 || (fields == 1 && field.empty())) {
          field += std::string("x") + (rng() % 2 ? delimiter : '\r') + "\"";
          text += '"';
          for (const char c : field)
            text += c == '"' ? "\"\"" : std::string(1, c);
          text += '"';
        } else {
          text += field;
        }
        row.push_back(std::move(field));
      }
      const unsigned end = rng() % 3;
      text += end == 0 ? "\n" : end == 1 ? "\r\n" : "\r";
      bare_cr = end == 2;
      ++line;
    }
    const std::string path = dir.File("rows.csv");
    testing::WriteFileBytes(path, text);
    CsvReader reader(path, delimiter);
    ASSERT_NO_FATAL_FAILURE(ExpectRows(&reader, rows, lines));
  }
}

// Compressed files read as their plain bytes, by their name's suffix or as
// told; a stream damaged part-way gives the rows before it, then an error
// naming the file (never an early end).  Bare \r line ends put back the
// byte after them.  Its \r\n, split across the
// reader's 64 KiB buffers, still ends one row.
TEST(CsvReaderTest, CompressedFilesReadAsPlainOnesAndDamageIsAnError) {
  testing::TempDir dir;
  std::string rows_text;
  for (int i = 0; i < 20000; ++i) {
    rows_text += std::to_string(i) + ",\"n " + std::to_string(i) + "\"\r\n";
  }
  // The header's second name is padded so that a row's \r is the last byte
  // of the first buffer and its \n the first of the next.
  const std::string header = "id,name\r\n";
  const size_t last_cr = rows_text.rfind('\r', (64 << 10) - 1 - header.size());
  const std::string text =
      "id,name" + std::string((64 << 10) - 1 - header.size() - last_cr, 'x') +
      "\r\n" + rows_text;
  ASSERT_EQ(text.substr((64 << 10) - 1, 2), "\r\n");
  const auto rows = [](CsvReader& reader) {
    std::vector<std::string> fields;
    uint64_t line = 0;
    int64_t n = 0;
    while (reader.ReadRecord(&fields, &line)) {
      EXPECT_EQ(fields.size(), 2u) << line;
      EXPECT_EQ(line, static_cast<uint64_t>(n + 1));
      ++n;
    }
    return n;
  };
  for (const Compression c : testing::kAllCompressions) {
    SCOPED_TRACE(std::string(CompressionName(c)));
    const std::string named =
        dir.File("a.csv" + std::string(CompressionSuffix(c)));
    testing::WriteFileBytes(named, testing::Compressed(text, c));
    CsvReader by_name(named);
    EXPECT_EQ(rows(by_name), 20001);
    testing::WriteFileBytes(dir.File("data"), testing::Compressed(text, c));
    CsvReader told(dir.File("data"), ',', c);
    EXPECT_EQ(rows(told), 20001);
  }
  {  // old Mac line ends (a bare \r), and where the reader has got to
    testing::WriteFileBytes(dir.File("cr.csv"), "a,b\r1,2\r\r3,4");
    CsvReader reader(dir.File("cr.csv"));
    std::vector<std::string> fields;
    uint64_t line = 0;
    ASSERT_TRUE(reader.ReadRecord(&fields, &line));
    EXPECT_EQ(reader.position(), 4u);  // the header and its \r
    ASSERT_TRUE(reader.ReadRecord(&fields, &line));
    EXPECT_EQ(fields, (std::vector<std::string>{"1", "2"}));
    ASSERT_TRUE(reader.ReadRecord(&fields, &line));
    EXPECT_EQ(fields, (std::vector<std::string>{"3", "4"}));
    EXPECT_EQ(line, 4u);
    EXPECT_EQ(reader.position(), 12u);  // the whole file
    EXPECT_FALSE(reader.ReadRecord(&fields, &line));
  }
  const std::string gz = testing::Compressed(text, Compression::kGzip);
  testing::WriteFileBytes(dir.File("cut.csv.gz"), gz.substr(0, gz.size() / 2));
  CsvReader cut(dir.File("cut.csv.gz"));
  std::vector<std::string> fields;
  uint64_t line = 0;
  int64_t n = 0;
  try {
    while (cut.ReadRecord(&fields, &line)) ++n;
    FAIL() << "a cut gzip stream ended without an error after " << n;
  } catch (const CsvError& e) {
    EXPECT_FALSE(e.row_level());
    EXPECT_EQ(std::string(e.what()).rfind(dir.File("cut.csv.gz") + ": ", 0), 0u)
        << e.what();
    EXPECT_GT(n, 5000);
  }
}

TEST(CsvReaderTest, BlankLinesAreNoRows) {
  // An editor's trailing empty line made "1 fields, the header has 2", and
  // in a one-column file an empty Example: blank lines (LF, CRLF or CR)
  // are skipped, as csv.DictReader and pandas skip them, and lines keep
  // their numbers.  A quoted empty field is a row; so is a lone delimiter.
  testing::TempDir dir;
  const std::string path = dir.File("a.csv");
  std::ofstream(path, std::ios::binary)
      << "\xEF\xBB\xBF\n\nid\n1\r\n\r\n\"\"\n\r,\n2\n\n\n";
  CsvReader reader(path);
  std::vector<std::vector<std::string>> rows;
  std::vector<uint64_t> lines;
  std::vector<std::string> fields;
  uint64_t line = 0;
  while (reader.ReadRecord(&fields, &line)) {
    rows.push_back(fields);
    lines.push_back(line);
  }
  EXPECT_EQ(rows, (std::vector<std::vector<std::string>>{
                      {"id"}, {"1"}, {""}, {"", ""}, {"2"}}));
  EXPECT_EQ(lines, (std::vector<uint64_t>{3, 4, 6, 8, 9}));
}

TEST(CsvReaderTest, AnotherDelimiterSeparatesFieldsAndNamesItself) {
  testing::TempDir dir;
  const std::string path = dir.File("a.txt");
  std::ofstream(path, std::ios::binary) << "a;b\n\"x;y\";z,w\n\xe9;\"q\"r\n";
  CsvReader reader(path, ';');
  std::vector<std::string> fields;
  uint64_t line = 0;
  ASSERT_TRUE(reader.ReadRecord(&fields, &line));
  EXPECT_EQ(fields, (std::vector<std::string>{"a", "b"}));
  ASSERT_TRUE(reader.ReadRecord(&fields, &line));
  EXPECT_EQ(fields, (std::vector<std::string>{"x;y", "z,w"}));
  try {
    reader.ReadRecord(&fields, &line);
    FAIL() << "a quote followed by text was accepted";
  } catch (const CsvError& e) {
    EXPECT_EQ(std::string(e.what()),
              path +
                  ":3: unexpected 'r' after a closing quote (a quoted "
                  "field ends at a ';' or the line's end)");
  }
  // A byte past 0x7f delimits too (Get() returns it as 0-255).
  const std::string high = dir.File("high.txt");
  std::ofstream(high, std::ios::binary) << "a\xa7"
                                           "b\n";
  CsvReader h(high, '\xa7');
  ASSERT_TRUE(h.ReadRecord(&fields, &line));
  EXPECT_EQ(fields, (std::vector<std::string>{"a", "b"}));
  for (char bad : {'"', '\n', '\r'}) {
    EXPECT_THROW(CsvReader(path, bad), Error) << int{bad};
  }
  EXPECT_EQ(CsvDelimiterName('\t'), "tab");
  EXPECT_EQ(CsvDelimiterName('\x01'), "byte 0x01");
}

// The file-level errors: the reader cannot go on past them.
TEST(CsvReaderTest, AnUnclosedQuoteOrABrokenByteOrderMarkEndsTheFile) {
  testing::TempDir dir;
  const auto error = [&](const std::string& bytes) {
    std::ofstream(dir.File("b.csv"), std::ios::binary) << bytes;
    CsvReader reader(dir.File("b.csv"));
    std::vector<std::string> fields;
    uint64_t line = 0;
    try {
      while (reader.ReadRecord(&fields, &line)) {
      }
    } catch (const CsvError& e) {
      return std::string(e.row_level() ? "row: " : "file: ") + e.what();
    }
    return std::string();
  };
  const std::string b = dir.File("b.csv");
  EXPECT_EQ(error("a\n\"1\n2\n"),
            "file: " + b + ":2: a quoted field is not closed");
  EXPECT_EQ(error("\xEF\xBBx,y\n"),
            "file: " + b + ":1: starts with a broken byte order mark");
  EXPECT_EQ(error("a\n\"1\"\xff\n"),
            "row: " + b +
                ":2: unexpected byte 0xff after a closing quote (a "
                "quoted field ends at a comma or the line's end)");
  // UTF-16, either byte order (Excel's "Unicode text"): said as such,
  // not as a header of NUL bytes.
  EXPECT_EQ(error(std::string("\xFF\xFEx\0,\0y\0\n\0", 10)),
            "file: " + b +
                ":1: starts with a UTF-16 byte order mark (FF FE); CSV is "
                "read as UTF-8: convert the file first (iconv -f UTF-16 -t "
                "UTF-8)");
  EXPECT_EQ(error(std::string("\xFE\xFF\0x\0,\0y\0\n", 10)),
            "file: " + b +
                ":1: starts with a UTF-16 byte order mark (FE FF); CSV is "
                "read as UTF-8: convert the file first (iconv -f UTF-16 -t "
                "UTF-8)");
  // Either byte alone is read as it is, as a cell's byte.
  EXPECT_EQ(error("\xFE"), "");
  for (const std::string text : {"\xFFx,y\n", "\xFE\xFE,y\n"}) {
    EXPECT_EQ(error(text), "");
    CsvReader reader(b);
    std::vector<std::string> fields;
    uint64_t line = 0;
    ASSERT_TRUE(reader.ReadRecord(&fields, &line));
    EXPECT_EQ(fields, (std::vector<std::string>{text.substr(0, 2), "y"}));
  }
}

}  // namespace
}  // namespace recflow::records
