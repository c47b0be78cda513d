// Dataset::FromCsv (csv_dataset.cc): typed columns, as tf.data's CsvDataset.
#include <gtest/gtest.h>

#include "pipeline/dataset.h"
#include "pipeline_test_util.h"
#include "test_util.h"

namespace recflow::pipeline {
namespace {

using testing::Collect;

TEST(CsvDatasetTest, CsvRowsBecomeTypedScalars) {
  testing::TempDir dir;
  testing::WriteFileBytes(dir.File("a.csv"),
                          "id,score,name\n1,0.5,\"x, y\"\n2,1.5,z\n");
  auto out = Collect(Dataset::FromCsv({dir.File("a.csv")}));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0]["id"].dtype(), DType::kInt64);
  EXPECT_EQ(out[1]["id"].scalar<int64_t>(), 2);
  EXPECT_FLOAT_EQ(out[1]["score"].scalar<float>(), 1.5f);
  EXPECT_EQ(out[0]["name"].bytes(0), "x, y");
  testing::WriteFileBytes(dir.File("b.csv"), "id,score,name\n3,oops,w\n");
  CsvOptions o;
  try {
    Collect(Dataset::FromCsv({dir.File("a.csv"), dir.File("b.csv")}, o));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("b.csv:2: column 'score'"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace recflow::pipeline
