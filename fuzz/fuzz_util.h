// Helpers for the fuzz targets (docs/RELIABILITY.md): scratch files for
// APIs that read paths, and a reader of the fuzzer's bytes.
#ifndef RECFLOW_FUZZ_FUZZ_UTIL_H_
#define RECFLOW_FUZZ_FUZZ_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace recflow::fuzz {

// This process's scratch directory: a fresh one under /dev/shm where it
// exists (no disk I/O per input), else under $TMPDIR or /tmp; removed at
// exit.
const std::string& ScratchDir();
// Writes `data` to ScratchDir()/name (replacing it) and returns the path.
std::string ScratchFile(const std::string& name, std::string_view data);

// Takes the fuzzer's input apart from the front.
class Input {
 public:
  Input(const uint8_t* data, size_t size)
      : data_(reinterpret_cast<const char*>(data), size) {}
  // The next byte; 0 once the input is used up.
  uint8_t Byte() {
    if (data_.empty()) return 0;
    const auto b = static_cast<uint8_t>(data_[0]);
    data_.remove_prefix(1);
    return b;
  }
  // Up to `n` bytes.
  std::string_view Take(size_t n) {
    const std::string_view out = data_.substr(0, n);
    data_.remove_prefix(out.size());
    return out;
  }
  std::string_view Rest() const { return data_; }

 private:
  std::string_view data_;
};

}  // namespace recflow::fuzz

#endif  // RECFLOW_FUZZ_FUZZ_UTIL_H_
