#include "pipeline/state.h"

#include <fmt/format.h>

#include <cstring>

#include "records/crc32c.h"
#include "records/csv_reader.h"
#include "records/example_parser.h"
#include "records/file_list.h"
#include "records/input_stream.h"
#include "records/tfrecord_format.h"

namespace recflow::pipeline {
namespace {

constexpr std::string_view kMagic = "RFIS";
constexpr uint32_t kVersion = 1;
// The description of an element record (EncodeElementRecord): the name
// file caches have always carried.
constexpr std::string_view kElementRecordTag = "recflow-cache-element";
// A tensor in a state cannot claim more elements than this; the blob's
// size bounds it again before anything is allocated.
constexpr uint64_t kMaxStateValues = uint64_t{1} << 40;

}  // namespace

StateWriter::StateWriter(std::string_view description) {
  out_.append(kMagic);
  char v[4];
  records::EncodeLittleEndian<uint32_t>(v, kVersion);
  out_.append(v, 4);
  String(description);
}

void StateWriter::U64(uint64_t v) {
  char b[8];
  records::EncodeLittleEndian<uint64_t>(b, v);
  out_.append(b, 8);
}

void StateWriter::String(std::string_view s) {
  U64(s.size());
  out_.append(s);
}

void StateWriter::WriteTensor(const Tensor& t) {
  U64(static_cast<uint64_t>(t.dtype()));
  U64(static_cast<uint64_t>(t.shape().rank()));
  for (int64_t d : t.shape().dims()) I64(d);
  Bool(t.ragged());
  if (t.ragged()) WriteTensor(t.row_lengths());
  const int64_t n = t.num_elements();
  if (t.dtype() == DType::kBytes) {
    for (int64_t k = 0; k < n; ++k) String(t.bytes(k));
  } else {
    out_.append(t.raw_data(), t.byte_size());
  }
}

void StateWriter::WriteElement(const Element& e) {
  U64(e.components.size());
  for (const auto& c : e.components) {
    String(c.name);
    WriteTensor(c.tensor);
  }
  Bool(e.origin.file != nullptr);
  if (e.origin.file) {
    String(*e.origin.file);
    U64(e.origin.offset);
    U64(e.origin.record);
  }
}

std::string StateWriter::Finish() && {
  char crc[4];
  records::EncodeLittleEndian<uint32_t>(
      crc,
      records::crc32c::Mask(records::crc32c::Value(out_.data(), out_.size())));
  out_.append(crc, 4);
  return std::move(out_);
}

StateReader::StateReader(std::string_view blob, std::string_view description)
    : in_(blob) {
  if (in_.size() < kMagic.size() + 8 ||
      in_.substr(0, kMagic.size()) != kMagic) {
    Fail("not an iterator state (it does not start with \"RFIS\")");
  }
  const size_t body = in_.size() - 4;
  const uint32_t stored = records::crc32c::Unmask(
      records::DecodeLittleEndian<uint32_t>(in_.data() + body));
  const uint32_t computed = records::crc32c::Value(in_.data(), body);
  if (stored != computed) {
    Fail(
        fmt::format("the state is damaged: stored CRC {:#010x}, computed "
                    "{:#010x}",
                    stored, computed));
  }
  in_ = in_.substr(0, body);
  pos_ = kMagic.size();
  Need(4);
  const uint32_t version =
      records::DecodeLittleEndian<uint32_t>(in_.data() + pos_);
  pos_ += 4;
  if (version != kVersion) {
    Fail(fmt::format("state version {}; this build reads version {}", version,
                     kVersion));
  }
  const std::string saved = String();
  if (saved != description) {
    throw Error(fmt::format(
        "iterator state was saved from another pipeline:\n  saved: {}\n  "
        "this:  {}",
        saved, description));
  }
}

void StateReader::Need(size_t n) const {
  if (in_.size() - pos_ < n) {
    Fail(fmt::format("the state ends {} bytes early", n - (in_.size() - pos_)));
  }
}

void StateReader::Fail(std::string_view what) const {
  throw Error(
      fmt::format("iterator state, stage {}, byte {}: {}", stage_, pos_, what));
}

void StateReader::BeginStage(std::string_view name) {
  const std::string found = String();
  if (found != name) {
    Fail(fmt::format("expected the state of stage '{}', found '{}'", name,
                     found));
  }
  stage_ = found;
}

uint64_t StateReader::U64() {
  Need(8);
  const uint64_t v = records::DecodeLittleEndian<uint64_t>(in_.data() + pos_);
  pos_ += 8;
  return v;
}

std::string StateReader::String() {
  const uint64_t n = U64();
  Need(n);
  std::string s(in_.substr(pos_, n));
  pos_ += n;
  return s;
}

Tensor StateReader::ReadTensor() {
  const uint64_t dtype = U64();
  if (dtype > static_cast<uint64_t>(DType::kBytes)) {
    Fail(fmt::format("unknown dtype {}", dtype));
  }
  const uint64_t rank = U64();
  if (rank > Shape::kMaxRank) Fail(fmt::format("rank {} too large", rank));
  int64_t dims[Shape::kMaxRank];
  uint64_t n = 1;
  for (uint64_t i = 0; i < rank; ++i) {
    dims[i] = I64();
    if (dims[i] < 0 || static_cast<uint64_t>(dims[i]) > kMaxStateValues) {
      Fail(fmt::format("dimension {} out of range", dims[i]));
    }
    // Checked before multiplying: the product could wrap past the bound.
    if (dims[i] != 0 && n > kMaxStateValues / static_cast<uint64_t>(dims[i])) {
      Fail("tensor too large");
    }
    n *= static_cast<uint64_t>(dims[i]);
  }
  const Shape shape(std::span<const int64_t>(dims, rank));
  const bool ragged = Bool();
  Tensor lengths;
  if (ragged) lengths = ReadTensor();
  const auto d = static_cast<DType>(dtype);
  Tensor t;
  if (d == DType::kBytes) {
    // Each value takes at least its 8-byte length in the blob.
    Need(n * 8);
    std::string data;
    records::AlignedVector<uint64_t> offsets;
    offsets.reserve(n + 1);
    offsets.push_back(0);
    for (uint64_t k = 0; k < n; ++k) {
      data += String();
      offsets.push_back(data.size());
    }
    t = Tensor::AdoptBytes(std::move(data), std::move(offsets), shape);
  } else {
    const uint64_t bytes = n * DTypeSize(d);
    Need(bytes);
    t = Tensor::Allocate(d, shape);
    if (bytes)
      std::memcpy(const_cast<char*>(t.raw_data()), in_.data() + pos_, bytes);
    pos_ += bytes;
  }
  if (ragged) {
    try {
      t = Tensor::Ragged(std::move(t), std::move(lengths));
    } catch (const Error& e) {
      Fail(e.what());
    }
  }
  return t;
}

Element StateReader::ReadElement() {
  Element e;
  const uint64_t n = U64();
  // Each component takes at least 16 bytes (a name's length, a dtype).
  if (n > (in_.size() - pos_) / 16) {
    Fail(
        fmt::format("an element of {} components, more than the {} bytes "
                    "left can hold",
                    n, in_.size() - pos_));
  }
  e.components.reserve(n);
  for (uint64_t i = 0; i < n; ++i) {
    std::string name = String();
    Tensor t = ReadTensor();
    e.components.push_back({std::move(name), std::move(t)});
  }
  if (Bool()) {
    e.origin.file = std::make_shared<const std::string>(String());
    e.origin.offset = U64();
    e.origin.record = U64();
  }
  return e;
}

void StateReader::Finish() {
  if (pos_ != in_.size()) {
    Fail(fmt::format("{} bytes left over after the last stage",
                     in_.size() - pos_));
  }
}

namespace {

// The error classes a saved result keeps (kind 3 of a buffered result).
enum class ErrorType : uint64_t {
  kPipeline,    // pipeline::Error, and any class not listed
  kRecords,     // records::Error
  kRecord,      // records::RecordError: path, offset, index, damage, detail
  kIo,          // records::IoError: path, detail, errno
  kParse,       // records::ParseError
  kDecompress,  // records::DecompressionError: detail, compressed offset
  kCsv,         // records::CsvError: row_level
  kFileList,    // records::FileListError
};

void WriteError(StateWriter* w, const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const records::RecordError& e) {
    w->U64(static_cast<uint64_t>(ErrorType::kRecord));
    w->String(e.path());
    w->U64(e.offset());
    w->U64(e.record_index());
    w->U64(static_cast<uint64_t>(e.kind()));
    w->String(e.detail());
  } catch (const records::IoError& e) {
    w->U64(static_cast<uint64_t>(ErrorType::kIo));
    w->String(e.path());
    w->String(e.detail());
    w->U64(static_cast<uint64_t>(e.errno_value()));
  } catch (const records::DecompressionError& e) {
    w->U64(static_cast<uint64_t>(ErrorType::kDecompress));
    w->String(e.detail());
    w->U64(e.compressed_offset());
  } catch (const records::CsvError& e) {
    w->U64(static_cast<uint64_t>(ErrorType::kCsv));
    w->String(e.what());
    w->Bool(e.row_level());
  } catch (const records::ParseError& e) {
    w->U64(static_cast<uint64_t>(ErrorType::kParse));
    w->String(e.what());
  } catch (const records::FileListError& e) {
    w->U64(static_cast<uint64_t>(ErrorType::kFileList));
    w->String(e.what());
  } catch (const records::Error& e) {
    w->U64(static_cast<uint64_t>(ErrorType::kRecords));
    w->String(e.what());
  } catch (const std::exception& e) {
    w->U64(static_cast<uint64_t>(ErrorType::kPipeline));
    w->String(e.what());
  } catch (...) {
    w->U64(static_cast<uint64_t>(ErrorType::kPipeline));
    w->String("unknown error");
  }
}

std::exception_ptr ReadError(StateReader* r) {
  const uint64_t type = r->U64();
  switch (static_cast<ErrorType>(type)) {
    case ErrorType::kPipeline:
      return std::make_exception_ptr(Error(r->String()));
    case ErrorType::kRecords:
      return std::make_exception_ptr(records::Error(r->String()));
    case ErrorType::kRecord: {
      std::string path = r->String();
      const uint64_t offset = r->U64();
      const uint64_t index = r->U64();
      const uint64_t kind = r->U64();
      if (kind >
          static_cast<uint64_t>(records::DamageKind::kDecompressionError)) {
        r->Fail("unknown kind of record damage");
      }
      return std::make_exception_ptr(records::RecordError(
          std::move(path), offset, index,
          static_cast<records::DamageKind>(kind), r->String()));
    }
    case ErrorType::kIo: {
      std::string path = r->String();
      std::string detail = r->String();
      const uint64_t errno_value = r->U64();
      if (errno_value > 4095) r->Fail("an errno out of range");
      return std::make_exception_ptr(records::IoError(
          std::move(path), std::move(detail), static_cast<int>(errno_value)));
    }
    case ErrorType::kParse:
      return std::make_exception_ptr(records::ParseError(r->String()));
    case ErrorType::kDecompress: {
      std::string detail = r->String();
      return std::make_exception_ptr(
          records::DecompressionError(std::move(detail), r->U64()));
    }
    case ErrorType::kCsv: {
      std::string what = r->String();
      return std::make_exception_ptr(
          records::CsvError(std::move(what), r->Bool()));
    }
    case ErrorType::kFileList:
      return std::make_exception_ptr(records::FileListError(r->String()));
  }
  r->Fail(fmt::format("unknown error type {}", type));
}

}  // namespace

void WriteResult(StateWriter* w, bool end, const std::exception_ptr& error,
                 const Element& element) {
  if (end) {
    w->U64(0);
  } else if (error) {
    w->U64(3);
    WriteError(w, error);
  } else {
    w->U64(2);
    w->WriteElement(element);
  }
}

void ReadResult(StateReader* r, bool* end, std::exception_ptr* error,
                Element* element) {
  switch (r->U64()) {
    case 0:
      *end = true;
      break;
    case 1:  // written before errors kept their type: a message
      *error = std::make_exception_ptr(Error(r->String()));
      break;
    case 2:
      *element = r->ReadElement();
      break;
    case 3:
      *error = ReadError(r);
      break;
    default:
      r->Fail("unknown kind of buffered result");
  }
}

bool ReadResults(StateReader* r, uint64_t max_results,
                 const std::function<void(bool end, std::exception_ptr error,
                                          Element element)>& add) {
  const bool input_end = r->Bool();
  const uint64_t n = r->U64();
  if (n > max_results) {
    r->Fail(fmt::format("{} results held, more than the {} it holds at most", n,
                        max_results));
  }
  bool has_end = false;
  for (uint64_t i = 0; i < n; ++i) {
    bool end = false;
    std::exception_ptr error;
    Element element;
    ReadResult(r, &end, &error, &element);
    if (end && i + 1 != n) {
      r->Fail(fmt::format("the end of the input at slot {} of {}, not the last",
                          i, n));
    }
    has_end = end;
    add(end, std::move(error), std::move(element));
  }
  if (input_end != has_end) {
    r->Fail(fmt::format("the input is marked {}ended but the buffer {} its end",
                        input_end ? "" : "not ", has_end ? "holds" : "lacks"));
  }
  return input_end;
}

std::string EncodeElementRecord(const Element& e) {
  StateWriter w(kElementRecordTag);
  w.WriteElement(e);
  return std::move(w).Finish();
}

Element DecodeElementRecord(std::string_view blob) {
  StateReader r(blob, kElementRecordTag);
  Element e = r.ReadElement();
  r.Finish();
  return e;
}

}  // namespace recflow::pipeline
