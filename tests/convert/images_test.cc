// convert/images.cc: a folder per class of PNG and JPEG files.
#include <gtest/gtest.h>

#include <filesystem>

#include "convert_test_util.h"

namespace recflow::convert {
namespace {

using testing::ConvertErrorOf;
using testing::Get;
using testing::SourceExamples;

TEST(ImagesTest, ClassFoldersGiveLabelsSizesAndFormats) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir.File("imgs/cat"));
  std::filesystem::create_directories(dir.File("imgs/dog"));
  std::filesystem::create_directories(dir.File("imgs/.hidden"));
  const std::string png = testing::TinyPng();
  const std::string jpeg = testing::TinyJpeg();
  testing::WriteFileBytes(dir.File("imgs/cat/a.png"), png);
  testing::WriteFileBytes(dir.File("imgs/dog/b.JPG"), jpeg);
  testing::WriteFileBytes(dir.File("imgs/dog/notes.txt"), "ignored");
  EXPECT_EQ(ImageClassNames(dir.File("imgs")),
            (std::vector<std::string>{"cat", "dog"}));
  const auto ex = SourceExamples("images", {.files = {dir.File("imgs")}});
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_EQ(Get(ex[0], "image/encoded")->bytes_list().value(0), png);
  EXPECT_EQ(Get(ex[0], "image/format")->bytes_list().value(0), "png");
  EXPECT_EQ(Get(ex[0], "image/height")->int64_list().value(0), 3);
  EXPECT_EQ(Get(ex[0], "image/width")->int64_list().value(0), 4);
  EXPECT_EQ(Get(ex[1], "image/format")->bytes_list().value(0), "jpeg");
  EXPECT_EQ(Get(ex[1], "image/height")->int64_list().value(0), 5);
  EXPECT_EQ(Get(ex[1], "image/class/label")->int64_list().value(0), 1);
  EXPECT_EQ(Get(ex[1], "image/class/text")->bytes_list().value(0), "dog");
  EXPECT_EQ(Get(ex[1], "image/filename")->bytes_list().value(0), "b.JPG");
}

TEST(ImagesTest, ADirectoryWithoutClassFoldersIsRefused) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir.File("flat"));
  EXPECT_EQ(ConvertErrorOf([&] { ImageClassNames(dir.File("flat")); }),
            dir.File("flat") + ": no class subfolders");
  EXPECT_NE(ConvertErrorOf([&] {
              ImageClassNames(dir.File("nothing"));
            }).find("not a directory"),
            std::string::npos);
}

}  // namespace
}  // namespace recflow::convert
