// TensorBoard event files: `events.out.tfevents.<secs>.<host>` in a
// directory, TFRecord framing of tensorflow.Event protos, the first record
// `file_version: "brain.Event:2"`, scalars as Summary simple_values.
//
// Records reach the file on Flush() (every `flush_secs` on its own, and at
// destruction), so TensorBoard sees a live run; the file is never renamed
// (TensorBoard watches the directory).  Not thread-safe.
#ifndef RECFLOW_TRAIN_EVENT_WRITER_H_
#define RECFLOW_TRAIN_EVENT_WRITER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace recflow::records {
class TFRecordWriter;
}

namespace recflow::train {

class EventWriter {
 public:
  // Creates `dir` if needed.  Throws records::IoError.
  explicit EventWriter(const std::string& dir, double flush_secs = 30);
  ~EventWriter();  // flushes
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  void AddScalar(std::string_view tag, double value, int64_t step);
  void Flush();
  const std::string& path() const { return path_; }

 private:
  void Write(const std::string& serialized_event);

  std::string path_;
  double flush_secs_;
  std::chrono::steady_clock::time_point last_flush_;
  std::unique_ptr<records::TFRecordWriter> writer_;
};

}  // namespace recflow::train

#endif  // RECFLOW_TRAIN_EVENT_WRITER_H_
