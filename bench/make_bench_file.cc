// Writes an uncompressed TFRecord file of fixed-size records for the
// benchmarks: make_bench_file PATH RECORD_BYTES TOTAL_BYTES [COMPRESSION].
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "records/compression.h"
#include "records/tfrecord_writer.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(
        stderr,
        "usage: %s PATH RECORD_BYTES TOTAL_BYTES [none|zlib|gzip|zstd]\n",
        argv[0]);
    return 2;
  }
  const size_t record_bytes = std::strtoull(argv[2], nullptr, 10);
  const uint64_t total = std::strtoull(argv[3], nullptr, 10);
  recflow::records::WriterOptions options;
  if (argc > 4) {
    const auto c = recflow::records::ParseCompression(argv[4]);
    if (!c) return 2;
    options.compression = *c;
  }
  std::mt19937_64 rng(1);
  std::string record(record_bytes, '\0');
  for (auto& ch : record) ch = static_cast<char>('a' + rng() % 26);
  recflow::records::TFRecordWriter writer(argv[1], options);
  for (uint64_t written = 0; written < total; written += record_bytes + 16) {
    record[written % record_bytes] ^= 1;  // records differ
    writer.Write(record);
  }
  writer.Close();
  std::printf("%llu records of %zu bytes in %s\n",
              static_cast<unsigned long long>(writer.records_written()),
              record_bytes, argv[1]);
  return 0;
}
