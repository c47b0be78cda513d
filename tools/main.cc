// recflow: TFRecord files converted, read, verified, resharded, indexed,
// benchmarked and trained on.  See `recflow --help`.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <utility>
#include <vector>

#include "pipeline/io.h"
#include "tools/cli.h"

int main(int argc, char** argv) {
  using namespace recflow::tools;
  recflow::pipeline::TuneAllocatorForBatches();
  CLI::App app{
      "recflow: TFRecord files read, written, verified, resharded and "
      "indexed exactly as TensorFlow does.\n"
      "Exit codes: 0 success, 1 damaged data found, 2 usage or I/O error."};
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
  add("demo",
      "Write a sample dataset, verify, reshard and index it; convert "
      "Fashion-MNIST, stream it, train a DNN or CNN on it and evaluate it, "
      "saying what happened.",
      AddDemoCommand);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
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
