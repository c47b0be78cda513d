#include "train/checkpoint.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "records/errors.h"
#include "records/io_faults.h"
#include "test_util.h"
#include "train/event_writer.h"

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
  } catch (const recflow::Error& e) {  // train::Error or records::IoError
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

// Through the fault seam: a save that fails at any write, fsync or rename
// leaves the previous checkpoint and state file as they were.
TEST(CheckpointManagerTest, AModelDirThatCannotBeAFolderIsNamed) {
  // A file in the way was a bare "filesystem error: cannot create
  // directories"; the model directory and the event writer name it.
  testing::TempDir dir;
  testing::WriteFileBytes(dir.File("file"), "x");
  for (const std::string& model_dir :
       {dir.File("file"), dir.File("file") + "/sub"}) {
    try {
      CheckpointManager m(model_dir, 2);
      ADD_FAILURE() << model_dir;
    } catch (const records::IoError& e) {
      EXPECT_EQ(std::string(e.what()),
                model_dir + ": cannot create this folder: Not a directory");
    }
    EXPECT_THROW(EventWriter(model_dir, 1.0), records::IoError);
  }
}

TEST(CheckpointManagerTest, FailedSavesKeepThePreviousCheckpoint) {
  struct Kind {
    records::IoOp op;
    int error;
  };
  for (const Kind kind :
       {Kind{records::IoOp::kWrite, ENOSPC}, Kind{records::IoOp::kWrite, EIO},
        Kind{records::IoOp::kSync, EIO}, Kind{records::IoOp::kRename, EIO}}) {
    for (uint64_t every : {1, 2, 3, 4}) {
      SCOPED_TRACE(
          fmt::format("{} every {}", records::IoOpName(kind.op), every));
      testing::TempDir dir;
      CheckpointManager m(dir.path().string(), 2);
      TensorMap older = Sample();
      older["global_step"] = Tensor::Scalar<int64_t>(10);
      m.Save(10, older);
      const std::string state = testing::ReadFileBytes(dir.File("checkpoint"));
      TensorMap newer = Sample();
      newer["global_step"] = Tensor::Scalar<int64_t>(20);
      records::NthCallFaults faults(kind.op, every, kind.error);
      bool failed = false;
      {
        records::ScopedIoFaults scope(&faults);
        try {
          m.Save(20, newer);
        } catch (const records::IoError& e) {
          failed = true;
          EXPECT_EQ(e.errno_value(), kind.error);
          EXPECT_NE(std::string(e.what()).find(dir.path().string()),
                    std::string::npos);
        }
      }
      EXPECT_EQ(failed, faults.faults() > 0);
      auto restored = m.RestoreLatest(nullptr);
      ASSERT_TRUE(restored);
      const int64_t step =
          restored->tensors.at("global_step").scalar<int64_t>();
      if (failed && testing::ReadFileBytes(dir.File("checkpoint")) == state) {
        EXPECT_EQ(step, 10);
      } else {
        // Only a failed fsync of the directory after the state file's
        // rename: the new state is in place, complete.
        EXPECT_EQ(step, 20);
      }
      // No temporary file left; a complete model.ckpt-20 may stay when
      // only the state file's write failed (the next save replaces it).
      for (const auto& name : dir.List()) {
        EXPECT_NE(name[0], '.') << name;
        EXPECT_NO_THROW(ReadCheckpoint(
            dir.File(name == "checkpoint" ? "model.ckpt-10" : name)));
      }
    }
  }
}

TEST(CheckpointManagerTest, ReadsTensorFlowTwosStateFileAndRefusesDamage) {
  EXPECT_EQ(
      ParseCheckpointState("model_checkpoint_path: \"ckpt-3\"\n"
                           "all_model_checkpoint_paths: \"ckpt-2\"\n"
                           "all_model_checkpoint_paths: \"ckpt-3\"\n"
                           "all_model_checkpoint_timestamps: 1700000000.5\n"
                           "all_model_checkpoint_timestamps: 1700000100.25\n"
                           "last_preserved_timestamp: 1699999999.0\n",
                           "checkpoint"),
      (std::vector<std::string>{"ckpt-2", "ckpt-3"}));
  EXPECT_EQ(ParseCheckpointState("model_checkpoint_path: \"a\"\r\n", "c"),
            std::vector<std::string>{"a"});
  for (const char* bad :
       {"model_checkpoint_path \"x\"\n", "model_checkpoint_path: x\n", "junk\n",
        "all_model_checkpoint_paths: \"\"\n",
        "model_checkpoint_path: \"a\"b\"\n", "\x01\x02\x03"}) {
    try {
      ParseCheckpointState(bad, "dir/checkpoint");
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("dir/checkpoint: line 1"),
                std::string::npos)
          << e.what();
    }
  }
  // A damaged state file stops the restore instead of starting afresh.
  testing::TempDir dir;
  CheckpointManager m(dir.path().string(), 2);
  m.Save(1, Sample());
  testing::WriteFileBytes(dir.File("checkpoint"), "\x7f\x45garbage");
  EXPECT_THROW(m.RestoreLatest(nullptr), Error);
}

TEST(CheckpointTest, HostileShapesAreRefusedWithoutOverflow) {
  testing::TempDir dir;
  WriteCheckpoint(dir.File("c"), Sample());
  const std::string good = testing::ReadFileBytes(dir.File("c"));
  // The first entry (sorted: "_input_iterator_state", uint8 rank 1) has its
  // one dimension at byte 8 + 8 + 4 + 21 + 1 + 1.
  const size_t dim_at = 8 + 8 + 4 + 21 + 2;
  for (int64_t dim : {int64_t{-1}, int64_t{1} << 62, INT64_MAX, INT64_MIN}) {
    std::string bad = good;
    std::memcpy(bad.data() + dim_at, &dim, 8);
    try {
      ParseCheckpoint(bad, "c");
      ADD_FAILURE() << dim;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("_input_iterator_state"),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace recflow::train
