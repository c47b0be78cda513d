#include "records/input_stream.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "records/errors.h"
#include "test_util.h"

namespace recflow::records {
namespace {

// Lines of every length that matters to a 64 KiB buffer: empty ones, short
// ones, ones that end exactly at or cross a buffer's end, and ones longer
// than a buffer; some end in "\r".
std::vector<std::string> AwkwardLines() {
  std::mt19937 rng(7);
  std::vector<std::string> lines;
  const size_t lengths[] = {0,         1,     0,     200,       65535,
                            65536,     65537, 3,     (1 << 17), 0,
                            (1 << 18), 100,   65536, 17,        1};
  for (size_t n : lengths) {
    std::string line(n, '\0');
    for (char& c : line) c = static_cast<char>('a' + rng() % 26);
    lines.push_back(line);
  }
  for (int i = 0; i < 2000; ++i) {
    std::string line(rng() % 90, 'x');
    if (rng() % 5 == 0) line += '\r';
    lines.push_back(line);
  }
  return lines;
}

std::string Joined(const std::vector<std::string>& lines, bool last_newline) {
  std::string text;
  for (size_t i = 0; i < lines.size(); ++i) {
    text += lines[i];
    if (i + 1 < lines.size() || last_newline) text += '\n';
  }
  return text;
}

std::vector<std::string> AllLines(ByteReader& in) {
  std::vector<std::string> lines;
  std::string line = "left over";
  while (in.GetLine(&line)) lines.push_back(line);
  EXPECT_EQ(line, "");  // cleared at the end
  return lines;
}

TEST(ByteReaderTest, GetLineSplitsAtEveryNewlineWhateverTheCodec) {
  testing::TempDir dir;
  const std::vector<std::string> lines = AwkwardLines();
  for (const Compression c : testing::kAllCompressions) {
    for (const bool last_newline : {true, false}) {
      SCOPED_TRACE(std::string(CompressionName(c)) +
                   (last_newline ? ", last line ended" : ", last line open"));
      const std::string path = dir.File("lines");
      testing::WriteFileBytes(
          path, testing::Compressed(Joined(lines, last_newline), c));
      ByteReader in(path, c);
      const std::vector<std::string> got = AllLines(in);
      ASSERT_EQ(got.size(), lines.size());
      for (size_t i = 0; i < lines.size(); ++i) {
        ASSERT_EQ(got[i], lines[i]) << "line " << i;
      }
      EXPECT_EQ(in.Get(), -1);
    }
  }
}

// GetLine and Get read the same stream: mixed, neither skips or repeats.
TEST(ByteReaderTest, GetLineAndGetShareThePosition) {
  testing::TempDir dir;
  const std::string path = dir.File("mixed");
  testing::WriteFileBytes(path, "ab\ncd\n\nef");
  ByteReader in(path);
  EXPECT_EQ(in.Get(), 'a');
  std::string line;
  ASSERT_TRUE(in.GetLine(&line));
  EXPECT_EQ(line, "b");
  EXPECT_EQ(in.Get(), 'c');
  in.Unget();
  ASSERT_TRUE(in.GetLine(&line));
  EXPECT_EQ(line, "cd");
  ASSERT_TRUE(in.GetLine(&line));
  EXPECT_EQ(line, "");
  ASSERT_TRUE(in.GetLine(&line));
  EXPECT_EQ(line, "ef");
  EXPECT_FALSE(in.GetLine(&line));
  EXPECT_FALSE(in.GetLine(&line));
}

TEST(ByteReaderTest, AnEmptyFileHasNoLines) {
  testing::TempDir dir;
  const std::string path = dir.File("empty");
  testing::WriteFileBytes(path, "");
  ByteReader in(path);
  std::string line = "x";
  EXPECT_FALSE(in.GetLine(&line));
  EXPECT_EQ(line, "");
}

// AppendUntil gives the bytes Get() would, up to each stop byte (any of
// three, returned and consumed), over segments of every length that
// matters to a buffer, whatever the codec; Unget puts the stop byte back.
TEST(ByteReaderTest, AppendUntilStopsWhereGetWouldWhateverTheCodec) {
  testing::TempDir dir;
  std::mt19937 rng(5);
  std::string text;
  for (const std::string& segment : AwkwardLines()) {
    text += segment;  // 'a'-'z', 'x' and '\r'
    text += ",;\n"[rng() % 3];
  }
  text += "tail";  // no stop byte at the end
  for (const Compression c : testing::kAllCompressions) {
    SCOPED_TRACE(CompressionName(c));
    const std::string path = dir.File("segments");
    testing::WriteFileBytes(path, testing::Compressed(text, c));
    ByteReader in(path, c);
    std::string got;
    size_t at = 0;
    while (true) {
      const size_t stop = text.find_first_of(",;\n", at);
      std::string segment = "kept:";
      const int byte = in.AppendUntil(&segment, ',', ';', '\n');
      if (stop == std::string::npos) {
        ASSERT_EQ(byte, -1);
        ASSERT_EQ(segment, "kept:" + text.substr(at));
        break;
      }
      ASSERT_EQ(segment, "kept:" + text.substr(at, stop - at)) << at;
      ASSERT_EQ(byte, text[stop]) << stop;
      if (rng() % 4 == 0) {  // put back, and read again by Get
        in.Unget();
        ASSERT_EQ(in.Get(), text[stop]);
      }
      at = stop + 1;
    }
    EXPECT_EQ(in.Get(), -1);
    std::string none;
    EXPECT_EQ(in.AppendUntil(&none, ',', ';', '\n'), -1);
    EXPECT_EQ(none, "");
  }
}

// A line longer than GetLine's max_size is read to max_size + 1 bytes, the
// rest left for the next read: whatever the cap's place relative to the
// buffer, the line ends and the codec.
// FindFirstOf (16 bytes at a time, then one by one) finds what a plain
// search finds: the first of three bytes at every place in a block and
// its tail, none, and bytes past 0x7f (signed chars) alike.
TEST(FindFirstOfTest, FindsTheFirstOfThreeBytesWhereverItIs) {
  std::mt19937 gen(7);
  const char stops[3] = {',', '"', '\xe9'};
  for (size_t size = 0; size <= 70; ++size) {
    for (int round = 0; round < 40; ++round) {
      std::string text(size, 'a');
      for (char& ch : text) {
        ch = static_cast<char>(gen() % 256);
        // Few stops, so that most are found after a run of other bytes.
        if ((ch == ',' || ch == '"' || ch == '\xe9') && gen() % 8 != 0) {
          ch = 'x';
        }
      }
      const char* begin = text.data();
      const char* end = begin + text.size();
      const char* want = std::find_first_of(begin, end, stops, stops + 3);
      ASSERT_EQ(FindFirstOf(begin, end, ',', '"', '\xe9') - begin, want - begin)
          << "size " << size << ", round " << round;
    }
    // One stop at each place, the rest other bytes.
    for (size_t at = 0; at < size; ++at) {
      std::string text(size, 'q');
      text[at] = stops[at % 3];
      ASSERT_EQ(FindFirstOf(text.data(), text.data() + size, ',', '"', '\xe9') -
                    text.data(),
                static_cast<std::ptrdiff_t>(at))
          << "size " << size << ", at " << at;
    }
  }
}

TEST(ByteReaderTest, GetLineReadsALongLineOnlyPastItsMaxSize) {
  testing::TempDir dir;
  const std::vector<std::string> lines = AwkwardLines();
  const std::string path = dir.File("lines");
  for (const Compression c : testing::kAllCompressions) {
    testing::WriteFileBytes(path, testing::Compressed(Joined(lines, false), c));
    for (const size_t max : {size_t{0}, size_t{1}, size_t{89}, size_t{65535},
                             size_t{65536}, size_t{200000}}) {
      SCOPED_TRACE(std::string(CompressionName(c)) + ", max " +
                   std::to_string(max));
      ByteReader in(path, c);
      std::string line, rest;
      for (size_t i = 0; i < lines.size(); ++i) {
        ASSERT_TRUE(in.GetLine(&line, max)) << "line " << i;
        if (lines[i].size() <= max) {
          ASSERT_EQ(line, lines[i]) << "line " << i;
          continue;
        }
        ASSERT_EQ(line, lines[i].substr(0, max + 1)) << "line " << i;
        ASSERT_TRUE(in.GetLine(&rest)) << "line " << i;
        ASSERT_EQ(rest, lines[i].substr(max + 1)) << "line " << i;
      }
      EXPECT_FALSE(in.GetLine(&line, max));
    }
  }
  // A limit past any string's (an unsigned -1 from a caller): none.
  const std::string path2 = dir.File("two");
  testing::WriteFileBytes(path2, "ab\ncd");
  ByteReader in(path2);
  std::string line;
  ASSERT_TRUE(in.GetLine(&line, std::string::npos));
  EXPECT_EQ(line, "ab");
  EXPECT_EQ(in.AppendUntil(&line, 'x', 'y', 'z', std::string::npos), -1);
  EXPECT_EQ(line, "abcd");
}

// AppendUntil stops at kFull once its string would pass max_size (holding
// max_size + 1 bytes), the rest left unread; a segment that fits exactly
// ends at its stop byte.
TEST(ByteReaderTest, AppendUntilStopsFullPastItsMaxSize) {
  testing::TempDir dir;
  std::mt19937 rng(11);
  std::vector<std::string> segments = AwkwardLines();
  std::string text;
  std::string stops;
  for (const std::string& segment : segments) {
    text += segment;
    stops += ",;\n"[rng() % 3];
    text += stops.back();
  }
  const std::string path = dir.File("segments");
  for (const Compression c : testing::kAllCompressions) {
    testing::WriteFileBytes(path, testing::Compressed(text, c));
    for (const size_t max :
         {size_t{0}, size_t{3}, size_t{65536}, size_t{100000}}) {
      SCOPED_TRACE(std::string(CompressionName(c)) + ", max " +
                   std::to_string(max));
      ByteReader in(path, c);
      for (size_t i = 0; i < segments.size(); ++i) {
        std::string got = "kept:";
        const int byte = in.AppendUntil(&got, ',', ';', '\n', 5 + max);
        if (segments[i].size() <= max) {
          ASSERT_EQ(got, "kept:" + segments[i]) << i;
          ASSERT_EQ(byte, stops[i]) << i;
          continue;
        }
        ASSERT_EQ(byte, ByteReader::kFull) << i;
        ASSERT_EQ(got, "kept:" + segments[i].substr(0, max + 1)) << i;
        std::string rest;
        ASSERT_EQ(in.AppendUntil(&rest, ',', ';', '\n'), stops[i]) << i;
        ASSERT_EQ(rest, segments[i].substr(max + 1)) << i;
      }
      EXPECT_EQ(in.Get(), -1);
    }
  }
}

// A stream damaged part-way gives every whole line before the damage, then
// an error naming the file; never a shortened last line as if it ended.
TEST(ByteReaderTest, GetLineGivesTheLinesBeforeDamageThenThrows) {
  testing::TempDir dir;
  std::vector<std::string> lines;
  std::mt19937 rng(3);
  for (int i = 0; i < 40000; ++i) {
    std::string line(rng() % 60, '\0');
    for (char& c : line) c = static_cast<char>('a' + rng() % 26);
    lines.push_back(line);
  }
  std::string gz = testing::Compressed(Joined(lines, true), Compression::kGzip);
  gz.resize(gz.size() * 2 / 3);
  const std::string path = dir.File("cut.gz");
  testing::WriteFileBytes(path, gz);
  ByteReader in(path);
  std::vector<std::string> got;
  std::string line;
  try {
    while (in.GetLine(&line)) got.push_back(line);
    FAIL() << "a cut gzip stream read to its end";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  ASSERT_GT(got.size(), 1000u);
  ASSERT_LT(got.size(), lines.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], lines[i]);
}

}  // namespace
}  // namespace recflow::records
