// The TFRecord reader over arbitrary file contents, in each compression (or
// detected), strict and salvaging, with small and large buffers; and, for
// uncompressed and ZSTD input, building an index and reading every record
// through it.  Any records::Error is a correct answer; anything else that
// escapes (std::bad_alloc, std::length_error, a crash) is a finding.
#include <cstdint>
#include <optional>

#include "fuzz_util.h"
#include "records/errors.h"
#include "records/index.h"
#include "records/tfrecord_reader.h"

namespace {

using namespace recflow::records;

class CountingReporter final : public Reporter {
 public:
  void Skipped(const RecordError&, uint64_t bytes) override {
    skipped_bytes += bytes;
  }
  uint64_t skipped_bytes = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  recflow::fuzz::Input in(data, size);
  const uint8_t mode = in.Byte();
  const std::string path =
      recflow::fuzz::ScratchFile("input.tfrecord", in.Rest());
  static const std::optional<Compression> kCompressions[] = {
      Compression::kNone, Compression::kZlib, Compression::kGzip,
      Compression::kZstd, std::nullopt};
  ReaderOptions o;
  o.compression = kCompressions[mode % 5];
  o.salvage = (mode & 0x08) != 0;
  o.verify_checksums = (mode & 0x40) == 0;
  o.buffer_bytes = (mode & 0x10) != 0 ? 64 : size_t{1} << 16;
  CountingReporter reporter;
  o.reporter = &reporter;
  try {
    TFRecordReader reader(path, o);
    std::string_view record;
    uint64_t bytes = 0;
    while (reader.ReadRecord(&record)) bytes += record.size();
    // Nothing read may exceed what the decoded stream can hold.
    if (reader.compression() == Compression::kNone &&
        bytes > reader.file_size()) {
      __builtin_trap();
    }
  } catch (const Error&) {
  }
  if ((mode & 0x20) != 0) {
    try {
      Index index = BuildIndex(path);
      IndexedReader reader(path, std::move(index));
      for (uint64_t i = 0; i < reader.size(); ++i) reader.Read(i);
    } catch (const Error&) {
    }
  }
  return 0;
}
