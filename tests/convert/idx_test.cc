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

// Every damaged input fails with the file's name and what was expected
// there; none is converted short.
TEST(IdxTest, DamagedFilesAreNamedWithWhatWasExpected) {
  testing::TempDir dir;
  std::string pixels;
  for (int i = 0; i < 3; ++i) pixels += std::string(4, static_cast<char>(i));
  const std::string images = Be32(0x803) + Be32(3) + Be32(2) + Be32(2);
  const std::string labels = Be32(0x801) + Be32(3);
  const auto error = [&](const std::string& image_bytes,
                         const std::string& label_bytes) {
    WriteGz(dir.File("i.gz"), image_bytes);
    testing::WriteFileBytes(dir.File("l"), label_bytes);
    return ConvertErrorOf([&] {
      SourceExamples("idx",
                     {.images = dir.File("i.gz"), .labels = dir.File("l")});
    });
  };
  const std::string i = dir.File("i.gz"), l = dir.File("l");
  // Whole files convert: the cases below differ from this one only where
  // they say.
  EXPECT_EQ(error(images + pixels, labels + "abc"), "");
  EXPECT_EQ(
      error(Be32(0x802) + Be32(3) + Be32(2) + Be32(2) + pixels, labels + "abc"),
      i + ": not an IDX file of unsigned bytes with 3 dimensions (magic "
          "0x00000802, expected 0x00000803)");
  EXPECT_EQ(error(Be32(0x803) + Be32(3) + Be32(0) + Be32(2), labels + "abc"),
            i + ": implausible image size 0x2");
  EXPECT_EQ(error(images.substr(0, 10), labels + "abc"),
            i + ": truncated IDX header");
  EXPECT_EQ(error(images + pixels, Be32(0x803) + Be32(3) + "abc"),
            l + ": not an IDX file of unsigned bytes with 1 dimension (magic "
                "0x00000803, expected 0x00000801)");
  EXPECT_EQ(error(images + pixels.substr(0, 10), labels + "abc"),
            i + ": data ends inside image 2 of 3");
  EXPECT_EQ(error(images + pixels, labels + "ab"),
            l + ": data ends at label 2 of 3");
  EXPECT_EQ(error(images + pixels + "x", labels + "abc"),
            i + ": more data after the 3 images its header counts");
  EXPECT_EQ(error(images + pixels, labels + "abcd"),
            l + ": more data after the 3 labels its header counts");
  // A gzip stream cut short: zlib's own words follow.
  WriteGz(dir.File("whole.gz"), images + pixels);
  const std::string gz = testing::ReadFileBytes(dir.File("whole.gz"));
  testing::WriteFileBytes(i, gz.substr(0, gz.size() - 12));
  testing::WriteFileBytes(l, labels + "abc");
  const std::string cut = ConvertErrorOf(
      [&] { SourceExamples("idx", {.images = i, .labels = l}); });
  EXPECT_EQ(cut.rfind(i + ": ", 0), 0u) << cut;
  EXPECT_EQ(ConvertErrorOf([&] {
              OpenSource("idx", {.images = dir.File("none"), .labels = l});
            }),
            dir.File("none") + ": cannot open: No such file or directory");
}

}  // namespace
}  // namespace recflow::convert
