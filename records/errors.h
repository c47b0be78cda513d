// The exceptions records/ throws.  Every message names where the problem is:
// the file, and for record damage the byte offset of the record in the
// uncompressed stream, the record's index and what was expected.
//
// IoError: the operating system refused something (open, read, write, fsync,
// rename), or the input could not be used at all (e.g. an unknown
// compression).  RecordError: the bytes of a file are not a valid TFRecord
// stream.  Both derive from records::Error.
//
// recflow::Error is the one base of every layer's errors: records::Error,
// pipeline::Error (pipeline/error.h), train::Error (train/error.h) and
// convert::ConvertError are siblings under it, so a `catch` names the layer
// it means (catching records::Error never swallows a training error) and
// `catch (const recflow::Error&)` takes any of them.
#ifndef RECFLOW_RECORDS_ERRORS_H_
#define RECFLOW_RECORDS_ERRORS_H_

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace recflow {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace recflow

namespace recflow::records {

class Error : public recflow::Error {
 public:
  using recflow::Error::Error;
};

class IoError : public Error {
 public:
  // `errno_value` is 0 where the failure did not come from a system call.
  IoError(std::string path, std::string what, int errno_value = 0);
  const std::string& path() const { return path_; }
  // What failed, without the path and the system's message.
  const std::string& detail() const { return detail_; }
  int errno_value() const { return errno_; }

 private:
  std::string path_;
  std::string detail_;
  int errno_;
};

// What is wrong with a record.
enum class DamageKind {
  kLengthCrcMismatch,   // the 8-byte length does not match its CRC
  kDataCrcMismatch,     // the payload does not match its CRC
  kTruncatedHeader,     // the stream ends inside a 12-byte header
  kTruncatedData,       // the stream ends inside a payload or its CRC
  kImplausibleLength,   // the length is over the maximum or past the end
  kDecompressionError,  // the compressed stream cannot be decoded
};

// "length CRC mismatch", "data CRC mismatch", ... as used in messages.
std::string_view DamageKindName(DamageKind kind);

class RecordError : public Error {
 public:
  // `offset`: where the record starts in the uncompressed stream;
  // `record_index`: how many records precede it; `detail`: expected versus
  // found, e.g. "stored 0x1234abcd, computed 0x0badf00d".
  RecordError(std::string path, uint64_t offset, uint64_t record_index,
              DamageKind kind, std::string detail);
  const std::string& path() const { return path_; }
  uint64_t offset() const { return offset_; }
  uint64_t record_index() const { return record_index_; }
  DamageKind kind() const { return kind_; }
  const std::string& detail() const { return detail_; }

 private:
  std::string path_;
  uint64_t offset_;
  uint64_t record_index_;
  DamageKind kind_;
  std::string detail_;
};

}  // namespace recflow::records

#endif  // RECFLOW_RECORDS_ERRORS_H_
