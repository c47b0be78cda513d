// Index files (DALI's "offset length" text and recflow's ZSTD form) for a
// fixed record file, then random access through what was accepted: a
// malformed or lying index must give an Error, never a read outside the
// file or a crash.
#include <cstdint>
#include <string>

#include "fuzz_data.h"
#include "fuzz_util.h"
#include "records/errors.h"
#include "records/file.h"
#include "records/index.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace recflow::records;
  static const std::string kPlain = recflow::fuzz::SmallRecordFile(false);
  static const std::string kZstd = recflow::fuzz::SmallRecordFile(true);
  recflow::fuzz::Input in(data, size);
  const uint8_t mode = in.Byte();
  const std::string& records = (mode & 1) != 0 ? kZstd : kPlain;
  const std::string index_path =
      recflow::fuzz::ScratchFile("input.idx", in.Rest());
  try {
    const uint64_t file_size = ReadableFile(records).size();
    Index index = ReadIndex(index_path, (mode & 2) != 0 ? 0 : file_size);
    IndexedReader reader(records, std::move(index));
    for (uint64_t i = 0; i < reader.size(); ++i) reader.Read(i);
  } catch (const Error&) {
  }
  return 0;
}
