#include "records/file.h"

#include <gtest/gtest.h>

#include "records/errors.h"
#include "test_util.h"

namespace recflow::records {
namespace {

using testing::TempDir;

TEST(WritableFileTest, AtomicFileAppearsOnlyOnClose) {
  TempDir dir;
  const std::string path = dir.File("out.bin");
  {
    WritableFile f(path, /*atomic=*/true);
    f.Append("hello");
    EXPECT_FALSE(std::filesystem::exists(path));
    f.Close();
  }
  EXPECT_EQ(testing::ReadFileBytes(path), "hello");
  EXPECT_EQ(dir.List(), std::vector<std::string>{"out.bin"});
}

TEST(WritableFileTest, DestroyedWithoutCloseLeavesNothing) {
  TempDir dir;
  for (bool atomic : {true, false}) {
    {
      WritableFile f(dir.File("out.bin"), atomic);
      f.Append("partial");
    }
    EXPECT_TRUE(dir.List().empty()) << "atomic=" << atomic;
  }
}

TEST(WritableFileTest, FailedWriterNeverReplacesAGoodFile) {
  TempDir dir;
  const std::string path = dir.File("good.bin");
  testing::WriteFileBytes(path, "good");
  {
    WritableFile f(path, /*atomic=*/true);
    f.Append("half of a new version");
  }
  EXPECT_EQ(testing::ReadFileBytes(path), "good");
  EXPECT_EQ(dir.List(), std::vector<std::string>{"good.bin"});
}

TEST(WritableFileTest, FinishedButUncommittedLeavesNothing) {
  TempDir dir;
  {
    WritableFile f(dir.File("out.bin"), /*atomic=*/true);
    f.Append("x");
    f.Finish();
  }
  EXPECT_TRUE(dir.List().empty());
}

TEST(WritableFileTest, ErrorsNameThePath) {
  // Below a file, not a folder: no folder can be made there.
  const std::string path = "/dev/null/for-recflow/out.bin";
  try {
    WritableFile f(path, true);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_EQ(e.path(), path);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
    EXPECT_EQ(e.errno_value(), ENOTDIR);
  }
}

TEST(WritableFileTest, CreatesMissingFoldersAboveThePath) {
  TempDir dir;
  for (bool atomic : {true, false}) {
    const std::string path = dir.File(atomic ? "a/b/c/out.bin" : "d/e/out.bin");
    WritableFile f(path, atomic);
    f.Append("x");
    f.Close();
    EXPECT_EQ(testing::ReadFileBytes(path), "x") << "atomic=" << atomic;
  }
  // A file where a folder should be: one error, naming the final path and
  // the folder.
  testing::WriteFileBytes(dir.File("plain"), "");
  try {
    WritableFile f(dir.File("plain/sub/out.bin"), /*atomic=*/true);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_EQ(e.path(), dir.File("plain/sub/out.bin"));
    EXPECT_NE(std::string(e.what()).find("plain/sub"), std::string::npos)
        << e.what();
  }
}

TEST(ReadableFileTest, ReadsAtOffsetsAndReportsSize) {
  TempDir dir;
  testing::WriteFileBytes(dir.File("f"), "0123456789");
  ReadableFile f(dir.File("f"));
  EXPECT_EQ(f.size(), 10u);
  char buf[4];
  EXPECT_EQ(f.ReadAt(6, buf, 4), 4u);
  EXPECT_EQ(std::string(buf, 4), "6789");
  EXPECT_EQ(f.ReadAt(8, buf, 4), 2u);
  EXPECT_THROW(ReadableFile(dir.File("missing")), IoError);
  EXPECT_THROW(ReadableFile(dir.path().string()), IoError);
}

}  // namespace
}  // namespace recflow::records
