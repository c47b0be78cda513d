#include "convert/sources.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <regex>

#include "records/csv_reader.h"
#include "records/file_list.h"

namespace recflow::convert {

using records::DType;

[[noreturn]] void InputError(const std::string& what) {
  throw ConvertError(what, /*row_level=*/false);
}
[[noreturn]] void RowError(const std::string& what) {
  throw ConvertError(what, /*row_level=*/true);
}

void RecordTooLong(size_t bytes, uint64_t max_bytes, const std::string& where) {
  RowError(fmt::format(
      "{}: its record is {} bytes, more than the {} a record may have "
      "(protobuf parses no tf.train.Example of 2 GiB or more, and readers "
      "refuse longer records)",
      where, bytes, max_bytes));
}

uint64_t FileSize(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    InputError(fmt::format("{}: cannot stat: {}", path, std::strerror(errno)));
  }
  return static_cast<uint64_t>(st.st_size);
}

bool BuildingSource::NextRow(Row* row) {
  builder_.Clear();
  row->built = true;
  row->error.clear();
  try {
    if (!Next(&builder_)) return false;
    row->example.assign(builder_.Serialize());
    if (row->example.size() > max_record_bytes()) {
      RecordTooLong(row->example.size(), max_record_bytes(), RowName());
    }
  } catch (const ConvertError& e) {
    if (!e.row_level()) throw;
    row->error = e.what();
  }
  return true;
}

CellType FromSpec(const records::FeatureSpec* spec, const std::string& name,
                  CellType inferred) {
  const records::FeatureConfig* c = spec ? spec->Find(name) : nullptr;
  if (c == nullptr) return inferred;
  switch (c->dtype) {
    case DType::kInt64:
      return CellType::kInt64;
    case DType::kFloat32:
      return CellType::kFloat;
    case DType::kBytes:
      return CellType::kBytes;
    default:  // not an Example dtype: FeatureSpec::Add refuses it
      break;
  }
  return inferred;
}

std::optional<float> InexactIntegers::Rounded(int64_t value) {
  const float f = static_cast<float>(value);
  // 2^63 (a value rounded up past int64) converts to no int64.
  if (f >= -0x1p63f && f < 0x1p63f && static_cast<int64_t>(f) == value) {
    return std::nullopt;
  }
  return f;
}

std::optional<float> InexactIntegers::Rounded(uint64_t value) {
  const float f = static_cast<float>(value);
  if (f < 0x1p64f && static_cast<uint64_t>(f) == value) return std::nullopt;
  return f;
}

std::optional<std::string> InexactIntegers::Warning(size_t slot,
                                                    const std::string& name,
                                                    std::string_view what,
                                                    CellType type) const {
  if (type != CellType::kFloat || slot >= seen_.size() ||
      seen_[slot].count == 0) {
    return std::nullopt;
  }
  const Seen& s = seen_[slot];
  return fmt::format(
      "{}: {} '{}': the integer {} becomes {:.0f} in the {}'s float feature "
      "(float32 holds integers exactly only up to 2^24; {} such value{} in "
      "all); if every value is an integer, a --spec entry of dtype int64 "
      "keeps them exact",
      s.where, what, name, s.literal, static_cast<double>(s.became), what,
      s.count, s.count == 1 ? "" : "s");
}

std::string UntypedWarning(std::string_view what, const std::string& name,
                           std::string_view how_empty) {
  return fmt::format(
      "{} '{}' is {}: no feature is written for it (no value to infer its "
      "type from; a --spec entry gives it one)",
      what, name, how_empty);
}

void ExampleSource::Build(const Row& row, records::ExampleBuilder*) const {
  throw ConvertError(
      fmt::format("{}:{}: internal error: this source builds its rows "
                  "while reading them",
                  row.path, row.line),
      /*row_level=*/false);
}

std::unique_ptr<ExampleSource> OpenSource(
    const std::string& format, const ConvertInputs& in,
    const std::function<void(const ConvertProgress&)>& typing) {
  // CSV and JSON Lines are read twice (types are inferred from every cell
  // first), the others at offsets: a pipe would give its rows once, then
  // nothing.
  auto regular = [](const std::vector<std::string>& files) {
    records::RequireRegularFiles(
        files, "convert reads its inputs more than once or at offsets");
  };
  auto need_files = [&] {
    if (in.files.empty()) InputError(format + ": no INPUT files given");
    if (const auto twice = records::FindFileNamedTwice(in.files)) {
      InputError(
          fmt::format("{} is named twice (also as {}): its rows would "
                      "be converted twice",
                      twice->first, twice->second));
    }
    regular(in.files);
  };
  if (format == "csv") {
    need_files();
    return OpenCsv(in.files, in.spec, in.delimiter, in.max_row_bytes, typing);
  }
  if (format == "jsonl") {
    need_files();
    return OpenJsonl(in.files, in.spec, in.max_row_bytes, typing);
  }
  if (format == "npy") {
    need_files();
    return OpenNpy(in.files);
  }
  if (format == "npz") {
    if (in.files.size() != 1) InputError("npz: give exactly one .npz file");
    regular(in.files);
    return OpenNpz(in.files[0]);
  }
  if (format == "idx") {
    if (in.images.empty() || in.labels.empty()) {
      InputError("idx: give --images FILE and --labels FILE");
    }
    regular({in.images, in.labels});
    return OpenIdx(in.images, in.labels);
  }
  if (format == "images") {
    if (in.files.size() != 1) {
      InputError(
          "images: give exactly one directory (one subfolder per "
          "class)");
    }
    return OpenImages(in.files[0]);
  }
  InputError(
      fmt::format("unknown format '{}': expected csv, jsonl, npy, "
                  "npz, idx or images",
                  format));
}

std::string ShardName(const std::string& prefix, uint64_t shard,
                      uint64_t shards, std::string_view suffix) {
  return fmt::format("{}-{:05d}-of-{:05d}.tfrecord{}", prefix, shard, shards,
                     suffix);
}

std::optional<std::string> OtherShardsWarning(const std::string& prefix,
                                              uint64_t shards,
                                              std::string_view suffix) {
  namespace fs = std::filesystem;
  const fs::path p(prefix);
  const fs::path folder = p.has_parent_path() ? p.parent_path() : ".";
  const std::string stem = p.filename().string() + "-";
  // NNNNN-of-MMMMM.tfrecord and a compression's suffix, as ShardName
  // (a shard number of at most 19 digits fits in uint64_t).
  static const std::regex kShard(
      R"(([0-9]{5,19})-of-[0-9]{5,}\.tfrecord(\.zz|\.gz|\.zst)?)");
  std::vector<std::string> others;
  std::error_code ec;
  for (fs::directory_iterator it(folder, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::smatch m;
    if (!name.starts_with(stem)) continue;
    const std::string rest = name.substr(stem.size());
    if (!std::regex_match(rest, m, kShard)) continue;
    const uint64_t shard = std::stoull(m[1].str());
    if (shard < shards &&
        rest == ShardName("", shard, shards, suffix).substr(1)) {
      continue;  // one of this run's
    }
    others.push_back(
        (p.has_parent_path() ? folder / name : fs::path(name)).string());
  }
  if (others.empty()) return std::nullopt;
  std::sort(others.begin(), others.end());
  const size_t named = std::min<size_t>(others.size(), 3);
  std::string list = fmt::format(
      "{}", fmt::join(others.begin(), others.begin() + named, ", "));
  if (others.size() > named) {
    list += fmt::format(" and {} more", others.size() - named);
  }
  return fmt::format(
      "{} other shard file{} of the prefix {} (an earlier run's?): {}; a "
      "glob {}-* reads {} too (remove {}, or write to another prefix)",
      others.size(), others.size() == 1 ? "" : "s", prefix, list, prefix,
      others.size() == 1 ? "it" : "them", others.size() == 1 ? "it" : "them");
}

std::optional<std::string> ShardPrefixProblem(const std::string& prefix,
                                              uint64_t shards) {
  if (prefix.empty()) {
    return fmt::format("is empty: give a prefix (NAME writes {})",
                       ShardName("NAME", 0, shards, ""));
  }
  if (prefix.back() == '/') {
    return fmt::format(
        "'{}' ends in a folder: name the shards too ({}NAME writes {})", prefix,
        prefix, ShardName(prefix + "NAME", 0, shards, ""));
  }
  return std::nullopt;
}

}  // namespace recflow::convert
