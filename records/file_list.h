// Turning what a user names (files, glob patterns, directories) into the
// list of record files to read, the same way for every command and for
// pipeline sources.
#ifndef RECFLOW_RECORDS_FILE_LIST_H_
#define RECFLOW_RECORDS_FILE_LIST_H_

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "records/errors.h"

namespace recflow::records {

// A name that matches nothing usable.
class FileListError : public Error {
 public:
  using Error::Error;
};

// Whether a directory entry counts as a record file: the name holds
// "tfrecord" or "tfrec", is not hidden, and is not an index (".idx").
bool IsRecordFileName(const std::string& name);

// tf.io.matching_files: every name that one of `patterns` matches (glob(3):
// *, ? and [...]; a name without them matches itself if it exists), all
// sorted together; a name two patterns match is there twice.  Matching
// nothing is no error here.
std::vector<std::string> MatchFiles(const std::vector<std::string>& patterns);

// Expands, in order: a file stays as given; a directory becomes its record
// files (IsRecordFileName), sorted; a name with glob characters (*?[)
// that is not an existing file becomes its matches, sorted.  Throws
// FileListError for a name that does not exist, a directory without record
// files, or a pattern without matches.
std::vector<std::string> ExpandRecordPaths(
    const std::vector<std::string>& args);

// The first of `files` that is the same file as an earlier one (by device
// and inode: overlapping globs, "a" and "./a"), with that earlier name;
// none when each file is named once.  Names that cannot be stat'ed are
// skipped (their reader reports them).  For the commands that would copy a
// file's data twice (convert, reshard).
std::optional<std::pair<std::string, std::string>> FindFileNamedTwice(
    const std::vector<std::string>& files);

// Throws IoError naming the first of `files` that is not a regular file (a
// pipe, socket, terminal or other device; links are followed), with `why`
// one is needed, e.g. "reshard reads its inputs twice".  For the readers
// that read a file more than once or at offsets, which a pipe cannot give:
// without this a second pass over a pipe reads nothing (silently fewer
// records) and reopening a named pipe waits for a writer forever.  Names
// that cannot be stat'ed are skipped (their reader reports them).  Only
// stats the names: opening a named pipe would block.
void RequireRegularFiles(const std::vector<std::string>& files,
                         std::string_view why);
// Its error's detail (after the path), for a reader that found the file
// not regular through a stat of its own.
std::string NotRegularFileDetail(std::string_view why);

}  // namespace recflow::records

#endif  // RECFLOW_RECORDS_FILE_LIST_H_
