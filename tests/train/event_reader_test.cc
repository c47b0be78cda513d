// TensorBoard event files read back (train/event_reader.h): what
// EventWriter wrote, TF2's tensor scalars, resumed runs, runs still being
// written, and files that are not event files.
#include "train/event_reader.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "records/errors.h"
#include "records/tfrecord_writer.h"
#include "test_util.h"
#include "train/error.h"
#include "train/event.pb.h"
#include "train/event_writer.h"

namespace recflow::train {
namespace {

using testing::TempDir;

// An event file of `events` (serialized tensorflow.Event) in `dir`.
void WriteEvents(const std::string& path,
                 const std::vector<tensorflow::Event>& events) {
  records::TFRecordWriter w(path);
  for (const auto& e : events) w.Write(e.SerializeAsString());
  w.Close();
}

tensorflow::Event TensorScalar(const std::string& tag, int64_t step, int dtype,
                               const std::string& raw) {
  tensorflow::Event e;
  e.set_step(step);
  e.set_wall_time(1.5e9 + static_cast<double>(step));
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->mutable_tensor()->set_dtype(dtype);
  v->mutable_tensor()->mutable_tensor_shape();  // a scalar: no dims
  v->mutable_tensor()->set_tensor_content(raw);
  return e;
}

template <typename T>
std::string Raw(T v) {
  return std::string(reinterpret_cast<const char*>(&v), sizeof(v));
}

TEST(EventReaderTest, ReadsWhatEventWriterWroteByRun) {
  TempDir dir;
  {
    EventWriter train(dir.path().string());
    for (int step = 1; step <= 5; ++step) {
      train.AddScalar("loss", 1.0 / step, step);
    }
    EventWriter eval(dir.File("eval"));
    eval.AddScalar("accuracy", 0.75, 5);
  }
  const auto runs = ReadEventRuns(dir.path().string());
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].name, ".");
  EXPECT_EQ(runs[1].name, "eval");
  EXPECT_EQ(runs[0].events, 6u);  // file_version + 5
  const auto& loss = runs[0].scalars.at("loss");
  ASSERT_EQ(loss.size(), 5u);
  EXPECT_EQ(loss[0].step, 1);
  EXPECT_FLOAT_EQ(loss[4].value, 0.2f);
  EXPECT_GT(loss[4].wall_time, 1.7e9);
  EXPECT_FLOAT_EQ(runs[1].scalars.at("accuracy").at(0).value, 0.75f);
  EXPECT_TRUE(runs[0].truncated_files.empty());
}

// A run resumed from an earlier checkpoint writes its steps again in a
// newer file: the last value written wins, one point per step.
TEST(EventReaderTest, ResumedRunKeepsTheLastValueOfEachStep) {
  TempDir dir;
  auto scalar = [](int64_t step, float v) {
    tensorflow::Event e;
    e.set_step(step);
    auto* value = e.mutable_summary()->add_value();
    value->set_tag("loss");
    value->set_simple_value(v);
    return e;
  };
  WriteEvents(dir.File("events.out.tfevents.100.host"),
              {scalar(10, 1), scalar(20, 2), scalar(30, 3)});
  WriteEvents(dir.File("events.out.tfevents.200.host"),
              {scalar(20, 20), scalar(30, 30), scalar(40, 40)});
  const auto runs = ReadEventRuns(dir.path().string());
  ASSERT_EQ(runs.size(), 1u);
  ASSERT_EQ(runs[0].files.size(), 2u);
  const auto& loss = runs[0].scalars.at("loss");
  ASSERT_EQ(loss.size(), 4u);
  EXPECT_EQ(loss[1].step, 20);
  EXPECT_EQ(loss[1].value, 20);
  EXPECT_EQ(loss[3].value, 40);
}

// TF2's tf.summary.scalar: a scalar tensor, of any numeric dtype, in
// tensor_content or in the typed fields; other values are left out.
TEST(EventReaderTest, ReadsTensorScalarsOfEveryNumericType) {
  TempDir dir;
  std::vector<tensorflow::Event> events = {
      TensorScalar("f32", 1, 1, Raw(0.5f)),
      TensorScalar("f64", 1, 2, Raw(0.25)),
      TensorScalar("i32", 1, 3, Raw(int32_t{-7})),
      TensorScalar("i64", 1, 9, Raw(int64_t{1} << 40)),
      TensorScalar("half", 1, 19, Raw(uint16_t{0x3c00})),        // 1.0
      TensorScalar("half_small", 1, 19, Raw(uint16_t{0x0001})),  // 2^-24
      TensorScalar("bf16", 1, 14, Raw(uint16_t{0x4049})),        // ~3.14
  };
  tensorflow::Event typed = TensorScalar("typed", 2, 1, "");
  typed.mutable_summary()->mutable_value(0)->mutable_tensor()->add_float_val(
      4.5f);
  events.push_back(typed);
  tensorflow::Event vector =
      TensorScalar("vector", 2, 1, Raw(1.0f) + Raw(2.0f));
  vector.mutable_summary()
      ->mutable_value(0)
      ->mutable_tensor()
      ->mutable_tensor_shape()
      ->add_dim()
      ->set_size(2);
  events.push_back(vector);
  events.push_back(TensorScalar("text", 2, 7, "hello"));  // DT_STRING
  WriteEvents(dir.File("events.out.tfevents.1.host"), events);
  const auto runs = ReadEventRuns(dir.path().string());
  const auto& s = runs.at(0).scalars;
  EXPECT_EQ(s.at("f32")[0].value, 0.5);
  EXPECT_EQ(s.at("f64")[0].value, 0.25);
  EXPECT_EQ(s.at("i32")[0].value, -7);
  EXPECT_EQ(s.at("i64")[0].value, std::ldexp(1.0, 40));
  EXPECT_EQ(s.at("half")[0].value, 1.0);
  EXPECT_EQ(s.at("half_small")[0].value, std::ldexp(1.0, -24));
  EXPECT_NEAR(s.at("bf16")[0].value, 3.140625, 1e-9);
  EXPECT_EQ(s.at("typed")[0].value, 4.5);
  EXPECT_EQ(s.count("vector"), 0u);
  EXPECT_EQ(s.count("text"), 0u);
}

// A file still being written ends inside a record: read up to it.  A
// damaged record elsewhere, or a record that is not an Event, is an error
// naming the file.
TEST(EventReaderTest, TruncatedTailIsReadUpToDamageIsAnError) {
  TempDir dir;
  {
    EventWriter w(dir.path().string());
    w.AddScalar("loss", 1, 1);
    w.AddScalar("loss", 2, 2);
  }
  const std::string path = ReadEventRuns(dir.path().string()).at(0).files.at(0);
  std::string bytes = testing::ReadFileBytes(path);
  testing::WriteFileBytes(path, bytes.substr(0, bytes.size() - 5));
  auto runs = ReadEventRuns(dir.path().string());
  EXPECT_EQ(runs[0].scalars.at("loss").size(), 1u);
  EXPECT_EQ(runs[0].truncated_files, std::vector<std::string>{path});

  bytes[bytes.size() / 2] ^= 0x55;  // a payload byte of a middle record
  testing::WriteFileBytes(path, bytes);
  EXPECT_THROW(ReadEventRuns(dir.path().string()), records::RecordError);

  TempDir other;
  WriteEvents(other.File("events.out.tfevents.1.host"), {});
  {
    records::TFRecordWriter w(other.File("events.out.tfevents.2.host"));
    w.Write(std::string("\xff\xff\xff", 3));  // not a protobuf
    w.Close();
  }
  try {
    ReadEventRuns(other.path().string());
    FAIL() << "expected train::Error";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("events.out.tfevents.2.host: record 0"),
        std::string::npos)
        << e.what();
  }
}

TEST(EventReaderTest, NoEventFilesIsAnError) {
  TempDir dir;
  std::filesystem::create_directory(dir.File("empty"));
  EXPECT_THROW(ReadEventRuns(dir.path().string()), records::IoError);
  EXPECT_THROW(ReadEventRuns(dir.File("missing")), records::IoError);
}

}  // namespace
}  // namespace recflow::train
