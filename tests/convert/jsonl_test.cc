// convert/jsonl.cc: one object per line, lists, nulls and widening.
#include <gtest/gtest.h>

#include "convert_test_util.h"

namespace recflow::convert {
namespace {

using testing::ConvertErrorOf;
using testing::Get;
using testing::SourceExamples;

TEST(JsonlTest, ListsNullsBooleansAndWidening) {
  testing::TempDir dir;
  testing::WriteFileBytes(
      dir.File("in.jsonl"),
      "{\"x\": 1, \"v\": [1, 2], \"s\": \"a\", \"b\": true}\n"
      "{\"x\": 2.5, \"v\": [3.5], \"s\": [\"b\", \"c\"], "
      "\"b\": null}\n");
  const auto ex = SourceExamples("jsonl", {.files = {dir.File("in.jsonl")}});
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_FLOAT_EQ(Get(ex[0], "x")->float_list().value(0), 1.0f);
  EXPECT_EQ(Get(ex[0], "v")->float_list().value_size(), 2);
  EXPECT_EQ(Get(ex[1], "s")->bytes_list().value(1), "c");
  EXPECT_EQ(Get(ex[0], "b")->int64_list().value(0), 1);
  EXPECT_EQ(Get(ex[1], "b"), nullptr);
}

TEST(JsonlTest, ALineThatIsNotAnObjectNamesTheFileAndLine) {
  testing::TempDir dir;
  testing::WriteFileBytes(dir.File("bad.jsonl"), "{\"x\": 1}\n[1, 2]\n");
  EXPECT_NE(ConvertErrorOf([&] {
              SourceExamples("jsonl", {.files = {dir.File("bad.jsonl")}});
            }).find(dir.File("bad.jsonl") + ":2: expected one JSON "),
            std::string::npos);
}

}  // namespace
}  // namespace recflow::convert
