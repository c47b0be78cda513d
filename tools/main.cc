// recflow: TFRecord files converted, read, verified, resharded, indexed,
// benchmarked and trained on.  See `recflow --help`.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pipeline/process.h"
#include "tools/cli.h"

namespace {
// The first --option on the command line that `sub` does not have, as a
// message naming the closest it has; nullopt when every one is known.
std::optional<std::string> UnknownOption(const CLI::App& sub, int argc,
                                         char** argv) {
  std::vector<std::string> options;
  for (const CLI::Option* o : sub.get_options()) {
    for (const auto& l : o->get_lnames()) options.push_back("--" + l);
  }
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") break;  // the rest are positional
    if (arg.rfind("--", 0) != 0) continue;
    arg = arg.substr(0, arg.find('='));
    if (std::find(options.begin(), options.end(), arg) == options.end()) {
      return recflow::tools::UnknownNameMessage(
          "option", arg, options,
          fmt::format("see `recflow {} --help`", sub.get_name()));
    }
  }
  return std::nullopt;
}

int Run(int argc, char** argv) {
  using namespace recflow::tools;
  recflow::pipeline::TuneAllocatorForBatches();
  CLI::App app{
      "recflow: from raw data to a training step. Convert datasets into "
      "TFRecord files (read and written exactly as TensorFlow does), inspect "
      "and verify them, stream them through an input pipeline, benchmark "
      "that stream, and train on it.\n"
      "Exit codes: 0 success, 1 damaged data found, 2 usage or I/O error."};
  app.name("recflow");
  app.set_version_flag("--version", "recflow 0.1.0");
  app.require_subcommand(1);
  std::vector<std::pair<CLI::App*, Runner>> commands;
  auto add = [&](const char* name, const char* help,
                 Runner (*register_fn)(CLI::App&)) {
    CLI::App* sub = app.add_subcommand(name, help);
    commands.emplace_back(sub, register_fn(*sub));
  };
  add("cat", "Print records as tf.train.Example (text format or JSON).",
      AddCatCommand);
  add("inspect",
      "Summarise the features of Example records; infer a FeatureSpec.",
      AddInspectCommand);
  add("convert",
      "Convert CSV, JSON Lines, NumPy, IDX or image folders to sharded "
      "TFRecords of tf.train.Example.",
      AddConvertCommand);
  add("count", "Count the records of TFRecord files, verifying both CRCs.",
      AddCountCommand);
  add("verify",
      "Check every record of TFRecord files; optionally salvage the readable "
      "ones.",
      AddVerifyCommand);
  add("reshard", "Rewrite records, in order, into N balanced shards.",
      AddReshardCommand);
  add("index", "Write the index (DALI tfrecord2idx format) of TFRecord files.",
      AddIndexCommand);
  add("bench",
      "Run an input pipeline (read, shuffle, batch, parse, prefetch) over "
      "files; report throughput, memory and the bottleneck stage.",
      AddBenchCommand);
  add("train",
      "Train a linear, DNN or CNN classifier on tf.Example records, with "
      "evaluation, checkpoints (resumed on rerun) and TensorBoard logs.",
      AddTrainCommand);
  add("summary",
      "Summarise a training run's TensorBoard scalars (loss, evaluation "
      "metrics, examples/s): a table, JSON, or curves as an SVG file.",
      AddSummaryCommand);
  add("demo",
      "Write a sample dataset, verify, reshard and index it; convert "
      "Fashion-MNIST, stream it, train a DNN or CNN on it and evaluate it, "
      "saying what happened.",
      AddDemoCommand);

  // No arguments: the list of commands, as --help.  An unknown command:
  // say so and name the closest (CLI11 alone says "A subcommand is
  // required").
  if (argc < 2) {
    fmt::print("{}", app.help());
    return kExitOk;
  }
  std::vector<std::string> names;
  for (const auto& [sub, run] : commands) names.push_back(sub->get_name());
  if (argv[1][0] != '-' &&
      std::find(names.begin(), names.end(), argv[1]) == names.end()) {
    fmt::print(stderr, "recflow: {}\n",
               UnknownNameMessage(
                   "command", argv[1], names,
                   fmt::format("the commands: {}", fmt::join(names, ", "))));
    return kExitUsage;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // An option the command does not have is named, with the closest it
    // has, before anything else CLI11 would say (a required option
    // missing because its name was mistyped).
    if (e.get_exit_code() != 0) {
      for (auto& [sub, run] : commands) {
        if (sub->parsed()) {
          if (auto msg = UnknownOption(*sub, argc, argv)) {
            fmt::print(stderr, "recflow {}: {}\n", sub->get_name(), *msg);
            return kExitUsage;
          }
        }
      }
    }
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }
  try {
    for (auto& [sub, run] : commands) {
      if (sub->parsed()) return run();
    }
  } catch (const std::exception& e) {
    // One line; no GPU, no driver or a build without CUDA is exit code 2.
    fmt::print(stderr, "recflow: {}\n", e.what());
    return ExitCodeFor(e);
  }
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  const int rc = Run(argc, argv);
  // What is still buffered: output lost to a full disk or a closed file
  // is an I/O error, not a success (as coreutils' close_stdout).  A
  // command that failed has said why already.
  errno = 0;
  if ((fflush(stdout) != 0 || ferror(stdout)) &&
      rc == recflow::tools::kExitOk) {
    const int e = errno;
    fmt::print(stderr, "recflow: standard output: cannot write: {}\n",
               e != 0 ? std::strerror(e) : "an earlier write failed");
    return recflow::tools::kExitUsage;
  }
  return rc;
}
