// A real full disk: a 1 MiB tmpfs mounted for the test (root with
// CAP_SYS_ADMIN; skipped with the reason elsewhere, where IoFaultsTest's
// injected ENOSPC covers the same code).  Writers that run out of space
// fail with an IoError naming the file, the earlier file stays as it was,
// and nothing else is left on the file system.
#include <gtest/gtest.h>
#include <sys/mount.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "records/errors.h"
#include "records/index.h"
#include "records/tfrecord_writer.h"
#include "test_util.h"

namespace recflow::records {
namespace {

namespace fs = std::filesystem;

class FullDiskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    mount_point_ = dir_.File("small");
    fs::create_directories(mount_point_);
    if (mount("tmpfs", mount_point_.c_str(), "tmpfs", 0, "size=1m") != 0) {
      GTEST_SKIP() << "cannot mount a 1 MiB tmpfs at " << mount_point_ << " ("
                   << std::strerror(errno)
                   << "): it needs root with CAP_SYS_ADMIN; IoFaultsTest "
                      "injects ENOSPC into the same code instead";
    }
    mounted_ = true;
  }
  void TearDown() override {
    if (mounted_) umount2(mount_point_.c_str(), MNT_DETACH);
  }
  std::vector<std::string> List() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(mount_point_)) {
      out.push_back(e.path().filename().string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  testing::TempDir dir_;
  std::string mount_point_;
  bool mounted_ = false;
};

TEST_F(FullDiskTest, WritersOutOfSpaceKeepTheEarlierFileAndLeaveNothing) {
  const std::string path = mount_point_ + "/data.tfrecord";
  const auto small = testing::RandomPayloads(100, 1000, 1);
  testing::WriteRecords(path, small);
  const std::string before = testing::ReadFileBytes(path);
  WriteIndex(IndexPathFor(path), BuildIndex(path));
  const std::string index_before = testing::ReadFileBytes(IndexPathFor(path));
  for (Compression c : {Compression::kNone, Compression::kZstd}) {
    try {
      WriterOptions o;
      o.compression = c;
      TFRecordWriter w(path, o);
      // 2 MiB of incompressible records into what is left of 1 MiB.
      for (const auto& p : testing::RandomPayloads(2048, 2048, 2)) w.Write(p);
      w.Close();
      ADD_FAILURE() << "2 MiB fitted into a 1 MiB file system";
    } catch (const IoError& e) {
      EXPECT_EQ(e.path(), path);
      EXPECT_EQ(e.errno_value(), ENOSPC) << e.what();
    }
    EXPECT_EQ(testing::ReadFileBytes(path), before);
    EXPECT_EQ(List(),
              (std::vector<std::string>{"data.tfrecord", "data.tfrecord.idx"}));
  }
  // An index too large for the space left.
  Index big;
  big.entries.resize(200'000, IndexEntry{.offset = 0, .size = 16});
  for (size_t i = 0; i < big.entries.size(); ++i) {
    big.entries[i].offset = i * 16;
  }
  EXPECT_THROW(WriteIndex(IndexPathFor(path), big), IoError);
  EXPECT_EQ(testing::ReadFileBytes(IndexPathFor(path)), index_before);
  EXPECT_EQ(List(),
            (std::vector<std::string>{"data.tfrecord", "data.tfrecord.idx"}));
  // And the space is all back: the same small file writes again.
  testing::WriteRecords(path, small);
  EXPECT_EQ(testing::ReadFileBytes(path), before);
}

}  // namespace
}  // namespace recflow::records
