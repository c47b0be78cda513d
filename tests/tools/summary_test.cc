// `recflow summary` on event files EventWriter wrote as training does: the
// table, --json, and --svg (valid XML with one path per run and tag).  On
// what `recflow train` wrote: train_command_test.cc.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "recflow_runner.h"
#include "test_util.h"
#include "train/event_writer.h"

namespace recflow::tools {
namespace {

using testing::Recflow;
using testing::Result;
using testing::TempDir;

// A small run: loss at steps 1..300 (every 10), examples/sec, and two
// evaluations in eval/.
void WriteRun(const std::string& model_dir) {
  train::EventWriter train(model_dir);
  for (int step = 1; step <= 300; step += 10) {
    train.AddScalar("loss", 2.0 / step, step);
    if (step > 100) train.AddScalar("examples/sec", 1000 + step, step);
  }
  train::EventWriter eval(model_dir + "/eval");
  eval.AddScalar("accuracy", 0.5, 150);
  eval.AddScalar("accuracy", 0.875, 300);
  eval.AddScalar("loss", 0.25, 300);
}

TEST(SummaryCommandTest, TableAndJsonOfEveryTag) {
  TempDir dir;
  WriteRun(dir.File("model"));
  Result r = Recflow(dir, "summary " + dir.File("model"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("2 run(s), 4 scalar series"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("eval       accuracy"), std::string::npos) << r.out;

  r = Recflow(dir, "summary --json " + dir.File("model"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = r.Json();
  ASSERT_EQ(j["runs"].size(), 2u);
  EXPECT_EQ(j["runs"][0]["run"], ".");
  const auto& loss = j["runs"][0]["tags"]["loss"];
  EXPECT_EQ(loss["points"], 30);
  EXPECT_EQ(loss["first_step"], 1);
  EXPECT_EQ(loss["last_step"], 291);
  EXPECT_FLOAT_EQ(loss["max"].get<double>(), 2.0f);
  EXPECT_FLOAT_EQ(loss["last"].get<double>(), 2.0f / 291);
  const auto& acc = j["runs"][1]["tags"]["accuracy"];
  EXPECT_EQ(acc["points"], 2);
  EXPECT_EQ(acc["min"], 0.5);
  EXPECT_EQ(acc["last"], 0.875);
}

TEST(SummaryCommandTest, SvgParsesAndHasOnePathPerRunAndTag) {
  if (std::system("/usr/bin/python3 -c 'import xml.etree' 2>/dev/null") != 0) {
    GTEST_SKIP() << "needs /usr/bin/python3 (Debian python3) to parse the SVG";
  }
  TempDir dir;
  WriteRun(dir.File("model"));
  const std::string svg = dir.File("out/curves.svg");  // its folder is made
  const Result r =
      Recflow(dir, "summary --json --svg " + svg + " " + dir.File("model"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.Json()["svg"], svg);
  // Four series: train loss, train examples/sec, eval accuracy, eval loss.
  const std::string check = fmt::format(
      "/usr/bin/python3 -c \"import sys, xml.etree.ElementTree as E; "
      "ns='{{http://www.w3.org/2000/svg}}'; t=E.parse('{}').getroot(); "
      "p=[x.get('data-label') for x in t.iter(ns+'path') "
      "if x.get('class')=='series']; "
      "g=[x.find(ns+'title').text for x in t.iter(ns+'g')]; "
      "sys.exit(0 if sorted(p)==['eval','eval','train','train'] and "
      "g==['loss','accuracy','examples/sec'] else 1)\"",
      svg);
  EXPECT_EQ(std::system(check.c_str()), 0) << testing::ReadFileBytes(svg);
}

TEST(SummaryCommandTest, DirectoryWithoutEventsIsOneClearLine) {
  TempDir dir;
  std::filesystem::create_directory(dir.File("empty"));
  const Result r = Recflow(dir, "summary " + dir.File("empty"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("no TensorBoard event files"), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace recflow::tools
