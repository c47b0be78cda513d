#include "tools/svg_chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "records/file.h"

namespace recflow::tools {
namespace {

constexpr double kPanelWidth = 460, kPanelHeight = 300;
constexpr double kLeft = 70, kRight = 16, kTop = 34, kBottom = 48;
constexpr double kTitleHeight = 36;
// Distinguishable colours (Tableau 10).
constexpr const char* kColours[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2",
                                    "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
                                    "#9c755f", "#bab0ac"};
// Series with at most this many points get a circle on each.
constexpr size_t kMarkedPoints = 30;

std::string Escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // Control characters are not allowed in XML 1.0.
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t' || c == '\n') {
          out += c;
        }
    }
  }
  return out;
}

// A tick label: short, with no trailing zeros.
std::string Tick(double v) {
  if (v == 0) return "0";
  const double a = std::abs(v);
  if (a >= 1e6 || a < 1e-3) return fmt::format("{:.3g}", v);
  return fmt::format("{:.6g}", std::round(v * 1e6) / 1e6);
}

struct Range {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  void Add(double v) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  bool empty() const { return lo > hi; }
  // Widens an empty or single-valued range so that it can be drawn.
  void Pad() {
    if (empty()) {
      lo = 0;
      hi = 1;
    } else if (lo == hi) {
      const double d = lo == 0 ? 1 : std::abs(lo) * 0.05;
      lo -= d;
      hi += d;
    }
  }
};

// About five ticks at 1, 2 or 5 times a power of ten.
std::vector<double> NiceTicks(Range& r) {
  const double raw = (r.hi - r.lo) / 5;
  const double magnitude = std::pow(10, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * magnitude;
    if (step >= raw) break;
  }
  r.lo = std::floor(r.lo / step) * step;
  r.hi = std::ceil(r.hi / step) * step;
  std::vector<double> ticks;
  for (double t = r.lo; t <= r.hi + step / 2; t += step) {
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  }
  return ticks;
}

void RenderPanel(const ChartPanel& panel, double ox, double oy,
                 std::string& svg) {
  Range xr, yr;
  for (const auto& s : panel.series) {
    for (const auto& [x, y] : s.points) {
      if (std::isfinite(x) && std::isfinite(y)) {
        xr.Add(x);
        yr.Add(y);
      }
    }
  }
  double x0 = 0, y0 = 0;
  const bool reference = panel.reference_line && !panel.series.empty() &&
                         !panel.series[0].points.empty() &&
                         panel.series[0].points[0].first > 0;
  if (reference) {
    std::tie(x0, y0) = panel.series[0].points[0];
    yr.Add(y0 * xr.hi / x0);
    yr.Add(0);
  }
  xr.Pad();
  yr.Pad();
  const std::vector<double> xticks = NiceTicks(xr), yticks = NiceTicks(yr);
  const double w = kPanelWidth - kLeft - kRight;
  const double h = kPanelHeight - kTop - kBottom;
  auto px = [&](double x) {
    return ox + kLeft + (x - xr.lo) / (xr.hi - xr.lo) * w;
  };
  auto py = [&](double y) {
    return oy + kTop + h - (y - yr.lo) / (yr.hi - yr.lo) * h;
  };

  svg += fmt::format("<g class=\"panel\">\n<title>{}</title>\n",
                     Escape(panel.title));
  svg += fmt::format(
      "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"14\" "
      "font-weight=\"bold\">{}</text>\n",
      ox + kLeft, oy + 20, Escape(panel.title));
  svg += fmt::format(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" "
      "fill=\"none\" stroke=\"#888\"/>\n",
      ox + kLeft, oy + kTop, w, h);
  for (double t : xticks) {
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" "
        "stroke=\"#eee\"/><text x=\"{0:.1f}\" y=\"{3:.1f}\" font-size=\"11\" "
        "text-anchor=\"middle\">{4}</text>\n",
        px(t), oy + kTop, oy + kTop + h, oy + kTop + h + 14, Tick(t));
  }
  for (double t : yticks) {
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" "
        "stroke=\"#eee\"/><text x=\"{3:.1f}\" y=\"{4:.1f}\" font-size=\"11\" "
        "text-anchor=\"end\">{5}</text>\n",
        ox + kLeft, py(t), ox + kLeft + w, ox + kLeft - 4, py(t) + 4, Tick(t));
  }
  svg += fmt::format(
      "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\" "
      "text-anchor=\"middle\">{}</text>\n",
      ox + kLeft + w / 2, oy + kPanelHeight - 10, Escape(panel.x_label));
  svg += fmt::format(
      "<text x=\"{0:.1f}\" y=\"{1:.1f}\" font-size=\"12\" "
      "text-anchor=\"middle\" transform=\"rotate(-90 {0:.1f} {1:.1f})\">{2}"
      "</text>\n",
      ox + 14, oy + kTop + h / 2, Escape(panel.y_label));
  if (reference) {
    svg += fmt::format(
        "<line class=\"reference\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" "
        "y2=\"{:.1f}\" stroke=\"#999\" stroke-dasharray=\"5,4\"/>\n",
        px(xr.lo), py(y0 * xr.lo / x0), px(xr.hi), py(y0 * xr.hi / x0));
  }
  for (size_t i = 0; i < panel.series.size(); ++i) {
    const ChartSeries& s = panel.series[i];
    const char* colour = kColours[i % std::size(kColours)];
    std::string d;
    bool pen_down = false;
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) {
        pen_down = false;
        continue;
      }
      d +=
          fmt::format("{}{:.1f} {:.1f}",
                      pen_down ? " L" : (d.empty() ? "M" : " M"), px(x), py(y));
      pen_down = true;
    }
    svg += fmt::format(
        "<path class=\"series\" data-label=\"{}\" d=\"{}\" fill=\"none\" "
        "stroke=\"{}\" stroke-width=\"1.5\"/>\n",
        Escape(s.label), d.empty() ? "M0 0" : d, colour);
    if (s.points.size() <= kMarkedPoints) {
      for (const auto& [x, y] : s.points) {
        if (!std::isfinite(x) || !std::isfinite(y)) continue;
        svg += fmt::format(
            "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.5\" fill=\"{}\"/>\n",
            px(x), py(y), colour);
      }
    }
    // The legend, top right inside the plot.
    const double ly = oy + kTop + 14 + 15 * static_cast<double>(i);
    const double lx = ox + kLeft + w - 8;
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" "
        "stroke=\"{}\" stroke-width=\"2\"/><text x=\"{:.1f}\" y=\"{:.1f}\" "
        "font-size=\"11\" text-anchor=\"end\">{}</text>\n",
        lx - 14, ly - 4, lx, ly - 4, colour, lx - 18, ly, Escape(s.label));
  }
  svg += "</g>\n";
}

}  // namespace

std::string RenderSvg(const std::string& title,
                      const std::vector<ChartPanel>& panels) {
  const size_t columns = panels.size() > 1 ? 2 : 1;
  const size_t rows =
      std::max<size_t>(1, (panels.size() + columns - 1) / columns);
  const double width = kPanelWidth * static_cast<double>(columns);
  const double height = kTitleHeight + kPanelHeight * static_cast<double>(rows);
  std::string svg = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0:.0f}\" "
      "height=\"{1:.0f}\" viewBox=\"0 0 {0:.0f} {1:.0f}\" "
      "font-family=\"sans-serif\">\n"
      "<title>{2}</title>\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"12\" y=\"24\" font-size=\"16\">{2}</text>\n",
      width, height, Escape(title));
  for (size_t i = 0; i < panels.size(); ++i) {
    RenderPanel(panels[i], kPanelWidth * static_cast<double>(i % columns),
                kTitleHeight + kPanelHeight * static_cast<double>(i / columns),
                svg);
  }
  svg += "</svg>\n";
  return svg;
}

void WriteSvg(const std::string& path, const std::string& title,
              const std::vector<ChartPanel>& panels) {
  records::WritableFile file(path, /*atomic=*/true);
  file.Append(RenderSvg(title, panels));
  file.Close();
}

}  // namespace recflow::tools
