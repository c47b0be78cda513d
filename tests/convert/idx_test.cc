// convert/idx.cc: MNIST-style images and labels, gzipped or not.
#include <gtest/gtest.h>
#include <zlib.h>

#include "convert_test_util.h"

namespace recflow::convert {
namespace {

using testing::Be32;
using testing::ConvertErrorOf;
using testing::Get;
using testing::SourceExamples;

void WriteGz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

TEST(IdxTest, ImagesAndLabelsBecomeImageLabelHeightWidth) {
  testing::TempDir dir;
  std::string images = Be32(0x803) + Be32(3) + Be32(2) + Be32(2);
  for (int i = 0; i < 3; ++i) images += std::string(4, static_cast<char>(i));
  WriteGz(dir.File("images.gz"), images);
  testing::WriteFileBytes(dir.File("labels"),
                          Be32(0x801) + Be32(3) + std::string("\x07\x08\x09"));
  const auto ex = SourceExamples(
      "idx", {.images = dir.File("images.gz"), .labels = dir.File("labels")});
  ASSERT_EQ(ex.size(), 3u);
  EXPECT_EQ(Get(ex[2], "image")->bytes_list().value(0), std::string(4, '\2'));
  EXPECT_EQ(Get(ex[2], "label")->int64_list().value(0), 9);
  EXPECT_EQ(Get(ex[0], "height")->int64_list().value(0), 2);
  EXPECT_EQ(Get(ex[0], "width")->int64_list().value(0), 2);
  testing::WriteFileBytes(dir.File("labels2"),
                          Be32(0x801) + Be32(2) + std::string("\x07\x08"));
  EXPECT_NE(ConvertErrorOf([&] {
              OpenSource("idx", {.images = dir.File("images.gz"),
                                 .labels = dir.File("labels2")});
            }).find("holds 3 images but"),
            std::string::npos);
  EXPECT_EQ(ConvertErrorOf([&] { OpenSource("idx", {}); }),
            "idx: give --images FILE and --labels FILE");
}

}  // namespace
}  // namespace recflow::convert
