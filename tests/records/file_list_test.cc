#include "records/file_list.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "records/errors.h"
#include "records/index.h"
#include "test_util.h"

namespace recflow::records {
namespace {

using testing::TempDir;

// Runs `fn`, which must not open the named pipe `fifo`: opening one for
// reading waits for a writer.  If `fn` has not returned after a few
// seconds, a writer is opened so that it can return, and the test fails.
template <typename Fn>
void WithoutOpening(const std::string& fifo, Fn fn) {
  std::atomic<bool> done = false;
  bool released = false;
  std::thread guard([&] {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (done) return;
    released = true;
    // Non-blocking: succeeds once the stuck reader is there.
    for (int tries = 0; tries < 100; ++tries) {
      const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
      if (fd >= 0) {
        ::close(fd);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  try {
    fn();
  } catch (...) {
    done = true;
    guard.join();
    EXPECT_FALSE(released) << fifo << " was opened";
    throw;
  }
  done = true;
  guard.join();
  EXPECT_FALSE(released) << fifo << " was opened";
}

TEST(FileListTest, RequireRegularFilesNamesThePipeAndWhyWithoutOpeningIt) {
  TempDir dir;
  testing::WriteFileBytes(dir.File("a.tfrecord"), "");
  const std::string fifo = dir.File("pipe.tfrecord");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  WithoutOpening(fifo, [&] {
    try {
      RequireRegularFiles({dir.File("a.tfrecord"), fifo}, "it is read twice");
      ADD_FAILURE() << "a named pipe was accepted";
    } catch (const IoError& e) {
      EXPECT_EQ(e.path(), fifo);
      EXPECT_EQ(std::string(e.what()),
                fifo +
                    ": not a regular file (a pipe, socket or device): it is "
                    "read twice; write it to a file first");
    }
  });
  // A character device, as /dev/stdin is when nothing is redirected.
  EXPECT_THROW(RequireRegularFiles({"/dev/null"}, "x"), IoError);
}

TEST(FileListTest, RequireRegularFilesLeavesOtherProblemsToTheReaders) {
  TempDir dir;
  testing::WriteFileBytes(dir.File("a.tfrecord"), "x");
  std::filesystem::create_symlink(dir.File("a.tfrecord"), dir.File("link"));
  // Regular files, links to them, missing names and directories pass: a
  // reader names the missing file, the expansion the empty directory.
  EXPECT_NO_THROW(
      RequireRegularFiles({dir.File("a.tfrecord"), dir.File("link"),
                           dir.File("missing"), dir.path().string()},
                          "x"));
  // A link to a pipe is a pipe.
  ASSERT_EQ(::mkfifo(dir.File("pipe").c_str(), 0600), 0);
  std::filesystem::create_symlink(dir.File("pipe"), dir.File("to-pipe"));
  EXPECT_THROW(RequireRegularFiles({dir.File("to-pipe")}, "x"), IoError);
}

TEST(FileListTest, AnIndexOfAPipeIsRefusedWithoutWaitingForAWriter) {
  TempDir dir;
  const std::string fifo = dir.File("pipe.tfrecord");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  WithoutOpening(fifo, [&] {
    try {
      BuildIndex(fifo);
      ADD_FAILURE() << "a pipe was indexed";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("not a regular file"),
                std::string::npos)
          << e.what();
    }
  });
}

TEST(FileListTest, FindFileNamedTwiceSeesThroughOtherSpellings) {
  TempDir dir;
  testing::WriteFileBytes(dir.File("a"), "x");
  testing::WriteFileBytes(dir.File("b"), "x");
  EXPECT_FALSE(FindFileNamedTwice({dir.File("a"), dir.File("b")}));
  const auto twice =
      FindFileNamedTwice({dir.File("a"), dir.File("b"),
                          dir.path().string() + "/./a", dir.File("c")});
  ASSERT_TRUE(twice);
  EXPECT_EQ(twice->first, dir.path().string() + "/./a");
  EXPECT_EQ(twice->second, dir.File("a"));
}

}  // namespace
}  // namespace recflow::records
