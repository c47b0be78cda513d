// convert/npy.cc: .npy arrays side by side, and .npz archives of them read
// through libzip (stored and deflated members, damage, not a zip).
#include <gtest/gtest.h>

#include <filesystem>

#include "convert_test_util.h"

namespace recflow::convert {
namespace {

using testing::ConvertErrorOf;
using testing::Get;
using testing::NpyBytes;
using testing::Raw;
using testing::SourceExamples;
using testing::Zip;

const std::string kFeatures =
    NpyBytes("<f8", "(2, 2)", Raw(std::vector<double>{0.5, 1, 2, 4}));
const std::string kLabels =
    NpyBytes("<i8", "(2,)", Raw(std::vector<int64_t>{3, 9}));

TEST(NpyTest, ArraysSideBySideOneExamplePerRow) {
  testing::TempDir dir;
  testing::WriteFileBytes(dir.File("x.npy"), kFeatures);
  testing::WriteFileBytes(dir.File("y.npy"), kLabels);
  const auto ex =
      SourceExamples("npy", {.files = {dir.File("x.npy"), dir.File("y.npy")}});
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_EQ(Get(ex[1], "x")->float_list().value(1), 4.0f);
  EXPECT_EQ(Get(ex[1], "y")->int64_list().value(0), 9);
  testing::WriteFileBytes(dir.File("short.npy"),
                          NpyBytes("<f4", "(3,)", Raw(std::vector<float>{1})));
  EXPECT_NE(ConvertErrorOf([&] {
              SourceExamples("npy", {.files = {dir.File("short.npy")}});
            }).find("data ends before row 1 of 3"),
            std::string::npos);
}

// What an array is not: said with the file, never converted as something
// else or cut short.
TEST(NpyTest, ArraysThatAreNotWhatTheirHeaderSaysAreRefused) {
  testing::TempDir dir;
  const auto error = [&](const std::string& bytes) {
    testing::WriteFileBytes(dir.File("a.npy"), bytes);
    return ConvertErrorOf(
        [&] { SourceExamples("npy", {.files = {dir.File("a.npy")}}); });
  };
  const std::string a = dir.File("a.npy");
  EXPECT_EQ(error(testing::NpyBytesWithDescr("'<f4'", "(2,)",
                                             Raw(std::vector<float>{1, 2}))),
            "");
  EXPECT_EQ(error(testing::NpyBytesWithDescr("[('a', '<i4'), ('b', '<f4')]",
                                             "(2,)", std::string(16, '\0'))),
            a + ": header's descr is not a simple dtype (record arrays are "
                "not supported)");
  EXPECT_EQ(error(NpyBytes("<f4", "(2,)", Raw(std::vector<float>{1, 2, 3}))),
            a + ": more data after the 2 rows its header counts");
  EXPECT_EQ(error(NpyBytes(">i4", "(1,)", std::string(4, '\0'))),
            a + ": dtype '>i4': only little-endian arrays are supported (use "
                "arr.astype(arr.dtype.newbyteorder('<')))");
  EXPECT_EQ(error(NpyBytes("<c8", "(1,)", std::string(8, '\0'))),
            a + ": dtype '<c8' is not supported (floats, integers, bool and "
                "fixed-width byte or Unicode strings are)");
  EXPECT_EQ(error(NpyBytes("<i8", "()", std::string(8, '\0'))),
            a + ": a 0-d array has no rows to convert");
  EXPECT_EQ(error(std::string("\x93NUMPX\x01\x00\x10\x00", 10) +
                  std::string(16, ' ')),
            a + ": not a .npy file (no \\x93NUMPY magic)");
  std::string fortran =
      NpyBytes("<f4", "(1, 2)", Raw(std::vector<float>{1, 2}));
  fortran.replace(fortran.find("False"), 5, "True ");
  EXPECT_EQ(error(fortran), a + ": Fortran-ordered arrays are not supported "
                                "(save np.ascontiguousarray(arr))");
  // uint64 beyond int64: that row is bad (skippable), not wrapped.
  EXPECT_EQ(error(NpyBytes("<u8", "(2,)",
                           Raw(std::vector<uint64_t>{1, uint64_t{1} << 63}))),
            a + ": row 1: uint64 value 9223372036854775808 does not fit in "
                "int64");
  // Fixed-width byte strings lose their NUL padding only.
  testing::WriteFileBytes(
      a, NpyBytes("|S3", "(3,)", std::string("ab\0c\0\0\0\0\0", 9)));
  const auto ex = SourceExamples("npy", {.files = {a}});
  ASSERT_EQ(ex.size(), 3u);
  EXPECT_EQ(Get(ex[0], "a")->bytes_list().value(0), "ab");
  EXPECT_EQ(Get(ex[1], "a")->bytes_list().value(0), "c");
  EXPECT_EQ(Get(ex[2], "a")->bytes_list().value(0), "");
}

// An array is a feature named after its file or member: two of one name
// (x.npy from two folders, a member an archive holds twice) would leave
// only the second's values readable, and are refused.
TEST(NpyTest, TwoArraysOfOneNameAreRefused) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir.File("a"));
  std::filesystem::create_directories(dir.File("b"));
  testing::WriteFileBytes(dir.File("a/x.npy"), kLabels);
  testing::WriteFileBytes(dir.File("b/x.npy"), kLabels);
  testing::WriteFileBytes(dir.File("b/y.npy"), kLabels);
  EXPECT_EQ(ConvertErrorOf([&] {
              SourceExamples(
                  "npy", {.files = {dir.File("a/x.npy"), dir.File("b/y.npy"),
                                    dir.File("b/x.npy")}});
            }),
            dir.File("a/x.npy") + " and " + dir.File("b/x.npy") +
                " both name feature 'x'; feature names must differ");
  const std::string twice = dir.File("twice.npz");
  testing::WriteFileBytes(twice,
                          Zip({{"x.npy", kLabels}, {"x.npy", kLabels}}, false));
  EXPECT_EQ(ConvertErrorOf([&] { SourceExamples("npz", {.files = {twice}}); }),
            twice + ":x.npy and " + twice +
                ":x.npy both name feature 'x' (the archive holds it twice); "
                "feature names must differ");
}

TEST(NpyTest, NpzMembersStoredOrDeflated) {
  testing::TempDir dir;
  for (bool deflate : {false, true}) {
    const std::string path = dir.File(deflate ? "d.npz" : "s.npz");
    testing::WriteFileBytes(path, Zip({{"features.npy", kFeatures},
                                       {"notes.txt", "not an array"},
                                       {"labels.npy", kLabels}},
                                      deflate));
    const auto ex = SourceExamples("npz", {.files = {path}});
    ASSERT_EQ(ex.size(), 2u) << deflate;
    EXPECT_EQ(Get(ex[1], "features")->float_list().value(1), 4.0f);
    EXPECT_EQ(Get(ex[1], "labels")->int64_list().value(0), 9);
    EXPECT_EQ(Get(ex[0], "notes"), nullptr);
  }
}

TEST(NpyTest, DamagedOrForeignArchivesNameTheFileAndMember) {
  testing::TempDir dir;
  // A stored member whose last data byte changed: its CRC-32 disagrees.
  std::string zip = Zip({{"a.npy", kLabels}}, false);
  const size_t data = 30 + 5;  // local header + "a.npy"
  zip[data + kLabels.size() - 1] ^= 0x01;
  testing::WriteFileBytes(dir.File("crc.npz"), zip);
  EXPECT_EQ(ConvertErrorOf([&] {
              SourceExamples("npz", {.files = {dir.File("crc.npz")}});
            }),
            dir.File("crc.npz") +
                ": member a.npy: CRC-32 mismatch: the member's data is "
                "damaged");
  // A deflated member whose stream is garbage.
  zip = Zip({{"a.npy", kLabels}}, true);
  for (size_t i = data; i < data + 8; ++i) zip[i] = '\xff';
  testing::WriteFileBytes(dir.File("inflate.npz"), zip);
  const std::string inflate = ConvertErrorOf(
      [&] { SourceExamples("npz", {.files = {dir.File("inflate.npz")}}); });
  EXPECT_TRUE(inflate.starts_with(dir.File("inflate.npz") + ": member a.npy: "))
      << inflate;
  EXPECT_TRUE(
      inflate.ends_with("deflate data is corrupt") ||
      inflate.ends_with("CRC-32 mismatch: the member's data is damaged"))
      << inflate;
  testing::WriteFileBytes(dir.File("plain.npz"), kLabels);
  EXPECT_EQ(ConvertErrorOf(
                [&] { OpenSource("npz", {.files = {dir.File("plain.npz")}}); }),
            dir.File("plain.npz") + ": not a zip archive (.npz)");
  testing::WriteFileBytes(dir.File("none.npz"),
                          Zip({{"readme.txt", "hello"}}, false));
  EXPECT_EQ(ConvertErrorOf(
                [&] { OpenSource("npz", {.files = {dir.File("none.npz")}}); }),
            dir.File("none.npz") + ": no .npy members");
  EXPECT_NE(ConvertErrorOf([&] {
              OpenSource("npz", {.files = {dir.File("missing.npz")}});
            }).find("missing.npz: cannot open"),
            std::string::npos);
}

}  // namespace
}  // namespace recflow::convert
