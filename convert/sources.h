// Internal to convert/: what the formats' sources share (errors, files,
// sources that build while reading, typed cells) and each format's
// factory, one file per format.
#ifndef RECFLOW_CONVERT_SOURCES_H_
#define RECFLOW_CONVERT_SOURCES_H_

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "convert/convert.h"
#include "records/csv_reader.h"

namespace recflow::convert {

// Convert(job) once its source is open: `source`'s rows into job's shards
// (job.format and job.inputs are read only for the images' labels file).
ConvertSummary ConvertSource(const ConvertJob& job,
                             std::unique_ptr<ExampleSource> source);

[[noreturn]] void InputError(const std::string& what);
[[noreturn]] void RowError(const std::string& what);
// The row-level error for the record of the row `where` names, of `bytes`
// bytes, longer than `max_bytes` (ConvertJob::max_record_bytes).  Callers
// compare first, so that `where` is formatted only for such a row.
[[noreturn]] void RecordTooLong(size_t bytes, uint64_t max_bytes,
                                const std::string& where);

// The size of `path`; InputError when it cannot be read.
uint64_t FileSize(const std::string& path);

// A FILE* that closes itself.
struct File {
  explicit File(const std::string& path) : path(path) {
    f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) {
      InputError(
          fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
    }
  }
  ~File() {
    if (f) std::fclose(f);
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  std::string path;
  FILE* f = nullptr;
};

// A sequential byte stream: a file, or a member of a zip archive.
class ByteStream {
 public:
  virtual ~ByteStream() = default;
  virtual size_t Read(char* dst, size_t n) = 0;
  virtual uint64_t consumed() const = 0;  // input bytes read so far
  // Called once everything needed was read: checks what can be checked
  // only at the end (a zip member's CRC-32).
  virtual void Finish() {}
  // Reads exactly n bytes or throws naming `what`.
  void ReadExactly(char* dst, size_t n, const std::string& what) {
    if (Read(dst, n) != n) InputError(what);
  }
};

class FileStream final : public ByteStream {
 public:
  explicit FileStream(const std::string& path) : file_(path) {}
  size_t Read(char* dst, size_t n) override {
    const size_t got = std::fread(dst, 1, n, file_.f);
    consumed_ += got;
    return got;
  }
  uint64_t consumed() const override { return consumed_; }

 private:
  File file_;
  uint64_t consumed_ = 0;
};

// A big-endian 32-bit integer (IDX headers, PNG chunks).
inline uint32_t Be32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (p[1] << 16) | (p[2] << 8) | p[3];
}

// A source that builds each Example while reading it (arrays, IDX,
// images: the work is in the reading).
class BuildingSource : public ExampleSource {
 public:
  bool NextRow(Row* row) final;

 protected:
  // Writes the next row into `b`; false at the end.  Throws ConvertError.
  virtual bool Next(records::ExampleBuilder* b) = 0;
  // The row Next() last wrote, as this source's errors name it ("FILE:
  // row 3"): for an error found after Next() returned.
  virtual std::string RowName() const = 0;

 private:
  records::ExampleBuilder builder_;
};

// The typing pass's reports (ConvertProgress::typing): one every
// kRowsPerReport rows to `report`, when it is set.  Used while a source is
// made, within OpenSource's call.
class TypingReports {
 public:
  TypingReports(const std::function<void(const ConvertProgress&)>& report,
                uint64_t total_bytes)
      : report_(report), total_bytes_(total_bytes) {}
  // `n` rows read; `bytes_read()` is the input read by then, asked for a
  // report only.  A report for every multiple of kRowsPerReport passed.
  template <typename BytesRead>
  void Rows(uint64_t n, BytesRead bytes_read) {
    const uint64_t before = rows_;
    rows_ += n;
    if (!report_) return;
    for (uint64_t r = (before / kRowsPerReport + 1) * kRowsPerReport;
         r <= rows_; r += kRowsPerReport) {
      report_(ConvertProgress{.records = r,
                              .bytes_read = bytes_read(),
                              .total_bytes = total_bytes_,
                              .typing = true});
    }
  }

 private:
  static constexpr uint64_t kRowsPerReport = 4096;
  const std::function<void(const ConvertProgress&)>& report_;
  const uint64_t total_bytes_;
  uint64_t rows_ = 0;
};

// Typed cells (CSV and JSON Lines): records/csv_reader.h's inference.
using records::CellType;
using records::InferCell;
using records::Widen;
// The spec's dtype for `name`, if it names it; else `inferred`.
CellType FromSpec(const records::FeatureSpec* spec, const std::string& name,
                  CellType inferred);

// Integers that a float feature could not hold exactly (float32 keeps 24
// bits of one), noted by column or key during a source's typing pass, and
// the warnings they give once the types are known: a float column's
// integers are rounded, which would otherwise change data unsaid.
class InexactIntegers {
 public:
  // The float32 that `value` becomes when it is not `value` (none when
  // it is).
  static std::optional<float> Rounded(int64_t value);
  static std::optional<float> Rounded(uint64_t value);
  // `count` values (one unless stated) under the column or key numbered
  // `slot`, the first Rounded() to `became`; its text `literal()` and
  // place `where()` ("file:line") are asked for the first of a slot only,
  // the one told.
  template <typename Literal, typename Where>
  void Add(size_t slot, float became, Literal literal, Where where,
           uint64_t count = 1) {
    if (count == 0) return;
    if (slot >= seen_.size()) seen_.resize(slot + 1);
    Seen& s = seen_[slot];
    const bool first = s.count == 0;
    s.count += count;
    if (first) {
      s.where = where();
      s.literal = literal();
      s.became = became;
    }
  }
  // The warning for slot `slot`, the column or key `name` (`what`:
  // "column" or "key"), once it is typed `type`: none unless it is kFloat
  // and held such an integer.
  std::optional<std::string> Warning(size_t slot, const std::string& name,
                                     std::string_view what,
                                     CellType type) const;

 private:
  struct Seen {
    uint64_t count = 0;
    std::string where, literal;  // the first
    float became = 0;
  };
  std::vector<Seen> seen_;
};

// Integers a float32 rounds under one column or key within a stretch of
// the input read in order (a line's member, a typing chunk's column): how
// many, and the first's value, text and line.  Noted where the stretch is
// typed (any thread), added to an InexactIntegers in input order.
struct RoundedRun {
  uint64_t count = 0;
  float first_became = 0;
  std::string first_text;  // as written
  uint64_t line = 0;

  // One more, Rounded() to `became`; its text `text()` and line `at` are
  // asked for and kept for the first only.
  template <typename Text>
  void Note(float became, Text text, uint64_t at) {
    if (count++ == 0) {
      first_became = became;
      first_text = text();
      line = at;
    }
  }
  void Clear() { count = 0; }
  // Into `inexact`'s `slot`, the first's place "path:line".
  void AddTo(InexactIntegers* inexact, size_t slot,
             const std::string& path) const {
    inexact->Add(
        slot, first_became, [&] { return first_text; },
        [&] { return fmt::format("{}:{}", path, line); }, count);
  }
};

// The typing pass of CSV and JSON Lines runs through RunRing (ring.h) in
// chunks of one file's rows, ended at kTypingRows rows or kTypingBytes of
// text, or the file's end, kTypingChunks in flight (what bounds the rows
// in memory).
constexpr size_t kTypingRows = 1024;
constexpr size_t kTypingBytes = size_t{1} << 20;
constexpr size_t kTypingChunks = 16;

// The warning for a column or key that no value typed (and no spec did).
std::string UntypedWarning(std::string_view what, const std::string& name,
                           std::string_view how_empty);

// The formats (csv.cc, jsonl.cc, npy.cc, idx.cc, images.cc).
std::unique_ptr<ExampleSource> OpenCsv(
    std::vector<std::string> files, const records::FeatureSpec* spec,
    char delimiter, uint64_t max_row_bytes,
    const std::function<void(const ConvertProgress&)>& typing);
std::unique_ptr<ExampleSource> OpenJsonl(
    std::vector<std::string> files, const records::FeatureSpec* spec,
    uint64_t max_row_bytes,
    const std::function<void(const ConvertProgress&)>& typing);
std::unique_ptr<ExampleSource> OpenNpy(const std::vector<std::string>& files);
std::unique_ptr<ExampleSource> OpenNpz(const std::string& path);
std::unique_ptr<ExampleSource> OpenIdx(const std::string& images,
                                       const std::string& labels);
std::unique_ptr<ExampleSource> OpenImages(const std::string& directory);

}  // namespace recflow::convert

#endif  // RECFLOW_CONVERT_SOURCES_H_
