// TensorBoard event files read back: the scalars of every run under a log
// directory, for `recflow summary` and for checks of what training wrote.
//
//   for (const EventRun& run : ReadEventRuns("model_dir"))
//     for (const auto& [tag, points] : run.scalars) ...
//
// Reads files written by recflow's EventWriter and by TensorFlow (TF1's
// simple_value scalars, TF2's tf.summary.scalar tensors).  Stateless and
// thread-safe.
#ifndef RECFLOW_TRAIN_EVENT_READER_H_
#define RECFLOW_TRAIN_EVENT_READER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace recflow::train {

struct ScalarPoint {
  int64_t step = 0;
  double wall_time = 0;  // seconds since the epoch
  double value = 0;
};

// One run: a folder holding event files (events.out.tfevents.*).
struct EventRun {
  // The folder relative to the log directory, "." for the directory
  // itself, as TensorBoard names runs ("eval" for an Estimator's
  // evaluations).
  std::string name;
  std::string dir;
  std::vector<std::string> files;  // sorted by name (creation time)
  uint64_t events = 0;             // records read, file_version included
  // Per tag, one point per step, in step order.  A step written more than
  // once (training resumed from an earlier checkpoint writes it again)
  // keeps the value written last, files taken in name order.
  std::map<std::string, std::vector<ScalarPoint>> scalars;
  // Files whose last record is cut short (a run still writing, or one
  // killed mid-write): read up to it, as TensorBoard does.
  std::vector<std::string> truncated_files;
};

// Every run under `log_dir` (the directory and its subfolders, any depth,
// that hold event files), by name.  Values that are not numeric scalars
// (histograms, images, text, tensors of more than one element) are left
// out.  Throws records::IoError for a directory that cannot be read or a
// `log_dir` with no event files anywhere, records::RecordError for a
// damaged record before a file's end, and train::Error naming the file and
// record for a record that is not an Event.
std::vector<EventRun> ReadEventRuns(const std::string& log_dir);

}  // namespace recflow::train

#endif  // RECFLOW_TRAIN_EVENT_READER_H_
