#include "pipeline/process.h"

#include <malloc.h>

#include <cstdio>
#include <mutex>
#include <utility>

namespace recflow::pipeline {
namespace {

std::mutex log_mu;
std::function<void(std::string_view)>& Sink() {
  static std::function<void(std::string_view)> sink;
  return sink;
}

}  // namespace

void SetLogSink(std::function<void(std::string_view)> sink) {
  std::lock_guard<std::mutex> lock(log_mu);
  Sink() = std::move(sink);
}

void LogLine(std::string_view line) {
  std::lock_guard<std::mutex> lock(log_mu);
  if (Sink()) {
    Sink()(line);
  } else {
    std::fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
  }
}

void TuneAllocatorForBatches() {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
}

}  // namespace recflow::pipeline
