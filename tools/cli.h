// Shared pieces of the `recflow` commands: exit codes, input expansion,
// errors to stderr, and the registry of subcommands.
#ifndef RECFLOW_TOOLS_CLI_H_
#define RECFLOW_TOOLS_CLI_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "convert/convert.h"
#include "records/tfrecord_reader.h"
#include "records/tfrecord_writer.h"

namespace recflow::tools {

// Exit codes shared by every command.
inline constexpr int kExitOk = 0;
inline constexpr int kExitDamage = 1;  // the data is damaged
inline constexpr int kExitUsage = 2;   // bad arguments, or an I/O error

// Thrown for bad arguments; main() prints it and exits with kExitUsage.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The exit code for a command's error: kExitDamage for damaged data (a
// record, an Example, a converter's input), kExitUsage for the rest (bad
// arguments, I/O, no GPU).
int ExitCodeFor(const std::exception& e);

// Files named on the command line, with directories expanded to the record
// files in them (sorted; names containing "tfrecord" or "tfrec", not hidden,
// not ending in ".idx") and glob patterns into their matches (records::
// ExpandRecordPaths).  Throws UsageError for a missing path or a
// directory without record files.
std::vector<std::string> ExpandInputs(const std::vector<std::string>& args);

// Throws UsageError "F is named twice (also as G): <why>" when two of
// `files` are one file (overlapping globs, "a" and "./a"; by device and
// inode), for the commands that would copy its data twice.  A file that
// cannot be stat'ed is left to the reader to report.
void CheckEachFileOnce(const std::vector<std::string>& files,
                       std::string_view why);

// A subcommand: registers its options on `app` and returns what runs it.
using Runner = std::function<int()>;
Runner AddCatCommand(CLI::App& app);
Runner AddCountCommand(CLI::App& app);
Runner AddInspectCommand(CLI::App& app);
Runner AddConvertCommand(CLI::App& app);
Runner AddVerifyCommand(CLI::App& app);
Runner AddReshardCommand(CLI::App& app);
Runner AddIndexCommand(CLI::App& app);
Runner AddDemoCommand(CLI::App& app);
Runner AddBenchCommand(CLI::App& app);
Runner AddTrainCommand(CLI::App& app);
Runner AddSummaryCommand(CLI::App& app);

// CLI11 checks for counts and fractions, with a message that says what is
// wanted ("--batch: expected a positive number, not 0") rather than CLI11's
// ranges of doubles.
const CLI::Validator& Positive();               // > 0
const CLI::Validator& NonNegative();            // >= 0
const CLI::Validator& AutotuneOrNonNegative();  // -1 (autotune) or >= 0
const CLI::Validator& Fraction();               // in [0, 1)

// Writer options for commands that write shards (reshard, convert), from
// their flags.  `level` 0 is the codec's default; otherwise gzip and zlib
// take 1-9 (as gzip's CLI) and zstd 1-19 (as zstd's without --ultra).
// Throws UsageError for an --output prefix that names no shard
// (convert::ShardPrefixProblem), zero shards, an unknown compression, a
// level out of range or with none, or --index with a compression that
// cannot be indexed (zlib, gzip).
records::WriterOptions ShardWriterOptions(const std::string& prefix,
                                          uint64_t shards,
                                          const std::string& compression,
                                          bool index, int level);

using convert::ShardName;
using convert::ShardResult;
// Reads `files` (twice: to count, then to copy) and writes their records,
// in order, into `shards` balanced shards named ShardName(prefix, ...),
// with FILE.idx beside each when `write_index`.  All shards appear together
// or none does.  Throws IoError for an input that is not a regular file (a
// pipe cannot be read twice) and what the readers and writers throw.
std::vector<ShardResult> Reshard(const std::vector<std::string>& files,
                                 const std::string& prefix, uint64_t shards,
                                 records::WriterOptions writer_options,
                                 const records::ReaderOptions& reader_options,
                                 bool write_index);
// The same with the records in a uniform random order of `seed` (every
// record once; pipeline::Dataset::FromTFRecordsGlobalShuffle, which reads
// them by index: FILE.idx, or each file indexed in memory first).
std::vector<ShardResult> ReshardShuffled(const std::vector<std::string>& files,
                                         const std::string& prefix,
                                         uint64_t shards, uint64_t seed,
                                         records::WriterOptions writer_options,
                                         bool write_index);

// "unknown KIND 'NAME'; did you mean 'X'?" with the candidate closest to
// `name` (edit distance, with adjacent swaps; a candidate that `name`
// begins counts as close), or, when none is close, "unknown KIND 'NAME'
// (HINT)".  For commands and options typed wrong.
std::string UnknownNameMessage(const std::string& kind, const std::string& name,
                               const std::vector<std::string>& candidates,
                               const std::string& hint);

// Throughput for humans: "123.4 MB/s".
std::string FormatRate(double bytes, double seconds);

}  // namespace recflow::tools

#endif  // RECFLOW_TOOLS_CLI_H_
