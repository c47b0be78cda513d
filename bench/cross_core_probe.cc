// What it costs a core to write memory that another core wrote last: the
// hand-over every pipeline makes when a record read on one core is parsed
// on another, or a buffer freed on one core is reused on another.  On a
// VM it changes with where the host puts the virtual CPUs: on this
// project's 2-vCPU VM 0.60-0.63 ns a 64-byte line in some stretches and
// 1.50-1.70 ns in others (0.4 on one core), and with it the MNIST
// fixture's shuffled pipeline at two threads went from 1.42-1.46x one
// thread's rate to 0.87-1.09x (while two separate one-thread runs, which
// share nothing, still made 1.7x; docs/PERFORMANCE.md, "fourteenth
// session").  bench/pipeline_scaling.sh
// prints it with each round, so that a figure says which stretch it came
// from.
//
//   cross_core_probe [KIB] [ROUNDS]
//
// Two threads pinned to the first CPU this process may run on and to
// each other one in turn take turns writing a buffer of KIB KiB (default
// 256) ROUNDS times each (default 2000); the time of the writes alone
// (not of the hand-over's wait) over the lines written.  The baseline is
// one thread writing the buffer again on its own core.  Prints one JSON
// object: same_core_ns (a line), cross_core_ns (the median over the
// other CPUs) and cross_core_min_ns / cross_core_max_ns, cpus.
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

bool Pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// ns a line: one thread on `cpu` writing `buf` `rounds` times.
double SameCore(std::vector<char>& buf, int rounds, int cpu) {
  double seconds = 0;
  std::thread t([&] {
    Pin(cpu);
    std::memset(buf.data(), 1, buf.size());  // the lines in this core
    for (int r = 0; r < rounds; ++r) {
      const Clock::time_point start = Clock::now();
      std::memset(buf.data(), r & 0xff, buf.size());
      seconds += Seconds(start);
    }
  });
  t.join();
  return seconds / (static_cast<double>(buf.size()) / 64 * rounds) * 1e9;
}

// ns a line: threads on `a` and `b` taking turns, each writing `buf`
// after the other did.
double CrossCore(std::vector<char>& buf, int rounds, int a, int b) {
  std::atomic<int> turn{0};
  double seconds[2] = {0, 0};
  const auto side = [&](int me, int cpu) {
    Pin(cpu);
    for (int r = 0; r < rounds; ++r) {
      while (turn.load(std::memory_order_acquire) % 2 != me) {
      }
      const Clock::time_point start = Clock::now();
      std::memset(buf.data(), (r + me) & 0xff, buf.size());
      seconds[me] += Seconds(start);
      turn.fetch_add(1, std::memory_order_release);
    }
  };
  std::thread ta(side, 0, a), tb(side, 1, b);
  ta.join();
  tb.join();
  return (seconds[0] + seconds[1]) /
         (static_cast<double>(buf.size()) / 64 * 2 * rounds) * 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const long kib = argc > 1 ? std::atol(argv[1]) : 256;
  const long rounds = argc > 2 ? std::atol(argv[2]) : 2000;
  if (kib <= 0 || rounds <= 0) {
    std::fprintf(stderr, "usage: cross_core_probe [KIB] [ROUNDS]\n");
    return 2;
  }
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
    std::perror("sched_getaffinity");
    return 1;
  }
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  }
  std::vector<char> buf(static_cast<size_t>(kib) << 10);
  const double same = SameCore(buf, static_cast<int>(rounds), cpus[0]);
  std::vector<double> cross;
  for (size_t i = 1; i < cpus.size(); ++i) {
    cross.push_back(CrossCore(buf, static_cast<int>(rounds), cpus[0], cpus[i]));
  }
  if (cross.empty()) {
    std::printf("{\"same_core_ns\": %.3f, \"cpus\": 1}\n", same);
    return 0;
  }
  std::vector<double> sorted = cross;
  std::sort(sorted.begin(), sorted.end());
  std::printf(
      "{\"same_core_ns\": %.3f, \"cross_core_ns\": %.3f, "
      "\"cross_core_min_ns\": %.3f, \"cross_core_max_ns\": %.3f, "
      "\"cpus\": %zu}\n",
      same, sorted[sorted.size() / 2], sorted.front(), sorted.back(),
      cpus.size());
  return 0;
}
