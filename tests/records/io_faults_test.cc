// Reads and writes through the fault seam (records/io_faults.h): failing
// calls (EIO, ENOSPC) at every n-th call give a clear error naming the file,
// never a crash, never a partial file under a final name, and never a good
// file replaced by a bad one; short reads and writes and EINTR change
// nothing at all.
#include "records/io_faults.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>

#include "records/errors.h"
#include "records/index.h"
#include "records/tfrecord_reader.h"
#include "records/tfrecord_writer.h"
#include "test_util.h"

namespace recflow::records {
namespace {

using testing::TempDir;

const std::vector<Compression>& AllCompressions() {
  static const std::vector<Compression> all = {
      Compression::kNone, Compression::kZlib, Compression::kGzip,
      Compression::kZstd};
  return all;
}

std::vector<std::string> Payloads() {
  return testing::RandomPayloads(300, 3000, /*seed=*/7);
}

// Reads every record with a small buffer, so that a file takes many reads.
std::vector<std::string> ReadSmallBuffered(const std::string& path,
                                           Compression c = Compression::kNone) {
  ReaderOptions o;
  o.buffer_bytes = 4096;
  o.compression = c;
  return testing::ReadRecords(path, o);
}

// Writes interrupted by a signal (EINTR) and then short, in turn.
class InterruptedThenShort final : public IoFaultInjector {
 public:
  IoFault Before(IoOp op, std::string_view, size_t) override {
    if (op != IoOp::kWrite) return {};
    ++calls_;
    if (calls_ % 2 == 1) return {.error = EINTR};
    return {.max_bytes = 5};
  }
  uint64_t calls() const { return calls_; }

 private:
  uint64_t calls_ = 0;
};

TEST(IoFaultsTest, NthCallFaultsCountsPerOperationAndPath) {
  NthCallFaults f(IoOp::kWrite, 3, ENOSPC, 1, "shard");
  EXPECT_EQ(f.Before(IoOp::kRead, "a/shard-1", 10).error, 0);
  EXPECT_EQ(f.Before(IoOp::kWrite, "a/other", 10).error, 0);
  EXPECT_EQ(f.Before(IoOp::kWrite, "a/shard-1", 10).error, 0);
  EXPECT_EQ(f.Before(IoOp::kWrite, "a/shard-1", 10).error, 0);
  EXPECT_EQ(f.Before(IoOp::kWrite, "a/shard-1", 10).error, ENOSPC);
  EXPECT_EQ(f.calls(), 3u);
  EXPECT_EQ(f.faults(), 1u);
  NthCallFaults shorter(IoOp::kRead, 1, 0, 5);
  EXPECT_EQ(shorter.Before(IoOp::kRead, "x", 10).max_bytes, 5u);
}

TEST(IoFaultsTest, ReadErrorsAtEveryNthCallNameTheFile) {
  TempDir dir;
  const auto payloads = Payloads();
  for (Compression c : AllCompressions()) {
    const std::string path =
        dir.File(fmt::format("data-{}.tfrecord", CompressionName(c)));
    testing::WriteRecords(path, payloads, c);
    for (uint64_t every : {1, 2, 3, 7, 20}) {
      NthCallFaults faults(IoOp::kRead, every, EIO);
      ScopedIoFaults scope(&faults);
      try {
        ReadSmallBuffered(path, c);
        // Only possible when the file takes fewer reads than `every`.
        EXPECT_EQ(faults.faults(), 0u);
        EXPECT_LT(faults.calls(), every);
      } catch (const IoError& e) {
        EXPECT_EQ(e.path(), path);
        EXPECT_EQ(e.errno_value(), EIO);
        EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
        EXPECT_NE(std::string(e.what()).find(std::strerror(EIO)),
                  std::string::npos)
            << e.what();
      }
      EXPECT_GE(faults.calls(), std::min<uint64_t>(every, 2));
    }
  }
}

TEST(IoFaultsTest, ShortReadsAndInterruptedReadsChangeNothing) {
  TempDir dir;
  const auto payloads = testing::RandomPayloads(60, 2000, 8);
  for (Compression c : AllCompressions()) {
    const std::string path = dir.File("data.tfrecord");
    testing::WriteRecords(path, payloads, c);
    for (size_t short_bytes : {size_t{1}, size_t{7}, size_t{1000}}) {
      NthCallFaults faults(IoOp::kRead, 2, 0, short_bytes);
      ScopedIoFaults scope(&faults);
      EXPECT_EQ(ReadSmallBuffered(path, c), payloads)
          << CompressionName(c) << " short " << short_bytes;
      EXPECT_GT(faults.faults(), 0u);
    }
    NthCallFaults interrupted(IoOp::kRead, 2, EINTR);
    ScopedIoFaults scope(&interrupted);
    EXPECT_EQ(ReadSmallBuffered(path, c), payloads);
    EXPECT_GT(interrupted.faults(), 0u);
  }
}

TEST(IoFaultsTest, IndexedReadsFailCleanlyAndSurviveShortReads) {
  TempDir dir;
  const auto payloads = testing::RandomPayloads(50, 500, 9);
  const std::string path = dir.File("data.tfrecord");
  testing::WriteRecords(path, payloads);
  Index index = BuildIndex(path);
  {
    NthCallFaults faults(IoOp::kRead, 1, 0, 3);
    ScopedIoFaults scope(&faults);
    IndexedReader reader(path, index);
    for (uint64_t i = 0; i < reader.size(); ++i) {
      EXPECT_EQ(reader.Read(i), payloads[i]);
    }
  }
  NthCallFaults faults(IoOp::kRead, 5, EIO);
  ScopedIoFaults scope(&faults);
  IndexedReader reader(path, index);
  try {
    for (uint64_t i = 0; i < reader.size(); ++i) reader.Read(i);
    ADD_FAILURE() << "no error after " << faults.calls() << " reads";
  } catch (const IoError& e) {
    EXPECT_EQ(e.path(), path);
    EXPECT_EQ(e.errno_value(), EIO);
  }
}

struct WriteFault {
  IoOp op;
  int error;
};

// Writes `payloads` to `path` through a writer; returns the error, if any.
std::optional<IoError> TryWrite(const std::string& path,
                                const std::vector<std::string>& payloads,
                                Compression c) {
  try {
    WriterOptions o;
    o.compression = c;
    o.zstd_frame_bytes = 4096;
    TFRecordWriter w(path, o);
    for (const auto& p : payloads) w.Write(p);
    w.Close();
  } catch (const IoError& e) {
    return e;
  }
  return std::nullopt;
}

TEST(IoFaultsTest, FailedWritesNeverReplaceAGoodFileNorLeaveAPartialOne) {
  TempDir dir;
  const auto good = testing::RandomPayloads(20, 100, 10);
  const auto payloads = Payloads();
  const std::string path = dir.File("data.tfrecord");
  const std::vector<WriteFault> kinds = {{IoOp::kWrite, ENOSPC},
                                         {IoOp::kWrite, EIO},
                                         {IoOp::kSync, EIO},
                                         {IoOp::kRename, EXDEV}};
  for (Compression c : AllCompressions()) {
    for (const WriteFault& kind : kinds) {
      for (uint64_t every : {1, 2, 5, 40}) {
        SCOPED_TRACE(fmt::format("{} {} {} every {}", CompressionName(c),
                                 IoOpName(kind.op), std::strerror(kind.error),
                                 every));
        // A file from an earlier run, and none at all.
        for (bool existing : {true, false}) {
          std::filesystem::remove(path);
          if (existing) testing::WriteRecords(path, good);
          const std::string before =
              existing ? testing::ReadFileBytes(path) : "";
          NthCallFaults faults(kind.op, every, kind.error);
          std::optional<IoError> error;
          {
            ScopedIoFaults scope(&faults);
            error = TryWrite(path, payloads, c);
          }
          if (faults.faults() == 0) {
            // Fewer calls than `every`: the write went through.
            EXPECT_FALSE(error.has_value());
            EXPECT_EQ(ReadSmallBuffered(path, c), payloads);
            continue;
          }
          ASSERT_TRUE(error.has_value());
          EXPECT_EQ(error->path(), path);
          EXPECT_EQ(error->errno_value(), kind.error);
          EXPECT_NE(std::string(error->what()).find(path), std::string::npos);
          // The old file unchanged, or nothing; no temporary file left.
          // Only a failed fsync of the directory, after the rename, finds
          // the new file in place: complete, but not known to be durable.
          const bool renamed =
              kind.op == IoOp::kSync && std::filesystem::exists(path) &&
              (!existing || testing::ReadFileBytes(path) != before);
          if (renamed) {
            EXPECT_EQ(ReadSmallBuffered(path, c), payloads);
          } else if (existing) {
            EXPECT_EQ(testing::ReadFileBytes(path), before);
          }
          EXPECT_EQ(dir.List(), existing || renamed
                                    ? std::vector<std::string>{"data.tfrecord"}
                                    : std::vector<std::string>{});
        }
      }
    }
  }
}

TEST(IoFaultsTest, ShortWritesAndInterruptedWritesWriteEveryByte) {
  TempDir dir;
  const auto payloads = Payloads();
  for (Compression c : AllCompressions()) {
    const std::string want_path = dir.File("want.tfrecord");
    ASSERT_FALSE(TryWrite(want_path, payloads, c).has_value());
    const std::string path = dir.File("data.tfrecord");
    {
      NthCallFaults faults(IoOp::kWrite, 1, 0, 5);
      ScopedIoFaults scope(&faults);
      ASSERT_FALSE(TryWrite(path, payloads, c).has_value());
      EXPECT_GT(faults.faults(), 1000u);
    }
    EXPECT_EQ(testing::ReadFileBytes(path), testing::ReadFileBytes(want_path))
        << CompressionName(c);
    InterruptedThenShort faults;
    {
      ScopedIoFaults scope(&faults);
      ASSERT_FALSE(TryWrite(path, payloads, c).has_value());
    }
    EXPECT_GT(faults.calls(), 1000u);
    EXPECT_EQ(testing::ReadFileBytes(path), testing::ReadFileBytes(want_path))
        << CompressionName(c);
  }
}

TEST(IoFaultsTest, IndexWritesAreAllOrNothing) {
  TempDir dir;
  const std::string path = dir.File("data.tfrecord");
  testing::WriteRecords(path, Payloads());
  const Index index = BuildIndex(path);
  const std::string idx = IndexPathFor(path);
  WriteIndex(idx, index);
  const std::string before = testing::ReadFileBytes(idx);
  for (IoOp op : {IoOp::kWrite, IoOp::kSync, IoOp::kRename}) {
    NthCallFaults faults(op, 1, op == IoOp::kWrite ? ENOSPC : EIO);
    ScopedIoFaults scope(&faults);
    Index other = index;
    other.entries.resize(10);
    EXPECT_THROW(WriteIndex(idx, other), IoError);
    EXPECT_EQ(testing::ReadFileBytes(idx), before);
  }
  EXPECT_EQ(dir.List(),
            (std::vector<std::string>{"data.tfrecord", "data.tfrecord.idx"}));
  EXPECT_EQ(ReadIndex(idx).entries, index.entries);
}

}  // namespace
}  // namespace recflow::records
