// Golden tests on files written by TensorFlow tooling (../shared/fixtures).
#include <gtest/gtest.h>
#include <zlib.h>

#include "records/index.h"
#include "records/tfrecord_reader.h"
#include "test_util.h"

namespace recflow::records {
namespace {

std::string Fixture(const std::string& name) {
  const std::string dir = testing::FixturesDir();
  return dir.empty() ? "" : dir + "/tf/" + name;
}

#define REQUIRE_FIXTURES()                                      \
  if (testing::FixturesDir().empty())                           \
  GTEST_SKIP() << "fixtures not found at " RECFLOW_FIXTURES_DIR \
                  " (they live in shared/ beside the repository)"

std::string Gunzip(const std::string& path) {
  gzFile gz = gzopen(path.c_str(), "rb");
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(gz, buf, sizeof buf)) > 0) out.append(buf, n);
  gzclose(gz);
  return out;
}

TEST(FixturesTest, MnistExamplesMatchAnIndependentDecode) {
  REQUIRE_FIXTURES();
  const std::string path = Fixture("tfx_mnist_1000_example.tfrecord");
  const auto records = testing::ReadRecords(path);
  ASSERT_EQ(records.size(), 1000u);
  std::vector<std::string> reference;
  ASSERT_TRUE(
      testing::ReferenceDecode(testing::ReadFileBytes(path), &reference));
  EXPECT_EQ(records, reference);
  for (const auto& r : records) {
    ASSERT_NE(r.find("image_class"), std::string::npos);
    ASSERT_NE(r.find("image_floats"), std::string::npos);
    // 784 packed floats: at least 3136 bytes of payload.
    ASSERT_GT(r.size(), 3136u);
  }
}

TEST(FixturesTest, PenguinGzipExamplesMatchAnIndependentDecode) {
  REQUIRE_FIXTURES();
  const std::string path = Fixture("tfx_penguin_eval_example.tfrecord.gz");
  TFRecordReader probe(path);
  EXPECT_EQ(probe.compression(), Compression::kGzip);
  const auto records = testing::ReadRecords(path);
  ASSERT_EQ(records.size(), 100u);
  std::vector<std::string> reference;
  ASSERT_TRUE(testing::ReferenceDecode(Gunzip(path), &reference));
  EXPECT_EQ(records, reference);
  for (const auto& r : records) {
    for (const char* key :
         {"body_mass_g", "culmen_depth_mm", "culmen_length_mm",
          "flipper_length_mm", "species"}) {
      ASSERT_NE(r.find(key), std::string::npos) << key;
    }
  }
}

TEST(FixturesTest, MnistIndexAndRandomAccess) {
  REQUIRE_FIXTURES();
  const std::string path = Fixture("tfx_mnist_1000_example.tfrecord");
  const Index index = BuildIndex(path);
  ASSERT_EQ(index.entries.size(), 1000u);
  EXPECT_EQ(index.entries.back().offset + index.entries.back().size,
            std::filesystem::file_size(path));
  const auto records = testing::ReadRecords(path);
  IndexedReader reader(path, index);
  for (uint64_t i : {999u, 0u, 500u, 1u}) EXPECT_EQ(reader.Read(i), records[i]);
}

}  // namespace
}  // namespace recflow::records
