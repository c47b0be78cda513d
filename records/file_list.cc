#include "records/file_list.h"

#include <fmt/format.h>
#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>

namespace recflow::records {

bool IsRecordFileName(const std::string& name) {
  if (name.empty() || name[0] == '.') return false;
  if (name.size() >= 4 && name.compare(name.size() - 4, 4, ".idx") == 0) {
    return false;
  }
  return name.find("tfrecord") != std::string::npos ||
         name.find("tfrec") != std::string::npos;
}

std::vector<std::string> MatchFiles(const std::vector<std::string>& patterns) {
  std::vector<std::string> out;
  for (const std::string& pattern : patterns) {
    glob_t g{};
    if (::glob(pattern.c_str(), 0, nullptr, &g) == 0) {
      for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
    }
    ::globfree(&g);
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

std::vector<std::string> Glob(const std::string& pattern) {
  std::vector<std::string> out = MatchFiles({pattern});
  if (out.empty()) {
    throw FileListError(fmt::format(
        "{}: no such file, and no file matches it as a pattern", pattern));
  }
  return out;
}

}  // namespace

std::vector<std::string> ExpandRecordPaths(
    const std::vector<std::string>& args) {
  std::vector<std::string> files;
  for (const std::string& arg : args) {
    struct stat st;
    if (::stat(arg.c_str(), &st) != 0) {
      if (arg.find_first_of("*?[") != std::string::npos) {
        for (auto& f : Glob(arg)) files.push_back(std::move(f));
        continue;
      }
      throw FileListError(fmt::format("{}: no such file or directory", arg));
    }
    if (!S_ISDIR(st.st_mode)) {
      files.push_back(arg);
      continue;
    }
    std::vector<std::string> found;
    for (const auto& entry : std::filesystem::directory_iterator(arg)) {
      if (!entry.is_regular_file()) continue;
      if (IsRecordFileName(entry.path().filename().string())) {
        found.push_back(entry.path().string());
      }
    }
    if (found.empty()) {
      throw FileListError(
          fmt::format("{}: directory holds no record files (names containing "
                      "'tfrecord' or 'tfrec', not hidden, not .idx)",
                      arg));
    }
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

std::optional<std::pair<std::string, std::string>> FindFileNamedTwice(
    const std::vector<std::string>& files) {
  std::map<std::pair<dev_t, ino_t>, const std::string*> seen;
  for (const std::string& f : files) {
    struct stat st;
    if (stat(f.c_str(), &st) != 0) continue;
    const auto [it, fresh] = seen.emplace(std::pair{st.st_dev, st.st_ino}, &f);
    if (!fresh) return std::pair{f, *it->second};
  }
  return std::nullopt;
}

void RequireRegularFiles(const std::vector<std::string>& files,
                         std::string_view why) {
  for (const std::string& f : files) {
    struct stat st;
    if (stat(f.c_str(), &st) != 0 || S_ISREG(st.st_mode)) continue;
    if (S_ISDIR(st.st_mode)) continue;  // the expansion or reader says so
    throw IoError(f, NotRegularFileDetail(why));
  }
}

std::string NotRegularFileDetail(std::string_view why) {
  return fmt::format(
      "not a regular file (a pipe, socket or device): {}; write it to a "
      "file first",
      why);
}

}  // namespace recflow::records
