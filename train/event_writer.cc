#include "train/event_writer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>

#include "records/file.h"
#include "records/tfrecord_writer.h"
#include "train/event.pb.h"

namespace recflow::train {
namespace {

double WallTime() {
  return std::chrono::duration<double>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

}  // namespace

EventWriter::EventWriter(const std::string& dir, double flush_secs)
    : flush_secs_(flush_secs), last_flush_(std::chrono::steady_clock::now()) {
  records::MakeDirectories(dir);
  const auto secs = static_cast<int64_t>(WallTime());
  // Two writers in one second in one directory (evaluations) get distinct
  // names, as TensorFlow's writer adds a suffix.
  std::string path =
      fmt::format("{}/events.out.tfevents.{}.{}", dir, secs, HostName());
  for (int i = 1; std::filesystem::exists(path); ++i) {
    path = fmt::format("{}/events.out.tfevents.{}.{}.{}", dir, secs, HostName(),
                       i);
  }
  path_ = path;
  records::WriterOptions options;
  options.atomic = false;
  writer_ = std::make_unique<records::TFRecordWriter>(path_, options);
  tensorflow::Event event;
  event.set_wall_time(WallTime());
  event.set_file_version("brain.Event:2");
  Write(event.SerializeAsString());
  Flush();
}

EventWriter::~EventWriter() {
  try {
    writer_->Close();
  } catch (...) {
    // A destructor cannot report; Flush() callers saw earlier failures.
  }
}

void EventWriter::AddScalar(std::string_view tag, double value, int64_t step) {
  tensorflow::Event event;
  event.set_wall_time(WallTime());
  event.set_step(step);
  auto* v = event.mutable_summary()->add_value();
  v->set_tag(std::string(tag));
  v->set_simple_value(static_cast<float>(value));
  Write(event.SerializeAsString());
}

void EventWriter::Write(const std::string& serialized_event) {
  writer_->Write(serialized_event);
  if (std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                    last_flush_)
          .count() >= flush_secs_) {
    Flush();
  }
}

void EventWriter::Flush() {
  writer_->Flush();
  last_flush_ = std::chrono::steady_clock::now();
}

}  // namespace recflow::train
