#include "train/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "records/crc32c.h"
#include "records/file.h"

namespace recflow::train {
namespace {

namespace fs = std::filesystem;
using pipeline::DType;
using pipeline::Shape;
using pipeline::Tensor;

constexpr std::string_view kMagic = "RFCKPT01";
constexpr std::string_view kFooter = "RFCKEND!";
constexpr char kStateFile[] = "checkpoint";

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

// Reads from a checkpoint's bytes with bounds checks that name the place.
class Cursor {
 public:
  Cursor(const std::string& path, std::string_view data)
      : path_(path), data_(data) {}
  template <typename T>
  T Get(std::string_view what) {
    T v;
    std::memcpy(&v, Take(sizeof(T), what).data(), sizeof(T));
    return v;
  }
  std::string_view Take(uint64_t n, std::string_view what) {
    if (n > data_.size() - pos_) {
      Fail(
          fmt::format("the file ends inside {} (needs {} bytes, {} left); "
                      "truncated?",
                      what, n, data_.size() - pos_));
    }
    std::string_view out = data_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  [[noreturn]] void Fail(const std::string& what) const {
    throw Error(
        fmt::format("checkpoint {}: at byte {}: {}", path_, pos_, what));
  }
  size_t pos() const { return pos_; }
  bool done() const { return pos_ == data_.size(); }

 private:
  const std::string& path_;
  std::string_view data_;
  size_t pos_ = 0;
};

// The file's bytes (ReadableFile::Read reads until `n` or the end).
std::string ReadWholeFile(const std::string& path) {
  records::ReadableFile file(path);
  std::string data(file.size(), '\0');
  data.resize(file.Read(data.data(), data.size()));
  return data;
}

}  // namespace

void WriteCheckpoint(const std::string& path, const TensorMap& tensors) {
  std::string out(kMagic);
  Put<uint64_t>(&out, tensors.size());
  for (const auto& [name, t] : tensors) {
    if (t.dtype() == DType::kBytes) {
      throw Error(
          fmt::format("checkpoint {}: tensor {} is bytes; checkpoints "
                      "hold numeric tensors",
                      path, name));
    }
    const size_t start = out.size();
    Put<uint32_t>(&out, static_cast<uint32_t>(name.size()));
    out.append(name);
    Put<uint8_t>(&out, static_cast<uint8_t>(t.dtype()));
    Put<uint8_t>(&out, static_cast<uint8_t>(t.shape().rank()));
    for (int64_t d : t.shape().dims()) Put<int64_t>(&out, d);
    Put<uint64_t>(&out, t.byte_size());
    out.append(t.raw_data(), t.byte_size());
    Put<uint32_t>(&out, records::crc32c::Mask(records::crc32c::Value(
                            out.data() + start, out.size() - start)));
  }
  out.append(kFooter);
  Put<uint64_t>(&out, tensors.size());
  records::WritableFile file(path, /*atomic=*/true);
  file.Append(out);
  file.Close();
}

TensorMap ReadCheckpoint(const std::string& path, std::string* bytes) {
  std::string data = ReadWholeFile(path);
  TensorMap tensors = ParseCheckpoint(data, path);
  if (bytes != nullptr) *bytes = std::move(data);
  return tensors;
}

TensorMap ParseCheckpoint(std::string_view data, const std::string& path) {
  Cursor c(path, data);
  if (c.Take(kMagic.size(), "the magic") != kMagic) {
    throw Error(fmt::format(
        "checkpoint {}: not a recflow checkpoint (expected magic \"{}\")", path,
        kMagic));
  }
  const uint64_t count = c.Get<uint64_t>("the entry count");
  TensorMap out;
  for (uint64_t i = 0; i < count; ++i) {
    const size_t start = c.pos();
    const std::string what = fmt::format("entry {} of {}", i, count);
    const uint32_t name_size = c.Get<uint32_t>(what);
    const std::string name(c.Take(name_size, what + "'s name"));
    const auto dtype = c.Get<uint8_t>(what);
    const auto rank = c.Get<uint8_t>(what);
    if (dtype > static_cast<uint8_t>(DType::kUInt8) || rank > Shape::kMaxRank) {
      c.Fail(
          fmt::format("entry {} ({}): dtype {} / rank {} is not valid "
                      "(damaged?)",
                      i, name, dtype, rank));
    }
    std::vector<int64_t> dims(rank);
    // The element count, checked for overflow: the dimensions come from
    // the file.
    // (In int64, as Shape::num_elements() computes it.)
    int64_t elements = 1;
    bool overflow = false;
    for (auto& d : dims) {
      d = c.Get<int64_t>(what);
      overflow |= d < 0 || __builtin_mul_overflow(elements, d, &elements);
    }
    const uint64_t bytes = c.Get<uint64_t>(what);
    const std::string_view values =
        c.Take(bytes, fmt::format("{} ({})", what, name));
    const uint32_t want = c.Get<uint32_t>(what + "'s CRC");
    const uint32_t got = records::crc32c::Mask(
        records::crc32c::Value(data.data() + start, c.pos() - 4 - start));
    if (want != got) {
      throw Error(fmt::format(
          "checkpoint {}: entry {} ({}) at byte {} fails its CRC "
          "(stored {:#010x}, computed {:#010x}): the file is damaged",
          path, i, name, start, want, got));
    }
    const Shape shape{std::span<const int64_t>(dims)};
    const auto d = static_cast<DType>(dtype);
    uint64_t want_bytes = 0;
    if (overflow ||
        __builtin_mul_overflow(static_cast<uint64_t>(elements),
                               pipeline::DTypeSize(d), &want_bytes) ||
        want_bytes != bytes) {
      c.Fail(fmt::format("entry {} ({}): {} bytes for shape {} of {}", i, name,
                         bytes, shape.ToString(), pipeline::DTypeName(d)));
    }
    Tensor t = Tensor::Allocate(d, shape);
    // (memcpy may not be given the null pointers of an empty tensor.)
    if (bytes != 0) {
      std::memcpy(const_cast<char*>(t.raw_data()), values.data(), bytes);
    }
    out.emplace(name, std::move(t));
  }
  if (c.Take(kFooter.size(), "the footer") != kFooter ||
      c.Get<uint64_t>("the footer") != count || !c.done()) {
    c.Fail("the footer is missing or wrong: the file is damaged");
  }
  return out;
}

int64_t CheckpointStep(std::string_view path) {
  const size_t dash = path.rfind("model.ckpt-");
  if (dash == std::string_view::npos) return -1;
  int64_t step = 0;
  std::string_view digits = path.substr(dash + 11);
  if (digits.empty()) return -1;
  for (char ch : digits) {
    if (ch < '0' || ch > '9') return -1;
    step = step * 10 + (ch - '0');
  }
  return step;
}

CheckpointManager::CheckpointManager(std::string model_dir, int keep_max)
    : dir_(std::move(model_dir)), keep_max_(keep_max) {
  records::MakeDirectories(dir_);
}

std::vector<std::string> ParseCheckpointState(std::string_view text,
                                              const std::string& path) {
  std::vector<std::string> names;
  std::string latest;
  size_t line_number = 0;
  while (!text.empty()) {
    const size_t eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? "" : text.substr(eol + 1);
    ++line_number;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) {
      line.remove_suffix(1);
    }
    if (line.empty() || line.front() == '#') continue;
    const size_t colon = line.find(':');
    const std::string_view key =
        line.substr(0, colon == std::string_view::npos ? 0 : colon);
    std::string_view value =
        colon == std::string_view::npos ? "" : line.substr(colon + 1);
    while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    auto fail = [&](std::string_view expected) {
      throw Error(fmt::format(
          "checkpoint state file {}: line {}: expected {}, found \"{}\"", path,
          line_number, expected, line.substr(0, 80)));
    };
    // TensorFlow 2 also writes timestamps; their values do not matter here.
    if (key == "all_model_checkpoint_timestamps" ||
        key == "last_preserved_timestamp") {
      continue;
    }
    if (key != "model_checkpoint_path" && key != "all_model_checkpoint_paths") {
      fail("model_checkpoint_path: or all_model_checkpoint_paths:");
    }
    if (value.size() < 2 || value.front() != '"' || value.back() != '"' ||
        value.substr(1, value.size() - 2).find('"') != std::string_view::npos) {
      fail(fmt::format("{}: \"<checkpoint name>\"", key));
    }
    std::string name(value.substr(1, value.size() - 2));
    if (name.empty() || name.find('\0') != std::string::npos) {
      fail("a non-empty checkpoint name");
    }
    if (key == "model_checkpoint_path") {
      latest = std::move(name);
    } else {
      names.push_back(std::move(name));
    }
  }
  if (!latest.empty() &&
      std::find(names.begin(), names.end(), latest) == names.end()) {
    names.push_back(latest);
  }
  return names;
}

std::vector<std::string> CheckpointManager::ReadState() const {
  const std::string path = (fs::path(dir_) / kStateFile).string();
  std::error_code ec;
  if (!fs::exists(path, ec) && !ec) return {};
  return ParseCheckpointState(ReadWholeFile(path), path);
}

void CheckpointManager::WriteState(
    const std::vector<std::string>& names) const {
  std::string text;
  if (!names.empty()) {
    text += fmt::format("model_checkpoint_path: \"{}\"\n", names.back());
  }
  for (const auto& n : names) {
    text += fmt::format("all_model_checkpoint_paths: \"{}\"\n", n);
  }
  records::WritableFile file((fs::path(dir_) / kStateFile).string(),
                             /*atomic=*/true);
  file.Append(text);
  file.Close();
}

std::string CheckpointManager::Save(int64_t step, const TensorMap& tensors) {
  const std::string name = fmt::format("model.ckpt-{}", step);
  const std::string path = (fs::path(dir_) / name).string();
  WriteCheckpoint(path, tensors);
  std::vector<std::string> names = ReadState();
  std::erase(names, name);
  names.push_back(name);
  std::vector<std::string> dropped;
  while (keep_max_ > 0 && names.size() > static_cast<size_t>(keep_max_)) {
    dropped.push_back(names.front());
    names.erase(names.begin());
  }
  WriteState(names);
  // Only once the state no longer names them.
  for (const auto& d : dropped) {
    std::error_code ignored;
    fs::remove(fs::path(dir_) / d, ignored);
  }
  return path;
}

std::vector<std::string> CheckpointManager::Checkpoints() const {
  std::vector<std::string> out;
  for (const auto& n : ReadState()) {
    out.push_back(fs::path(n).is_absolute() ? n
                                            : (fs::path(dir_) / n).string());
  }
  return out;
}

std::optional<std::string> CheckpointManager::Latest() const {
  auto all = Checkpoints();
  if (all.empty()) return std::nullopt;
  return all.back();
}

std::optional<CheckpointManager::Restored> CheckpointManager::RestoreLatest(
    const std::function<void(std::string_view)>& warn,
    std::string* bytes) const {
  const auto all = Checkpoints();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      return Restored{*it, ReadCheckpoint(*it, bytes)};
    } catch (const recflow::Error& e) {
      // A damaged checkpoint (train::Error) or one that cannot be read
      // (records::IoError): both skip to the previous one.
      if (warn) {
        warn(fmt::format(
            "WARNING: skipping checkpoint {}: {}{}", *it, e.what(),
            std::next(it) != all.rend() ? "; trying the previous one" : ""));
      }
    }
  }
  if (!all.empty()) {
    throw Error(fmt::format(
        "{}: none of the {} checkpoints the `checkpoint` file names can be "
        "read (see the warnings above)",
        dir_, all.size()));
  }
  return std::nullopt;
}

}  // namespace recflow::train
