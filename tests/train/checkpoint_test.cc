#include "train/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "records/errors.h"
#include "test_util.h"

namespace recflow::train {
namespace {

using pipeline::DType;
using pipeline::Shape;
using pipeline::Tensor;

TensorMap Sample() {
  TensorMap t;
  const float w[] = {1.5f, -2, 3, 0.25f, 5, 6};
  t["dense/kernel"] = Tensor::FromValues<float>(w, Shape{2, 3});
  t["global_step"] = Tensor::Scalar<int64_t>(1234);
  const uint8_t state[] = {0, 1, 2, 255};
  t["_input_iterator_state"] = Tensor::FromValues<uint8_t>(state, Shape{4});
  const double d[] = {1e300};
  t["f64"] = Tensor::FromValues<double>(d, Shape{1});
  return t;
}

std::string ErrorOf(const std::string& path) {
  try {
    ReadCheckpoint(path);
  } catch (const records::Error& e) {
    return e.what();
  }
  return "";
}

TEST(CheckpointTest, RoundTripsEveryNumericDtype) {
  testing::TempDir dir;
  WriteCheckpoint(dir.File("c"), Sample());
  const TensorMap back = ReadCheckpoint(dir.File("c"));
  ASSERT_EQ(back.size(), 4u);
  for (const auto& [name, t] : Sample()) EXPECT_EQ(back.at(name), t) << name;
  // Nothing else was left in the directory (no temporary file).
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()),
                          std::filesystem::directory_iterator()),
            1);
}

TEST(CheckpointTest, EveryTruncationAndAnyFlippedByteIsFound) {
  testing::TempDir dir;
  WriteCheckpoint(dir.File("c"), Sample());
  const std::string bytes = testing::ReadFileBytes(dir.File("c"));
  for (size_t n = 0; n < bytes.size(); ++n) {
    testing::WriteFileBytes(dir.File("t"), bytes.substr(0, n));
    EXPECT_NE(ErrorOf(dir.File("t")), "") << "truncated to " << n;
  }
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string damaged = bytes;
    damaged[i] ^= 0x10;
    testing::WriteFileBytes(dir.File("d"), damaged);
    EXPECT_NE(ErrorOf(dir.File("d")), "") << "byte " << i;
  }
  // A damaged value names the entry and says CRC.
  std::string damaged = bytes;
  damaged[bytes.find("dense/kernel") + 20] ^= 1;
  testing::WriteFileBytes(dir.File("d"), damaged);
  const std::string e = ErrorOf(dir.File("d"));
  EXPECT_NE(e.find("(dense/kernel)"), std::string::npos) << e;
  EXPECT_NE(e.find("CRC"), std::string::npos) << e;
}

TEST(CheckpointTest, BytesTensorsAreRefused) {
  testing::TempDir dir;
  TensorMap t;
  t["s"] = Tensor::BytesScalar("x");
  EXPECT_THROW(WriteCheckpoint(dir.File("c"), t), Error);
  EXPECT_FALSE(std::filesystem::exists(dir.File("c")));
}

TEST(CheckpointManagerTest, KeepsTheNewestAndWritesTensorFlowsStateFile) {
  testing::TempDir dir;
  CheckpointManager m(dir.path().string(), 2);
  EXPECT_FALSE(m.Latest());
  for (int64_t step : {10, 20, 30}) m.Save(step, Sample());
  EXPECT_EQ(testing::ReadFileBytes(dir.File("checkpoint")),
            "model_checkpoint_path: \"model.ckpt-30\"\n"
            "all_model_checkpoint_paths: \"model.ckpt-20\"\n"
            "all_model_checkpoint_paths: \"model.ckpt-30\"\n");
  EXPECT_FALSE(std::filesystem::exists(dir.File("model.ckpt-10")));
  EXPECT_EQ(m.Checkpoints(),
            (std::vector<std::string>{dir.File("model.ckpt-20"),
                                      dir.File("model.ckpt-30")}));
  EXPECT_EQ(CheckpointStep(*m.Latest()), 30);

  // The newest damaged: the previous one, with a warning; all damaged: an
  // error rather than a silent fresh start.
  testing::WriteFileBytes(dir.File("model.ckpt-30"), "RFCKPT01 junk");
  std::vector<std::string> warnings;
  auto restored =
      m.RestoreLatest([&](std::string_view w) { warnings.emplace_back(w); });
  ASSERT_TRUE(restored);
  EXPECT_EQ(restored->path, dir.File("model.ckpt-20"));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("model.ckpt-30"), std::string::npos);
  std::filesystem::remove(dir.File("model.ckpt-20"));
  EXPECT_THROW(m.RestoreLatest(nullptr), Error);
}

}  // namespace
}  // namespace recflow::train
