#include "tools/cli.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "convert/convert.h"
#include "records/csv_reader.h"
#include "records/errors.h"
#include "records/example_parser.h"
#include "records/file_list.h"

namespace recflow::tools {
std::vector<std::string> ExpandInputs(const std::vector<std::string>& args) {
  try {
    return records::ExpandRecordPaths(args);
  } catch (const records::FileListError& e) {
    throw UsageError(e.what());
  }
}

void CheckEachFileOnce(const std::vector<std::string>& files,
                       std::string_view why) {
  if (const auto twice = records::FindFileNamedTwice(files)) {
    throw UsageError(fmt::format("{} is named twice (also as {}): {}",
                                 twice->first, twice->second, why));
  }
}

records::WriterOptions ShardWriterOptions(const std::string& prefix,
                                          uint64_t shards,
                                          const std::string& compression,
                                          bool index, int level) {
  if (shards == 0) throw UsageError("--shards must be at least 1");
  if (const auto problem = convert::ShardPrefixProblem(prefix, shards)) {
    throw UsageError("--output " + *problem);
  }
  const auto c = records::ParseCompression(compression);
  if (!c) {
    throw UsageError(fmt::format(
        "--compression {}: expected none, zlib, gzip or zstd", compression));
  }
  if (index && (*c == records::Compression::kZlib ||
                *c == records::Compression::kGzip)) {
    throw UsageError(
        "--index needs --compression none or zstd: a zlib or gzip stream "
        "cannot be entered in the middle");
  }
  if (level != 0) {
    const int most = *c == records::Compression::kZstd ? 19 : 9;
    if (*c == records::Compression::kNone) {
      throw UsageError(
          "--compression-level needs --compression zlib, gzip or zstd");
    }
    if (level < 1 || level > most) {
      throw UsageError(fmt::format("--compression-level {}: {} takes 1 to {}",
                                   level, records::CompressionName(*c), most));
    }
  }
  records::WriterOptions options;
  options.compression = *c;
  options.level = level;
  options.build_index = index;
  return options;
}

namespace {
// Optimal string alignment distance: insertions, deletions, substitutions
// and swaps of adjacent characters, each costing one.
size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1,
                                     std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] =
          std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}
}  // namespace

std::string UnknownNameMessage(const std::string& kind, const std::string& name,
                               const std::vector<std::string>& candidates,
                               const std::string& hint) {
  const std::string* best = nullptr;
  size_t best_distance = 0;
  for (const auto& c : candidates) {
    // A prefix ("conv" for "convert") is as good as one typo.
    const size_t d = c.size() > name.size() &&
                             c.compare(0, name.size(), name) == 0 &&
                             name.find_first_not_of('-') < name.size()
                         ? 1
                         : EditDistance(name, c);
    if (best == nullptr || d < best_distance) {
      best = &c;
      best_distance = d;
    }
  }
  // Close: at most a third of the name wrong (at least one edit, at most
  // three), as git's and cargo's suggestions.
  const size_t limit = std::clamp<size_t>(name.size() / 3, 1, 3);
  if (best != nullptr && best_distance <= limit) {
    return fmt::format("unknown {} '{}'; did you mean '{}'?", kind, name,
                       *best);
  }
  return fmt::format("unknown {} '{}' ({})", kind, name, hint);
}

std::string FormatRate(double bytes, double seconds) {
  if (seconds <= 0) return "-";
  return fmt::format("{:.1f} MB/s", bytes / seconds / 1e6);
}

namespace {

// A number that satisfies `ok`, else "expected WHAT, not VALUE".
CLI::Validator NumberCheck(bool (*ok)(double), const char* what) {
  return CLI::Validator(
      [ok, what](std::string& value) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(value, v) || !ok(v)) {
          return fmt::format("expected {}, not {}", what, value);
        }
        return {};
      },
      what, what);
}

}  // namespace

const CLI::Validator& Positive() {
  static const CLI::Validator check =
      NumberCheck([](double v) { return v > 0; }, "a positive number");
  return check;
}

const CLI::Validator& NonNegative() {
  static const CLI::Validator check =
      NumberCheck([](double v) { return v >= 0; }, "zero or more");
  return check;
}

const CLI::Validator& AutotuneOrNonNegative() {
  static const CLI::Validator check = NumberCheck(
      [](double v) { return v >= -1 && v == static_cast<int64_t>(v); },
      "-1 (autotune), 0 or more");
  return check;
}

const CLI::Validator& Fraction() {
  static const CLI::Validator check = NumberCheck(
      [](double v) { return v >= 0 && v < 1; }, "a fraction in [0, 1)");
  return check;
}

int ExitCodeFor(const std::exception& e) {
  const bool damage = dynamic_cast<const records::RecordError*>(&e) ||
                      dynamic_cast<const convert::ConvertError*>(&e) ||
                      dynamic_cast<const records::CsvError*>(&e) ||
                      dynamic_cast<const records::ParseError*>(&e);
  return damage ? kExitDamage : kExitUsage;
}

}  // namespace recflow::tools
