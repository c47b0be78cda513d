// convert/json_events.h against nlohmann::json::sax_parse, the parser it
// stands in for on JSON Lines' hot path: for every input both must agree
// on whether it is JSON and, when it is, on every event and value (a text
// with a NUL byte is no JSON to the reader, whatever nlohmann makes of it).  A
// disagreement aborts, naming both readings.  The input's first byte is
// the mode byte every seed starts with (make_seeds); it is not read.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz_util.h"
#include "json_event_log.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace recflow;
  fuzz::Input in(data, size);
  in.Byte();
  const std::string_view text = in.Rest();
  const testing::JsonEventLog ours = testing::OurJsonEvents(text);
  const testing::JsonEventLog theirs = testing::ExpectedJsonEvents(text);
  if (ours != theirs) {
    std::fprintf(stderr,
                 "json_events: ours %s (%zu events), nlohmann %s (%zu)\n",
                 ours.json ? "JSON" : "no JSON", ours.events.size(),
                 theirs.json ? "JSON" : "no JSON", theirs.events.size());
    for (size_t i = 0; i < ours.events.size() || i < theirs.events.size();
         ++i) {
      std::fprintf(stderr, "  %s | %s\n",
                   i < ours.events.size() ? ours.events[i].c_str() : "-",
                   i < theirs.events.size() ? theirs.events[i].c_str() : "-");
    }
    std::abort();
  }
  return 0;
}
