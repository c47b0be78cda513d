// records/csv_reader.h: RFC 4180 rows, and the one cell-type inference the
// converters and the pipeline's CSV source share.
#include "records/csv_reader.h"

#include <gtest/gtest.h>

#include <fstream>

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
    EXPECT_NE(std::string(e.what()).find(path + ":5:"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(CsvReader(dir.File("missing.csv")), CsvError);
}

}  // namespace
}  // namespace recflow::records
