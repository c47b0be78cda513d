// What reading a clock and waking a sleeping thread cost this machine: the
// two things a training thread may pay on every batch it takes from a
// Prefetch (IteratorOptions::prefetch_polls times the takes with
// steady_clock; a take that wakes the driver makes a system call).  On a
// VM they depend on the clock source the kernel chose and on how the host
// delivers a wake-up to an idle virtual CPU.  On 2026-11-28 an H200
// machine (KVM, clock source tsc) read steady_clock in 45-51 ns and woke
// a thread in 2.5 us; this project's 2-vCPU VM 21 ns and 5.3 us
// (docs/PERFORMANCE.md, "twentieth session").
//
//   clock_probe [READS]
//
// Times READS (default 200000) reads of each clock back to back, three
// times (the median kept), and 2000 notify_all calls each of which wakes
// a thread asleep on the condition variable (a timed wait, as the
// prefetch driver's) 50 us after it went to sleep: the notifying
// thread's time in the call.  Prints one JSON object: clock_source (the
// kernel's, where /sys says), steady_clock_ns, rdtsc_ns (x86 only, else
// absent), monotonic_coarse_ns, monotonic_raw_ns, wake_ns.
#include <time.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double NsSince(Clock::time_point start, int64_t n) {
  return std::chrono::duration<double, std::nano>(Clock::now() - start)
             .count() /
         static_cast<double>(n);
}

// The median of three timings of `n` calls of `read` (each returning a
// value summed into *sink, so that none is optimized away).
template <typename Read>
double NsPerRead(int64_t n, uint64_t* sink, Read read) {
  std::vector<double> rounds;
  for (int round = 0; round < 3; ++round) {
    const Clock::time_point start = Clock::now();
    uint64_t sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += read();
    *sink += sum;
    rounds.push_back(NsSince(start, n));
  }
  std::sort(rounds.begin(), rounds.end());
  return rounds[1];
}

uint64_t ClockNs(clockid_t id) {
  timespec ts;
  clock_gettime(id, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u +
         static_cast<uint64_t>(ts.tv_nsec);
}

// The notifying thread's time in notify_all when it wakes a thread in a
// timed wait, averaged over `wakes`.
double WakeNs(int wakes) {
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<int> asleep{0};
  std::atomic<int> woke{0};
  bool flag = false;
  std::thread sleeper([&] {
    for (int i = 1; i <= wakes; ++i) {
      std::unique_lock<std::mutex> lock(mu);
      asleep.store(i);
      cv.wait_for(lock, std::chrono::seconds(1), [&] { return flag; });
      flag = false;
      woke.store(i);
    }
  });
  double total = 0;
  for (int i = 1; i <= wakes; ++i) {
    while (asleep.load() != i) {
    }
    // Its lock is released once it sleeps; and so long after, its core is
    // idle, as a prefetch driver's between takes.
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    {
      std::lock_guard<std::mutex> lock(mu);
      flag = true;
    }
    const Clock::time_point start = Clock::now();
    cv.notify_all();
    total += NsSince(start, 1);
    while (woke.load() != i) {
    }
  }
  sleeper.join();
  return total / wakes;
}

std::string ClockSource() {
  std::ifstream in(
      "/sys/devices/system/clocksource/clocksource0/current_clocksource");
  std::string source;
  if (!(in >> source)) return "unknown";
  return source;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t reads = argc > 1 ? std::atoll(argv[1]) : 200000;
  if (reads <= 0) {
    std::fprintf(stderr, "usage: clock_probe [READS > 0]\n");
    return 2;
  }
  uint64_t sink = 0;
  const double steady = NsPerRead(reads, &sink, [] {
    return static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  });
  const double coarse =
      NsPerRead(reads, &sink, [] { return ClockNs(CLOCK_MONOTONIC_COARSE); });
  const double raw =
      NsPerRead(reads, &sink, [] { return ClockNs(CLOCK_MONOTONIC_RAW); });
  char rdtsc[48] = "";
#if defined(__x86_64__)
  std::snprintf(rdtsc, sizeof(rdtsc), ", \"rdtsc_ns\": %.1f",
                NsPerRead(reads, &sink, [] { return __rdtsc(); }));
#endif
  const double wake = WakeNs(2000);
  std::printf(
      "{\"clock_source\": \"%s\", \"steady_clock_ns\": %.1f%s, "
      "\"monotonic_coarse_ns\": %.1f, \"monotonic_raw_ns\": %.1f, "
      "\"wake_ns\": %.0f, \"checksum\": %u}\n",
      ClockSource().c_str(), steady, rdtsc, coarse, raw, wake,
      static_cast<unsigned>(sink & 1));
  return 0;
}
