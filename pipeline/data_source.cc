#include "pipeline/data_source.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>

#include "pipeline/error.h"
#include "pipeline/io.h"
#include "pipeline/process.h"
#include "pipeline/stages.h"
#include "records/aligned_buffer.h"
#include "records/file.h"
#include "records/file_list.h"
#include "records/index.h"
#include "records/tfrecord_format.h"

namespace recflow::pipeline {

namespace {

// Records read together whose frames lie at most this far apart in a file
// are read with one read (the bytes between them read and not used): a
// page of page cache costs less to copy than a read costs to make.
constexpr uint64_t kGapBytes = 4096;
// No read longer than this (io_uring takes a 32-bit length).
constexpr uint64_t kMaxReadBytes = uint64_t{64} << 20;

}  // namespace

// One file: its index, and what reads it, made at its first read.
struct TFRecordDataSource::File {
  std::shared_ptr<const records::Index> index;
  std::once_flag opened;
  std::unique_ptr<records::ReadableFile> file;  // uncompressed
  std::mutex zstd_mu;  // ZSTD: IndexedReader is not thread-safe
  std::unique_ptr<records::IndexedReader> zstd;
};

TFRecordDataSource::TFRecordDataSource(std::vector<std::string> files,
                                       std::optional<records::FeatureSpec> spec)
    : files_(std::move(files)), spec_(std::move(spec)) {
  if (files_.empty()) throw Error("TFRecordDataSource: no files");
  records::RequireRegularFiles(files_, "a data source reads files at offsets");
  auto names = std::make_shared<BatchOrigins::Files>();
  for (const std::string& f : files_) {
    names->push_back(std::make_shared<const std::string>(f));
    auto state = std::make_unique<File>();
    state->index =
        std::make_shared<const records::Index>(records::LoadOrBuildIndex(
            f, records::ReadableFile(f).size(), [&](const std::string& idx) {
              LogLine(fmt::format(
                  "recflow: {}: no index {}; indexing it in memory (`recflow "
                  "index` writes one)",
                  f, idx));
            }));
    starts_.push_back(total_);
    total_ += state->index->entries.size();
    file_state_.push_back(std::move(state));
  }
  names_ = std::move(names);
  if (spec_) parse_ = stages::MakeParseInfo(*spec_, ParseOptions{});
}

TFRecordDataSource::~TFRecordDataSource() = default;

TFRecordDataSource::Location TFRecordDataSource::Locate(uint64_t i) const {
  if (i >= total_) {
    throw std::out_of_range(
        fmt::format("record {} of a data source of {} records ({} files)", i,
                    total_, files_.size()));
  }
  // The last file starting at or before i (files without records start
  // where the next does, and are passed over).
  const auto it = std::upper_bound(starts_.begin(), starts_.end(), i);
  const size_t file = static_cast<size_t>(it - starts_.begin()) - 1;
  const uint64_t record = i - starts_[file];
  return {file, record, file_state_[file]->index->entries[record].offset};
}

const records::ReadableFile* TFRecordDataSource::Open(size_t file) const {
  File& f = *file_state_[file];
  std::call_once(f.opened, [&] {
    if (f.index->compression == records::Compression::kZstd) {
      f.zstd = std::make_unique<records::IndexedReader>(files_[file], f.index);
    } else {
      f.file = std::make_unique<records::ReadableFile>(files_[file]);
    }
  });
  return f.file.get();
}

void TFRecordDataSource::Read(std::span<const uint64_t> indices,
                              std::vector<std::string_view>* views,
                              std::vector<BatchOrigins::Row>* rows,
                              std::shared_ptr<const void>* owner) const {
  const size_t n = indices.size();
  std::vector<Location> at(n);
  for (size_t k = 0; k < n; ++k) at[k] = Locate(indices[k]);
  views->assign(n, {});
  rows->assign(n, {});
  // Uncompressed records, in file order: a record that follows the one
  // before it in its file (or lies at most kGapBytes after it, or repeats
  // it) extends that read, so that a run of neighbours is one read; every
  // read in flight together, into one buffer.
  std::vector<size_t> order;
  for (size_t k = 0; k < n; ++k) {
    (*rows)[k] = {at[k].offset, at[k].record, static_cast<uint32_t>(at[k].file),
                  false, 0};
    const File& f = *file_state_[at[k].file];
    if (f.index->compression == records::Compression::kZstd) continue;
    records::CheckIndexedFrameFits(*Open(at[k].file), at[k].record,
                                   f.index->entries[at[k].record]);
    order.push_back(k);
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return at[a].file != at[b].file ? at[a].file < at[b].file
                                    : at[a].offset < at[b].offset;
  });
  std::vector<RangeRead> reads;
  std::vector<size_t> read_of(n);
  size_t last_file = 0;
  for (const size_t k : order) {
    const records::IndexEntry& e =
        file_state_[at[k].file]->index->entries[at[k].record];
    RangeRead* last = reads.empty() ? nullptr : &reads.back();
    const uint64_t end = e.offset + e.size;
    if (last != nullptr && last_file == at[k].file &&
        e.offset <= last->offset + last->length + kGapBytes &&
        end - last->offset <= kMaxReadBytes) {
      last->length = std::max<uint64_t>(last->length, end - last->offset);
    } else {
      reads.push_back({Open(at[k].file), e.offset, e.size, nullptr, 0});
      last_file = at[k].file;
    }
    read_of[k] = reads.size() - 1;
  }
  uint64_t bytes = 0;
  for (const RangeRead& r : reads) bytes += r.length;
  // ZSTD records are decoded one by one after the reads, each payload (its
  // index entry's size less the framing) copied after the frames read.
  for (size_t k = 0; k < n; ++k) {
    const records::Index& index = *file_state_[at[k].file]->index;
    if (index.compression != records::Compression::kZstd) continue;
    bytes += index.entries[at[k].record].size - records::kFrameOverhead;
  }
  auto buffer = std::make_shared<records::AlignedVector<char>>(bytes);
  char* dst = buffer->data();
  for (RangeRead& r : reads) {
    r.dst = dst;
    dst += r.length;
  }
  if (!reads.empty()) ReadRanges(reads);
  for (const size_t k : order) {
    const RangeRead& r = reads[read_of[k]];
    const records::IndexEntry& e =
        file_state_[at[k].file]->index->entries[at[k].record];
    const uint64_t start = e.offset - r.offset;
    // Fewer bytes than the index gives only where the file shrank.
    const uint64_t got = r.done > start ? std::min(r.done - start, e.size) : 0;
    (*views)[k] = records::CheckIndexedFrame(files_[at[k].file], at[k].record,
                                             e, r.dst + start, got);
  }
  for (size_t k = 0; k < n; ++k) {
    File& f = *file_state_[at[k].file];
    if (f.index->compression != records::Compression::kZstd) continue;
    Open(at[k].file);
    std::lock_guard<std::mutex> lock(f.zstd_mu);
    // A frame of the entry's size, checked: its payload is that less the
    // framing, as counted above.
    const std::string_view payload = f.zstd->Read(at[k].record);
    std::copy(payload.begin(), payload.end(), dst);
    (*views)[k] = {dst, payload.size()};
    dst += payload.size();
  }
  *owner = std::move(buffer);
}

Element TFRecordDataSource::Get(std::span<const uint64_t> indices,
                                bool batched) const {
  if (!batched && indices.size() != 1) {
    throw Error(fmt::format(
        "TFRecordDataSource::Get: {} records asked for one element (not "
        "batched)",
        indices.size()));
  }
  std::vector<std::string_view> views;
  std::vector<BatchOrigins::Row> rows;
  std::shared_ptr<const void> owner;
  Read(indices, &views, &rows, &owner);
  Element out;
  if (batched) {
    out.batch_origins = std::make_shared<const BatchOrigins>(names_, rows);
  } else {
    out.origin = {(*names_)[rows[0].file], rows[0].offset, rows[0].record,
                  std::nullopt};
  }
  if (parse_ != nullptr) {
    stages::ParseRecords(*parse_, views, batched, &out);
    return out;
  }
  if (!batched) {
    out.Set("record", Tensor::BytesView(views[0].data(), views[0].size(),
                                        std::move(owner), views[0].size()));
    return out;
  }
  // The payloads back to back (the buffer holds each with its framing).
  out.Set("record", Tensor::FromStrings(
                        views, Shape{static_cast<int64_t>(views.size())}));
  return out;
}

}  // namespace recflow::pipeline
