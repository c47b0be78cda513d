// SIGKILL a writer (`recflow convert`) at random points
// while it replaces an earlier output: afterwards every file under a final
// name is byte for byte either the earlier version or the complete new one
// (never a partial file), and what else is left are hidden temporary files.
// (Checkpoint saves: tests/train/checkpoint_test.cc.)
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <random>
#include <thread>

#include "recflow_runner.h"
#include "test_util.h"

namespace recflow::tools {
namespace {

namespace fs = std::filesystem;
using testing::Recflow;
using testing::TempDir;
using Files = std::map<std::string, std::string>;  // name -> bytes

// The files of `dir` (not hidden ones), with their bytes.
Files Snapshot(const fs::path& dir) {
  Files out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name[0] != '.') out[name] = testing::ReadFileBytes(e.path().string());
  }
  return out;
}

void Restore(const fs::path& dir, const Files& files) {
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
void KillRepeatedly(const fs::path& work, const Files& old_files,
                    const Files& new_files, const std::string& args) {
  // How long a full run takes, to spread the kills over it.
  Restore(work, old_files);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_FALSE(RunAndKill(args, std::chrono::seconds(60)));
  const auto full = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::steady_clock::now() - start);
  ASSERT_EQ(Snapshot(work), new_files) << "the run itself is not repeatable";
  std::mt19937_64 rng(42);
  int killed = 0, mixed = 0;
  for (int trial = 0; trial < 12; ++trial) {
    Restore(work, old_files);
    const auto delay = std::chrono::microseconds(
        std::uniform_int_distribution<int64_t>(0, full.count())(rng));
    killed += RunAndKill(args, delay) ? 1 : 0;
    int from_old = 0, from_new = 0;
    for (const auto& [name, bytes] : Snapshot(work)) {
      const auto o = old_files.find(name);
      const auto n = new_files.find(name);
      const bool is_old = o != old_files.end() && o->second == bytes;
      const bool is_new = n != new_files.end() && n->second == bytes;
      EXPECT_TRUE(is_old || is_new)
          << name << " is neither version (" << bytes.size()
          << " bytes), killed after " << delay.count() << " us";
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
  const Files old_files = Snapshot(work);
  KillRepeatedly(
      work, old_files,
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

}  // namespace
}  // namespace recflow::tools
