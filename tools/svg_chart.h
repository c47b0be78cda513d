// Line charts as standalone SVG files, for `recflow summary --svg` (a run's
// curves, where TensorBoard cannot be installed) and `recflow bench
// --threads ... --svg` (the scaling curve).  No fonts, scripts or links to
// fetch: the file opens in any browser.
#ifndef RECFLOW_TOOLS_SVG_CHART_H_
#define RECFLOW_TOOLS_SVG_CHART_H_

#include <string>
#include <utility>
#include <vector>

namespace recflow::tools {

// One curve: (x, y) points in x order.  Points whose x or y is not finite
// break the line there.
struct ChartSeries {
  std::string label;
  std::vector<std::pair<double, double>> points;
};

// One panel: axes, grid, a legend, and one <path class="series"> per
// series (with a circle per point when a series has few points, so that a
// single evaluation still shows).  `reference_line` adds a dashed line
// through the origin and the first series' first point, y = y0 * x / x0:
// the ideal of linear scaling.
struct ChartPanel {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<ChartSeries> series;
  bool reference_line = false;
};

// The panels in a grid (two columns when there are several) under
// `title`, as an SVG document.  Text is XML-escaped.
std::string RenderSvg(const std::string& title,
                      const std::vector<ChartPanel>& panels);

// RenderSvg written to `path`, atomically (records::WritableFile: missing
// folders are made).  Throws records::IoError.
void WriteSvg(const std::string& path, const std::string& title,
              const std::vector<ChartPanel>& panels);

}  // namespace recflow::tools

#endif  // RECFLOW_TOOLS_SVG_CHART_H_
