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

// Entries that are no image of a class are left out, and said: files
// without an image's name, folders below a class folder, files beside the
// class folders, and a class folder without images (a label with no
// records).  Hidden names ('.') are passed over unsaid.
TEST(ImagesTest, WhatIsLeftOutIsSaid) {
  testing::TempDir dir;
  for (const char* d : {"imgs/cat/sub", "imgs/cat/.thumbs", "imgs/dog",
                        "imgs/empty", "imgs/owl"}) {
    std::filesystem::create_directories(dir.File(d));
  }
  const std::string png = testing::TinyPng();
  testing::WriteFileBytes(dir.File("imgs/cat/a.png"), png);
  testing::WriteFileBytes(dir.File("imgs/cat/sub/b.png"), png);
  testing::WriteFileBytes(dir.File("imgs/cat/z.gif"), "GIF89a");
  testing::WriteFileBytes(dir.File("imgs/cat/.DS_Store"), "");
  testing::WriteFileBytes(dir.File("imgs/owl/c.png"), png);
  testing::WriteFileBytes(dir.File("imgs/owl/notes.txt"), "x");
  testing::WriteFileBytes(dir.File("imgs/owl/b.webp"), "RIFF");
  testing::WriteFileBytes(dir.File("imgs/d.png"), png);
  testing::WriteFileBytes(dir.File("imgs/.hidden.png"), png);
  const auto source = OpenSource("images", {.files = {dir.File("imgs")}});
  EXPECT_EQ(source->rows(), 2u);
  EXPECT_EQ(
      source->warnings(),
      (std::vector<std::string>{
          "left out 3 files in class folders without a .jpg, .jpeg or .png "
          "name (the first: " +
              dir.File("imgs/cat/z.gif") + ")",
          "left out 1 folder inside class folders (" +
              dir.File("imgs/cat/sub") +
              "): images are read from each class folder itself, not from "
              "folders below it",
          "left out 1 file beside the class folders (" +
              dir.File("imgs/d.png") +
              "): an image's class is the folder it is in",
          "class folder 'dog' holds no images: its label 1 has no records",
          "class folder 'empty' holds no images: its label 2 has no records"}));
  // Nothing left out, nothing said.
  testing::TempDir clean;
  std::filesystem::create_directories(clean.File("imgs/cat"));
  testing::WriteFileBytes(clean.File("imgs/cat/a.png"), png);
  EXPECT_TRUE(OpenSource("images", {.files = {clean.File("imgs")}})
                  ->warnings()
                  .empty());
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
