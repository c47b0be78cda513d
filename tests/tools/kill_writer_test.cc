// SIGKILL a writer (`recflow convert`, `recflow reshard`) at random points
// while it replaces an earlier output: afterwards every file under a final
// name is byte for byte either the earlier version or the complete new one
// (never a partial file), and what else is left are hidden temporary files.
// (Checkpoint saves: tests/train/checkpoint_test.cc.)
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <random>
#include <thread>

#include "recflow_runner.h"
#include "records/crc32c.h"
#include "test_util.h"

namespace recflow::tools {
namespace {

namespace fs = std::filesystem;
using testing::Recflow;
using testing::TempDir;
// name -> "SIZE bytes, crc32c CRC": files of several MB compare, and a
// failure prints, without holding (or diffing) their bytes.
using Files = std::map<std::string, std::string>;

std::string Fingerprint(const std::string& bytes) {
  return fmt::format("{} bytes, crc32c {:08x}", bytes.size(),
                     records::crc32c::Value(bytes.data(), bytes.size()));
}

// The files of `dir` (not hidden ones), with their fingerprints.
Files Snapshot(const fs::path& dir) {
  Files out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name[0] != '.') {
      out[name] = Fingerprint(testing::ReadFileBytes(e.path().string()));
    }
  }
  return out;
}

// A directory's files, bytes and all, to put back before each trial.
using Contents = std::map<std::string, std::string>;  // name -> bytes

Contents Read(const fs::path& dir) {
  Contents out;
  for (const auto& e : fs::directory_iterator(dir)) {
    out[e.path().filename().string()] =
        testing::ReadFileBytes(e.path().string());
  }
  return out;
}

void Restore(const fs::path& dir, const Contents& files) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& [name, bytes] : files) {
    testing::WriteFileBytes((dir / name).string(), bytes);
  }
}

std::string Csv(int rows, int salt) {
  std::string out = "id,x,name\n";
  for (int i = 0; i < rows; ++i) {
    out += fmt::format("{},{},row-{}-{}\n", i * salt, i * 0.25, salt, i);
  }
  return out;
}

// Runs `args` (a recflow command line) and SIGKILLs it after `delay`;
// returns whether it was killed (rather than done already).
bool RunAndKill(const std::string& args, std::chrono::microseconds delay) {
  const std::string cmd =
      fmt::format("exec {} {} > /dev/null 2>&1", RECFLOW_BINARY, args);
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), nullptr);
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + delay;
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (waitpid(pid, &status, WNOHANG) == pid) return false;  // done
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status);
}

// Replaces `old_files` in `work` by what `args` writes (`new_files` when it
// completes), killing it at random points; checks the invariant each time.
void KillRepeatedly(const fs::path& work, const Contents& old_contents,
                    const Files& new_files, const std::string& args) {
  const Files old_files = Snapshot(work);
  // How long a full run takes, to spread the kills over it: the fastest
  // of three, so that one run slowed by a busy machine (ctest -j runs other
  // tests beside this one) does not spread most kills past the end.
  auto full = std::chrono::microseconds::max();
  for (int run = 0; run < 3; ++run) {
    Restore(work, old_contents);
    const auto start = std::chrono::steady_clock::now();
    ASSERT_FALSE(RunAndKill(args, std::chrono::seconds(60)));
    full = std::min(full, std::chrono::duration_cast<std::chrono::microseconds>(
                              std::chrono::steady_clock::now() - start));
    ASSERT_EQ(Snapshot(work), new_files) << "the run itself is not repeatable";
  }
  std::mt19937_64 rng(42);
  int killed = 0, mixed = 0;
  for (int trial = 0; trial < 12; ++trial) {
    Restore(work, old_contents);
    const auto delay = std::chrono::microseconds(
        std::uniform_int_distribution<int64_t>(0, full.count())(rng));
    killed += RunAndKill(args, delay) ? 1 : 0;
    int from_old = 0, from_new = 0;
    for (const auto& [name, fingerprint] : Snapshot(work)) {
      const auto o = old_files.find(name);
      const auto n = new_files.find(name);
      const bool is_old = o != old_files.end() && o->second == fingerprint;
      const bool is_new = n != new_files.end() && n->second == fingerprint;
      EXPECT_TRUE(is_old || is_new)
          << name << " is neither version (" << fingerprint
          << "), killed after " << delay.count() << " us";
      from_old += is_old && !is_new;
      from_new += is_new && !is_old;
    }
    mixed += from_old > 0 && from_new > 0;
    for (const auto& e : fs::directory_iterator(work)) {
      const std::string name = e.path().filename().string();
      if (name[0] == '.') {
        EXPECT_NE(name.find(".tmp-"), std::string::npos) << name;
      }
    }
  }
  // The kills must have landed while it was writing, not only before or
  // after.
  EXPECT_GT(killed, 3);
  // Files are replaced one at a time by rename after all are complete, so
  // a kill during the renames can leave some old and some new files (each
  // complete): see docs/RELIABILITY.md.
  ::testing::Test::RecordProperty("mixed_old_and_new", mixed);
}

TEST(KillWriterTest, KilledConvertLeavesTheOldOrTheNewFilesNeverPartOfOne) {
  TempDir dir;
  testing::WriteFileBytes(dir.File("a.csv"), Csv(20'000, 1));
  testing::WriteFileBytes(dir.File("b.csv"), Csv(200'000, 3));
  const fs::path work = dir.path() / "work", ref = dir.path() / "ref";
  fs::create_directories(work);
  fs::create_directories(ref);
  const std::string opts = "-n 4 --index --compression zstd";
  ASSERT_EQ(Recflow(dir, fmt::format("convert csv {} -o {}/out {}",
                                     dir.File("a.csv"), work.string(), opts))
                .code,
            0);
  const Contents old_contents = Read(work);
  KillRepeatedly(
      work, old_contents,
      [&] {
        Restore(ref, {});
        EXPECT_EQ(
            Recflow(dir, fmt::format("convert csv {} -o {}/out {}",
                                     dir.File("b.csv"), ref.string(), opts))
                .code,
            0);
        return Snapshot(ref);
      }(),
      fmt::format("convert csv {} -o {}/out {}", dir.File("b.csv"),
                  work.string(), opts));
}

TEST(KillWriterTest, KilledReshardLeavesTheOldOrTheNewShardsNeverPartOfOne) {
  TempDir dir;
  testing::WriteFileBytes(dir.File("a.csv"), Csv(10'000, 1));
  testing::WriteFileBytes(dir.File("b.csv"), Csv(150'000, 3));
  const fs::path in = dir.path() / "in", work = dir.path() / "work",
                 ref = dir.path() / "ref";
  fs::create_directories(in);
  fs::create_directories(work);
  // Input: 3 uncompressed shards of b; the old output: a, resharded.
  ASSERT_EQ(Recflow(dir, fmt::format("convert csv {} -o {}/b -n 3",
                                     dir.File("b.csv"), in.string()))
                .code,
            0);
  ASSERT_EQ(Recflow(dir, fmt::format("convert csv {} -o {}/a -n 1",
                                     dir.File("a.csv"), dir.path().string()))
                .code,
            0);
  // zstd and uncompressed outputs: both byte-repeatable (gzip's header
  // holds a time).
  for (const char* compression : {"zstd", "none"}) {
    SCOPED_TRACE(compression);
    const std::string opts =
        fmt::format("-n 5 --index --compression {}", compression);
    Restore(work, {});
    ASSERT_EQ(Recflow(dir, fmt::format("reshard {} -o {}/part {}",
                                       dir.File("a-00000-of-00001.tfrecord"),
                                       work.string(), opts))
                  .code,
              0);
    const Contents old_contents = Read(work);
    ASSERT_FALSE(old_contents.empty());
    Restore(ref, {});
    ASSERT_EQ(Recflow(dir, fmt::format("reshard {} -o {}/part {}", in.string(),
                                       ref.string(), opts))
                  .code,
              0);
    KillRepeatedly(work, old_contents, Snapshot(ref),
                   fmt::format("reshard {} -o {}/part {}", in.string(),
                               work.string(), opts));
  }
}

}  // namespace
}  // namespace recflow::tools
