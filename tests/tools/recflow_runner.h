// Runs the `recflow` binary for the CLI tests.
#ifndef RECFLOW_TESTS_TOOLS_RECFLOW_RUNNER_H_
#define RECFLOW_TESTS_TOOLS_RECFLOW_RUNNER_H_

#include <sys/wait.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "test_util.h"

namespace recflow::testing {

struct Result {
  int code;
  std::string out;
  std::string err;
  // The last line of stdout, parsed as JSON.
  nlohmann::json Json() const {
    std::string s = out;
    while (!s.empty() && s.back() == '\n') s.pop_back();
    return nlohmann::json::parse(s.substr(s.rfind('\n') + 1));
  }
};

// `recflow ARGS` with stdin from /dev/null; stdout and stderr go through
// hidden files in `dir`.
inline Result Recflow(const TempDir& dir, const std::string& args) {
  const std::string out = dir.File(".stdout"), err = dir.File(".stderr");
  const std::string cmd = std::string(RECFLOW_BINARY) + " " + args + " > " +
                          out + " 2> " + err + " < /dev/null";
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, ReadFileBytes(out),
          ReadFileBytes(err)};
}

}  // namespace recflow::testing

#endif  // RECFLOW_TESTS_TOOLS_RECFLOW_RUNNER_H_
