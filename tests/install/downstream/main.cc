// A downstream program using the installed recflow: writes records through
// gzip and reads them back.
#include <cstdio>
#include <string>
#include <vector>

#include "records/tfrecord_reader.h"
#include "records/tfrecord_writer.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  using namespace recflow::records;
  const std::vector<std::string> written = {"one", "", "three"};
  TFRecordWriter writer(argv[1], {.compression = Compression::kGzip});
  for (const auto& r : written) writer.Write(r);
  writer.Close();
  TFRecordReader reader(argv[1]);
  std::vector<std::string> read;
  std::string_view r;
  while (reader.ReadRecord(&r)) read.emplace_back(r);
  std::printf("downstream read %zu records\n", read.size());
  return read == written ? 0 : 1;
}
