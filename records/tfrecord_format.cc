#include "records/tfrecord_format.h"

namespace recflow::records {

const char* VerifyFramesAhead(const char* p, const char* end) {
  const char* headers[kVerifyBatch];
  const char* data[kVerifyBatch];
  size_t eight[kVerifyBatch];
  size_t lengths[kVerifyBatch];
  uint32_t header_crcs[kVerifyBatch];
  uint32_t data_crcs[kVerifyBatch];
  size_t count = 0;
  const char* const start = p;
  while (count < kVerifyBatch && static_cast<size_t>(end - p) >= kHeaderBytes) {
    const uint64_t length = HeaderLength(p);
    if (length > kBatchedRecordBytes ||
        static_cast<size_t>(end - p) < length + kFrameOverhead) {
      break;
    }
    headers[count] = p;
    eight[count] = 8;
    data[count] = p + kHeaderBytes;
    lengths[count] = length;
    ++count;
    p += length + kFrameOverhead;
  }
  if (count < 2) return start;
  crc32c::ValueMany(headers, eight, header_crcs, count);
  crc32c::ValueMany(data, lengths, data_crcs, count);
  for (size_t i = 0; i < count; ++i) {
    if (header_crcs[i] != HeaderStoredCrc(headers[i]) ||
        data_crcs[i] != crc32c::Unmask(DecodeLittleEndian<uint32_t>(
                            data[i] + lengths[i]))) {
      return headers[i];
    }
  }
  return p;
}

}  // namespace recflow::records
