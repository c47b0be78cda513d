// recflow summary: what a training run wrote for TensorBoard, without
// TensorBoard — a table of every scalar tag of the run and its evaluation
// runs, as JSON, or drawn as curves in a standalone SVG file.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tools/cli.h"
#include "tools/svg_chart.h"
#include "train/event_reader.h"

namespace recflow::tools {
namespace {

struct SummaryOptions {
  std::string model_dir;
  std::string svg;
  bool json = false;
};

struct TagStats {
  size_t points = 0;
  int64_t first_step = 0, last_step = 0;
  double last = 0, min = 0, max = 0;
};

TagStats Stats(const std::vector<train::ScalarPoint>& points) {
  TagStats s;
  s.points = points.size();
  if (points.empty()) return s;
  s.first_step = points.front().step;
  s.last_step = points.back().step;
  s.last = points.back().value;
  s.min = s.max = points.front().value;
  for (const auto& p : points) {
    s.min = std::min(s.min, p.value);
    s.max = std::max(s.max, p.value);
  }
  return s;
}

// JSON has no NaN or infinity: those become null.
nlohmann::json Number(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

// The curves: one panel per tag (the loss first), one line per run that
// has it.
std::vector<ChartPanel> Panels(const std::vector<train::EventRun>& runs) {
  std::vector<std::string> tags;
  for (const auto& run : runs) {
    for (const auto& [tag, points] : run.scalars) {
      if (std::find(tags.begin(), tags.end(), tag) == tags.end()) {
        tags.push_back(tag);
      }
    }
  }
  std::stable_sort(tags.begin(), tags.end(),
                   [](const std::string& a, const std::string& b) {
                     return (a == "loss") > (b == "loss") ||
                            ((a == "loss") == (b == "loss") && a < b);
                   });
  std::vector<ChartPanel> panels;
  for (const auto& tag : tags) {
    ChartPanel panel{tag, "step", tag, {}, false};
    for (const auto& run : runs) {
      const auto it = run.scalars.find(tag);
      if (it == run.scalars.end()) continue;
      ChartSeries series{run.name == "." ? "train" : run.name, {}};
      for (const auto& p : it->second) {
        series.points.emplace_back(static_cast<double>(p.step), p.value);
      }
      panel.series.push_back(std::move(series));
    }
    panels.push_back(std::move(panel));
  }
  return panels;
}

int RunSummary(const SummaryOptions& o) {
  const std::vector<train::EventRun> runs = train::ReadEventRuns(o.model_dir);
  nlohmann::json out = {{"model_dir", o.model_dir}};
  nlohmann::json json_runs = nlohmann::json::array();
  // Per run, its tags' statistics, in tag order: for the JSON and the table.
  std::vector<std::vector<std::pair<std::string, TagStats>>> stats;
  size_t series = 0;
  for (const auto& run : runs) {
    nlohmann::json tags = nlohmann::json::object();
    auto& run_stats = stats.emplace_back();
    for (const auto& [tag, points] : run.scalars) {
      const TagStats& s = run_stats.emplace_back(tag, Stats(points)).second;
      tags[tag] = {{"points", s.points},       {"first_step", s.first_step},
                   {"last_step", s.last_step}, {"last", Number(s.last)},
                   {"min", Number(s.min)},     {"max", Number(s.max)}};
      ++series;
    }
    json_runs.push_back({{"run", run.name},
                         {"dir", run.dir},
                         {"files", run.files.size()},
                         {"events", run.events},
                         {"truncated_files", run.truncated_files},
                         {"tags", tags}});
  }
  out["runs"] = json_runs;
  if (!o.svg.empty()) {
    WriteSvg(o.svg, fmt::format("recflow summary {}", o.model_dir),
             Panels(runs));
    out["svg"] = o.svg;
  }
  if (o.json) {
    fmt::print("{}\n", out.dump());
    return kExitOk;
  }
  fmt::print("{}: {} run(s), {} scalar series\n", o.model_dir, runs.size(),
             series);
  fmt::print("{:<10} {:<28} {:>7} {:>17} {:>12} {:>12} {:>12}\n", "run", "tag",
             "points", "steps", "last", "min", "max");
  for (size_t r = 0; r < runs.size(); ++r) {
    const train::EventRun& run = runs[r];
    for (const auto& [tag, s] : stats[r]) {
      fmt::print("{:<10} {:<28} {:>7} {:>17} {:>12.6g} {:>12.6g} {:>12.6g}\n",
                 run.name, tag, s.points,
                 fmt::format("{}..{}", s.first_step, s.last_step), s.last,
                 s.min, s.max);
    }
    for (const auto& f : run.truncated_files) {
      fmt::print(
          "{:<10} (the last record of {} is cut short: still being "
          "written, or the writer was killed; read up to it)\n",
          run.name, f);
    }
  }
  if (!o.svg.empty()) fmt::print("curves: {}\n", o.svg);
  return kExitOk;
}

}  // namespace

Runner AddSummaryCommand(CLI::App& app) {
  auto o = std::make_shared<SummaryOptions>();
  app.add_option("MODEL_DIR", o->model_dir,
                 "a model directory (or any TensorBoard log directory): its "
                 "event files and those of its subfolders (eval/) are read")
      ->required();
  app.add_option("--svg", o->svg,
                 "also draw every tag's curve over steps (one line per run) "
                 "into this standalone SVG file");
  app.add_flag("--json", o->json, "print one JSON object as the last line");
  app.footer(
      "Each folder holding events.out.tfevents.* files is a run, named as "
      "TensorBoard names it (\".\" for MODEL_DIR itself). A step written "
      "twice (training resumed from an earlier checkpoint) counts once, "
      "with the value written last. Reads TF1 and TF2 scalar summaries.");
  return [o] { return RunSummary(*o); };
}

}  // namespace recflow::tools
