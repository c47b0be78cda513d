// EventWriter: TensorBoard's file name and framing, the file_version record
// first, scalars as simple_values, and records on disk only once flushed.
#include "train/event_writer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "test_util.h"
#include "train/event.pb.h"

namespace recflow::train {
namespace {

std::vector<tensorflow::Event> Events(const std::string& path) {
  std::vector<tensorflow::Event> out;
  for (const std::string& record : recflow::testing::ReadRecords(path)) {
    tensorflow::Event e;
    EXPECT_TRUE(e.ParseFromString(record));
    out.push_back(e);
  }
  return out;
}

TEST(EventWriterTest, TensorBoardsFileVersionThenScalarsOnceFlushed) {
  recflow::testing::TempDir dir;
  const std::string logdir = dir.File("run/train");  // made if missing
  EventWriter writer(logdir, /*flush_secs=*/3600);
  const std::filesystem::path path(writer.path());
  EXPECT_EQ(path.parent_path(), std::filesystem::path(logdir));
  EXPECT_TRUE(std::regex_match(path.filename().string(),
                               std::regex(R"(events\.out\.tfevents\.\d+\..+)")))
      << path;
  writer.AddScalar("loss", 0.25, 7);
  writer.AddScalar("accuracy", 0.5, 7);
  // Not flushed (an hour's interval): the scalars are not on disk yet.
  EXPECT_LE(Events(writer.path()).size(), 1u);
  writer.Flush();
  const std::vector<tensorflow::Event> events = Events(writer.path());
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_EQ(events[1].step(), 7);
  ASSERT_EQ(events[1].summary().value_size(), 1);
  EXPECT_EQ(events[1].summary().value(0).tag(), "loss");
  EXPECT_EQ(events[1].summary().value(0).simple_value(), 0.25f);
  EXPECT_EQ(events[2].summary().value(0).tag(), "accuracy");
  EXPECT_GT(events[2].wall_time(), 1.6e9);  // seconds since 1970
}

TEST(EventWriterTest, DestructionFlushesAndAZeroIntervalFlushesEachScalar) {
  recflow::testing::TempDir dir;
  std::string path;
  {
    EventWriter writer(dir.File("a"), 3600);
    writer.AddScalar("x", 1, 1);
    path = writer.path();
  }
  EXPECT_EQ(Events(path).size(), 2u);
  EventWriter eager(dir.File("b"), 0);
  eager.AddScalar("x", 1, 1);
  EXPECT_EQ(Events(eager.path()).size(), 2u);
}

}  // namespace
}  // namespace recflow::train
