#include "train/event_reader.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <optional>
#include <system_error>

#include "records/dtype.h"
#include "records/errors.h"
#include "records/tfrecord_reader.h"
#include "train/error.h"
#include "train/event.pb.h"

namespace recflow::train {
namespace {

namespace fs = std::filesystem;

bool IsEventFile(const fs::path& p) {
  return p.filename().string().find("tfevents") != std::string::npos;
}

// The value of a numeric tensor of one element; nullopt otherwise.
std::optional<double> ScalarOf(const tensorflow::TensorProto& t) {
  int64_t elements = 1;
  for (const auto& d : t.tensor_shape().dim()) elements *= d.size();
  if (elements != 1 || t.tensor_shape().unknown_rank()) return std::nullopt;
  const std::string& raw = t.tensor_content();
  auto from_raw = [&](auto zero) -> std::optional<double> {
    if (raw.size() != sizeof(zero)) return std::nullopt;
    std::memcpy(&zero, raw.data(), sizeof(zero));  // little-endian hosts
    return static_cast<double>(zero);
  };
  switch (t.dtype()) {
    case 1:  // DT_FLOAT
      if (!raw.empty()) return from_raw(float{});
      if (t.float_val_size() == 1) return t.float_val(0);
      break;
    case 2:  // DT_DOUBLE
      if (!raw.empty()) return from_raw(double{});
      if (t.double_val_size() == 1) return t.double_val(0);
      break;
    case 3:  // DT_INT32
      if (!raw.empty()) return from_raw(int32_t{});
      if (t.int_val_size() == 1) return t.int_val(0);
      break;
    case 9:  // DT_INT64
      if (!raw.empty()) return from_raw(int64_t{});
      if (t.int64_val_size() == 1) return static_cast<double>(t.int64_val(0));
      break;
    case 19:    // DT_HALF
    case 14: {  // DT_BFLOAT16
      uint16_t bits;
      if (raw.size() == 2) {
        std::memcpy(&bits, raw.data(), 2);
      } else if (raw.empty() && t.half_val_size() == 1) {
        bits = static_cast<uint16_t>(t.half_val(0));
      } else {
        break;
      }
      return t.dtype() == 19 ? records::HalfToFloat(bits)
                             : std::bit_cast<float>(uint32_t(bits) << 16);
    }
    default:
      break;
  }
  return std::nullopt;
}

void ReadFile(const std::string& path, EventRun& run,
              std::map<std::string, std::map<int64_t, ScalarPoint>>& scalars) {
  records::TFRecordReader reader(path);
  std::string_view record;
  tensorflow::Event event;
  while (true) {
    try {
      if (!reader.ReadRecord(&record)) break;
    } catch (const records::RecordError& e) {
      if (e.kind() == records::DamageKind::kTruncatedHeader ||
          e.kind() == records::DamageKind::kTruncatedData) {
        run.truncated_files.push_back(path);
        break;
      }
      throw;
    }
    ++run.events;
    if (!event.ParseFromArray(record.data(), static_cast<int>(record.size()))) {
      throw Error(fmt::format(
          "{}: record {} (byte {}) is not a tensorflow.Event ({} bytes)", path,
          reader.last_index(), reader.last_offset(), record.size()));
    }
    if (!event.has_summary()) continue;
    for (const auto& v : event.summary().value()) {
      std::optional<double> value;
      if (v.has_simple_value()) {
        value = v.simple_value();
      } else if (v.has_tensor()) {
        value = ScalarOf(v.tensor());
      }
      if (!value) continue;
      scalars[v.tag()][event.step()] = {event.step(), event.wall_time(),
                                        *value};
    }
  }
}

}  // namespace

std::vector<EventRun> ReadEventRuns(const std::string& log_dir) {
  std::error_code ec;
  if (!fs::is_directory(log_dir, ec)) {
    throw records::IoError(log_dir, "not a directory", ec.value());
  }
  // Folders holding event files, with their files.
  std::map<std::string, std::vector<std::string>> folders;
  auto add_files_of = [&](const fs::path& folder) {
    for (const auto& entry : fs::directory_iterator(folder, ec)) {
      if (entry.is_regular_file() && IsEventFile(entry.path())) {
        folders[folder.string()].push_back(entry.path().string());
      }
    }
    if (ec) throw records::IoError(folder.string(), "cannot list", ec.value());
  };
  add_files_of(log_dir);
  for (auto it = fs::recursive_directory_iterator(
           log_dir, fs::directory_options::skip_permission_denied, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    if (it->is_directory()) add_files_of(it->path());
  }
  if (ec) throw records::IoError(log_dir, "cannot list", ec.value());
  if (folders.empty()) {
    throw records::IoError(
        log_dir,
        "no TensorBoard event files (events.out.tfevents.*) here or in "
        "its subfolders");
  }
  std::vector<EventRun> runs;
  for (auto& [folder, files] : folders) {
    EventRun run;
    run.dir = folder;
    const fs::path relative = fs::relative(folder, log_dir).lexically_normal();
    run.name = relative.empty() ? fs::path(".").string() : relative.string();
    std::sort(files.begin(), files.end());
    run.files = files;
    std::map<std::string, std::map<int64_t, ScalarPoint>> scalars;
    for (const auto& f : files) ReadFile(f, run, scalars);
    for (auto& [tag, by_step] : scalars) {
      auto& points = run.scalars[tag];
      for (const auto& [step, point] : by_step) points.push_back(point);
    }
    runs.push_back(std::move(run));
  }
  std::sort(runs.begin(), runs.end(), [](const EventRun& a, const EventRun& b) {
    return a.name < b.name;
  });
  return runs;
}

}  // namespace recflow::train
