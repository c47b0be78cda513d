// recflow's Python extension module, `recflow._recflow`: the pipeline,
// records, Examples and conversion over the C++ library.  The package
// recflow/ (python/recflow/) re-exports it and adds what is easier to
// write in Python (recflow.Array, recflow.Ragged, recflow.torch).
//
// Threads and the GIL: C++ work (iteration, reading, writing, converting,
// counting) runs with the GIL released.  Python functions given to map,
// filter, interleave and from_generator run on the pipeline's threads and
// take the GIL for each call, so they run one at a time; the built-in
// maps (recflow.maps) need no GIL.
//
// Errors: records::RecordError -> recflow.RecordError (a ValueError with
// path, offset, record_index and kind); records::IoError -> OSError (with
// errno); a name that matches no file -> FileNotFoundError; every other
// recflow error (bad Examples, bad specs, bad conversions, pipeline
// misuse) -> ValueError; wrong argument types -> TypeError.  Messages are
// those the CLI prints.
#include <fmt/format.h>
#include <google/protobuf/util/message_differencer.h>
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "convert/convert.h"
#include "pipeline/data_source.h"
#include "pipeline/dataset.h"
#include "pipeline/maps.h"
#include "python/arrays.h"
#include "records/dtype.h"
#include "records/example.pb.h"
#include "records/example_builder.h"
#include "records/file_list.h"
#include "records/index.h"
#include "records/parallel_scan.h"
#include "records/tfrecord_reader.h"
#include "records/tfrecord_writer.h"

namespace recflow::python {
namespace {

using namespace pybind11::literals;
using pipeline::Dataset;
using pipeline::Element;

// --- Arguments -----------------------------------------------------------

// A path, or a list of paths (str or os.PathLike).
std::vector<std::string> Paths(py::handle value, const char* what) {
  py::module_ os = py::module_::import("os");
  // bytes too: a file name as list_files gives it.
  auto is_path = [](py::handle v) {
    return PyUnicode_Check(v.ptr()) || PyBytes_Check(v.ptr()) ||
           py::hasattr(v, "__fspath__");
  };
  auto one = [&](py::handle v) {
    if (!is_path(v)) {
      throw py::type_error(
          fmt::format("{}: expected a path (str, bytes or os.PathLike), not {}",
                      what, TypeName(v)));
    }
    return os.attr("fsdecode")(v).cast<std::string>();
  };
  if (is_path(value)) {
    return {one(value)};
  }
  if (!py::isinstance<py::iterable>(value)) {
    throw py::type_error(
        fmt::format("{}: expected a path or a list of paths, not {}", what,
                    TypeName(value)));
  }
  std::vector<std::string> paths;
  for (py::handle v : value) paths.push_back(one(v));
  return paths;
}

std::optional<records::Compression> CompressionArg(
    const std::optional<std::string>& name) {
  if (!name) return std::nullopt;
  auto c = records::ParseCompression(*name);
  if (!c) {
    throw py::value_error(fmt::format(
        "unknown compression '{}': expected none, zlib, gzip or zstd", *name));
  }
  return c;
}

// from_text_lines' and from_fixed_length_records' shared arguments.
pipeline::PlainFileOptions PlainFileArgs(
    const std::optional<std::string>& compression, int num_parallel_reads,
    size_t buffer_size) {
  pipeline::PlainFileOptions o;
  o.compression = CompressionArg(compression);
  o.num_parallel_reads = num_parallel_reads;
  o.buffer_bytes = buffer_size;
  return o;
}

// A dtype given as a name ("float32") or anything numpy.dtype() takes.
pipeline::DType DTypeArg(py::handle value) {
  std::string name =
      PyUnicode_Check(value.ptr())
          ? value.cast<std::string>()
          : py::str(py::module_::import("numpy").attr("dtype")(value))
                .cast<std::string>();
  if (const auto d = records::ParseDType(name)) return *d;
  throw py::value_error(fmt::format(
      "unknown dtype '{}': expected float32, float64, int32, int64, uint8 "
      "or bytes",
      name));
}

// A FeatureSpec from a FeatureSpec, a dict (the JSON form, with or without
// the outer {"features": ...}), JSON text, or the path of a JSON file.
records::FeatureSpec SpecArg(py::handle value);

// --- Python functions inside the pipeline ---------------------------------

// The Python callable kept by `holder` (KeepAlive), called with the GIL.
py::handle Callable(const std::shared_ptr<const void>& holder) {
  return py::handle(static_cast<PyObject*>(const_cast<void*>(holder.get())));
}

pipeline::MapFn PythonMap(py::function fn, std::string name) {
  return
      [holder = KeepAlive(std::move(fn)), name = std::move(name)](Element e) {
        PythonCall python;
        py::object out = Callable(holder)(ElementToDict(e));
        Element result = DictToElement(out, "the result of " + name,
                                       Arrays::kCopyUnlessImmutable);
        result.origin = e.origin;
        result.batch_origins = e.batch_origins;
        return result;
      };
}

// What a Python function returned, as an int64: an int (not a bool, which
// would be a mistake taken for 0 or 1) or anything with __index__ (a numpy
// integer); else a TypeError naming `fn`.
int64_t IntResult(const py::object& n, const char* fn) {
  if (PyBool_Check(n.ptr()) || !PyIndex_Check(n.ptr())) {
    throw py::type_error(std::string(fn) + " must return an int, not " +
                         TypeName(n));
  }
  return n.cast<int64_t>();
}

// A key_func argument (group_by_window, rejection_resample's class_func):
// a function of the element dict returning an int, or the name of an
// integer scalar entry (Dataset::ComponentKey); `name` is set to what
// stands for it in descriptions and errors.
Dataset::KeyFn KeyArg(const py::object& fn, const char* what,
                      std::string* name) {
  if (py::isinstance<py::str>(fn)) {
    *name = fn.cast<std::string>();
    return Dataset::ComponentKey(*name);
  }
  if (!PyCallable_Check(fn.ptr())) {
    throw py::type_error(fmt::format(
        "{} must be a function of the element or the name of an integer "
        "entry, not {}",
        what, TypeName(fn)));
  }
  *name = py::str(py::getattr(fn, "__name__", py::str(what)));
  return [holder = KeepAlive(fn), what](const Element& e) {
    PythonCall python;
    return IntResult(Callable(holder)(ElementToDict(e)), what);
  };
}

// predicate(element dict), taken as Python's bool() of what it returns.
pipeline::PredicateFn PythonPredicate(py::function predicate) {
  return [holder = KeepAlive(std::move(predicate))](const Element& e) {
    PythonCall python;
    return py::bool_(Callable(holder)(ElementToDict(e))).cast<bool>();
  };
}

// A built-in map (recflow.maps), run without the GIL.
struct BuiltinMap {
  pipeline::MapFn fn;
  std::string name;
};

// --- Conversions ---------------------------------------------------------

// A job's output arguments, as convert() and write_tfrecords() take them.
convert::ConvertJob OutputJob(std::string output, uint64_t shards, bool index,
                              const std::string& compression, int level,
                              bool skip_bad, uint64_t max_record_bytes) {
  if (shards == 0) throw py::value_error("shards must be at least 1");
  if (max_record_bytes == 0) {
    throw py::value_error("max_record_bytes must be at least 1");
  }
  convert::ConvertJob job;
  job.output = std::move(output);
  job.shards = shards;
  job.writer.compression = *CompressionArg(compression);
  job.writer.level = level;
  job.writer.build_index = index;
  job.skip_bad = skip_bad;
  job.max_record_bytes = max_record_bytes;
  return job;
}

// A conversion's summary as a dict; its warnings, as `recflow convert`
// prints them, a UserWarning each (the shards are written; an error set by
// a warnings filter raises).
py::dict SummaryDict(const convert::ConvertSummary& s) {
  py::list shard_list;
  for (const auto& r : s.shards) {
    shard_list.append(py::dict("path"_a = r.path, "records"_a = r.records,
                               "bytes"_a = r.bytes));
  }
  for (const std::string& w : s.warnings) {
    if (PyErr_WarnEx(PyExc_UserWarning, w.c_str(), 1) != 0) {
      throw py::error_already_set();
    }
  }
  return py::dict("records"_a = s.records, "skipped"_a = s.skipped,
                  "bytes"_a = s.bytes, "seconds"_a = s.seconds,
                  "shards"_a = shard_list, "first_skipped"_a = s.first_skipped,
                  "labels_file"_a = s.labels_file, "warnings"_a = s.warnings);
}

// --- Datasets and iterators -------------------------------------------------

struct PyDataset {
  Dataset dataset;
  // A from_tfrecords() source with nothing after it: what global_shuffle()
  // reads by index instead.
  std::optional<std::vector<std::string>> tfrecord_paths;
  pipeline::TFRecordOptions tfrecord_options;
};

PyDataset Wrap(Dataset d) { return PyDataset{std::move(d), {}, {}}; }

// A Python function from an element to a recflow.Dataset, for `stage`
// (interleave, flat_map), run under the module's exit gate.
pipeline::InterleaveFn PythonInterleaveFn(py::function fn, std::string stage) {
  return [holder = KeepAlive(std::move(fn)),
          stage = std::move(stage)](const Element& e) {
    PythonCall python;
    py::object out = Callable(holder)(ElementToDict(e));
    if (!py::isinstance<PyDataset>(out)) {
      throw py::type_error(stage +
                           "'s function must return a recflow.Dataset, not " +
                           TypeName(out));
    }
    return out.cast<const PyDataset&>().dataset;
  };
}

// Ctrl-C during a next() that waits in C++.  Python's SIGINT handler only
// notes the signal for the main thread to act on between bytecodes, which
// a thread inside the pipeline never reaches.  So next() runs the C++
// iterator on the calling thread (no hand-off to a thread of our own: it
// cost 13% of the iteration rate, docs/PERFORMANCE.md) and a handler
// chained in front of Python's counts SIGINTs (one atomic add: async-
// signal-safe); the iterator's watchdog thread, polling every 50 ms while
// a next() of the main thread is in C++, cancels the pipeline when the
// count moved, and next() then raises KeyboardInterrupt.
std::atomic<uint64_t> sigint_count{0};
struct sigaction python_sigint;  // the handler ours chains to

void CountSigint(int sig, siginfo_t* info, void* context) {
  sigint_count.fetch_add(1, std::memory_order_relaxed);
  if (python_sigint.sa_flags & SA_SIGINFO) {
    python_sigint.sa_sigaction(sig, info, context);
  } else {
    python_sigint.sa_handler(sig);
  }
}

// Puts CountSigint in front of the process's SIGINT handler when that is a
// function (Python's, or one signal.signal() set since: Python installs
// its own C handler again then, and this chains in front of it on the
// next call).  Called with the GIL held, as signal.signal() is, so the two
// never race.  False when SIGINT is ignored or default (nothing to chain).
bool ChainSigint() {
  struct sigaction current;
  if (::sigaction(SIGINT, nullptr, &current) != 0) return false;
  if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == CountSigint) {
    return true;
  }
  if (!(current.sa_flags & SA_SIGINFO) &&
      (current.sa_handler == SIG_DFL || current.sa_handler == SIG_IGN)) {
    return false;
  }
  python_sigint = current;
  struct sigaction ours = current;
  ours.sa_flags |= SA_SIGINFO;
  ours.sa_sigaction = CountSigint;
  return ::sigaction(SIGINT, &ours, nullptr) == 0;
}

// Whether a Ctrl-C now would raise KeyboardInterrupt in this thread: the
// main thread, with Python's default SIGINT handler.  A handler of the
// program's own may choose not to raise (set a flag, finish the batch,
// save): then the iteration is left alone, and the handler runs when
// next() returns.
bool CtrlCInterrupts() {
  static const unsigned long main_ident = py::module_::import("threading")
                                              .attr("main_thread")()
                                              .attr("ident")
                                              .cast<unsigned long>();
  if (PyThread_get_thread_ident() != main_ident) return false;
  static const py::object* signal =
      new py::object(py::module_::import("signal"));
  const py::object handler = signal->attr("getsignal")(SIGINT);
  return handler.is(signal->attr("default_int_handler"));
}

// Raises the Ctrl-C that Python's handler has noted (CountSigint chains to
// it), or KeyboardInterrupt if a Python function running inside the
// pipeline took it first.
[[noreturn]] void RaiseCtrlC() {
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  PyErr_SetNone(PyExc_KeyboardInterrupt);
  throw py::error_already_set();
}

// Thrown from a conversion's progress report to end it on a Ctrl-C.
struct ConversionInterrupted {};

// Runs `run(progress)`, a conversion given the progress callback to use,
// with the GIL released.  A Ctrl-C of the main thread (with Python's
// default SIGINT handler, see CtrlCInterrupts) ends it at its next progress
// report (every 256 rows or elements; every 4096 rows in the typing pass
// of CSV and JSON Lines), which leaves no shards (all appear or none), and
// raises KeyboardInterrupt.  Otherwise it would run to its end first.
template <typename Run>
convert::ConvertSummary RunInterruptibly(Run run) {
  const bool watched = CtrlCInterrupts() && ChainSigint();
  const uint64_t sigints = sigint_count.load(std::memory_order_relaxed);
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  std::function<void(const convert::ConvertProgress&)> progress;
  if (watched) {
    progress = [sigints](const convert::ConvertProgress&) {
      if (sigint_count.load(std::memory_order_relaxed) != sigints) {
        throw ConversionInterrupted();
      }
    };
  }
  convert::ConvertSummary s;
  std::exception_ptr error;
  {
    py::gil_scoped_release release;
    try {
      s = run(progress);
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (watched && sigint_count.load(std::memory_order_relaxed) != sigints) {
    RaiseCtrlC();
  }
  if (error) std::rethrow_exception(error);
  return s;
}

// Iterates a Dataset on the calling thread with the GIL released; Ctrl-C
// (above) interrupts a next() of the main thread within 50 ms, even while
// a slow Python map holds a pipeline thread (with Python's default SIGINT
// handler; see CtrlCInterrupts).  Nothing is read ahead of
// the element last returned, so save() is exactly the position after it.
// Used by one Python thread at a time.
class PyIterator {
 public:
  PyIterator(const Dataset& dataset, pipeline::IteratorOptions options)
      : shared_(std::make_shared<Shared>(dataset.MakeIterator(options))) {}
  ~PyIterator() {
    if (watchdog_.joinable()) {
      {
        std::lock_guard lock(shared_->mu);
        shared_->quit = true;
      }
      shared_->cv.notify_all();
      watchdog_.join();
    }
    if (interrupted_) {
      // Cancelled: the C++ stages' waits have ended, but a Python function
      // a pipeline thread is in (a map sleeping, say) finishes only when it
      // returns, and the iterator's destruction waits for it: leave that
      // to a thread of its own.
      std::thread([s = std::move(shared_)]() mutable { s.reset(); }).detach();
      return;
    }
    // Without the GIL: the iterator's stages may be running Python
    // functions, which need it to finish.
    py::gil_scoped_release release;
    shared_.reset();
  }
  PyIterator(const PyIterator&) = delete;
  PyIterator& operator=(const PyIterator&) = delete;

  py::dict Next() {
    Enter();
    Leave leave{this};
    if (finished_) throw py::stop_iteration();
    started_ = true;
    const bool watched = CtrlCInterrupts() && ChainSigint();
    const uint64_t sigints = sigint_count.load(std::memory_order_relaxed);
    // A Ctrl-C that came before this call.
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (watched) Watch(sigints);
    Element element;
    bool has = false;
    std::exception_ptr error;
    {
      py::gil_scoped_release release;
      try {
        has = shared_->iterator.Next(&element);
      } catch (...) {
        error = std::current_exception();
      }
    }
    if (watched) {
      bool fired;
      {
        std::lock_guard lock(shared_->mu);
        shared_->watching = false;
        fired = shared_->fired;
      }
      if (fired || (error && sigint_count.load() != sigints)) {
        // Cancelled (or failed) by the Ctrl-C: raise it here.
        interrupted_ = true;
        RaiseCtrlC();
      }
    }
    if (error) std::rethrow_exception(error);
    if (!has) {
      finished_ = true;
      throw py::stop_iteration();
    }
    return ElementToDict(element);
  }

  py::bytes Save() {
    Enter();
    Leave leave{this};
    std::string state;
    {
      py::gil_scoped_release release;
      state = shared_->iterator.Save();
    }
    return py::bytes(state);
  }

  void Restore(const std::string& state) {
    Enter();
    Leave leave{this};
    if (started_) {
      throw py::value_error(
          "restore() must come before the first element: restore into a "
          "fresh iterator (Dataset.restore(state))");
    }
    py::gil_scoped_release release;
    shared_->iterator.Restore(state);
  }

  py::list Stats() {
    Enter();
    Leave leave{this};
    const std::vector<pipeline::StageStats> stats = shared_->iterator.Stats();
    py::list out;
    for (const auto& s : stats) {
      out.append(py::dict(
          "name"_a = s.name, "elements"_a = s.elements, "bytes"_a = s.bytes,
          "busy_seconds"_a = s.busy_seconds, "wait_seconds"_a = s.wait_seconds,
          "parallelism"_a = s.parallelism, "buffered"_a = s.buffered,
          "errors_ignored"_a = s.errors_ignored, "wakes"_a = s.wakes));
    }
    return out;
  }

 private:
  struct Shared {
    explicit Shared(pipeline::Iterator it) : iterator(std::move(it)) {}
    pipeline::Iterator iterator;
    // The watchdog's: all under mu.
    std::mutex mu;
    std::condition_variable cv;
    bool watching = false;  // a next() is in C++
    uint64_t sigints = 0;   // sigint_count when it began
    bool fired = false;     // the watchdog cancelled the iterator
    bool idle = false;      // the watchdog sleeps until the next next()
    bool quit = false;
  };

  // Arms the watchdog for one next() (started on the first): no system
  // call while it polls, which it does until a second passes without a
  // next(); a notify only wakes it from that idle sleep.
  void Watch(uint64_t sigints) {
    if (!watchdog_.joinable()) {
      watchdog_ = std::thread([s = shared_] { WatchdogLoop(*s); });
    }
    bool wake;
    {
      std::lock_guard lock(shared_->mu);
      shared_->watching = true;
      shared_->sigints = sigints;
      wake = shared_->idle;
      shared_->idle = false;
    }
    if (wake) shared_->cv.notify_all();
  }

  static void WatchdogLoop(Shared& s) {
    using Clock = std::chrono::steady_clock;
    std::unique_lock lock(s.mu);
    Clock::time_point active = Clock::now();
    while (!s.quit) {
      if (s.idle) {
        s.cv.wait(lock);
        active = Clock::now();
        continue;
      }
      s.cv.wait_for(lock, std::chrono::milliseconds(50));
      if (s.quit) break;
      if (s.watching) {
        active = Clock::now();
        if (!s.fired && sigint_count.load() != s.sigints) {
          s.fired = true;
          s.iterator.context().Cancel();
        }
      } else if (Clock::now() - active > std::chrono::seconds(1)) {
        s.idle = true;
      }
    }
  }

  // The GIL makes these checks race-free; they catch a second Python
  // thread using the iterator while the first waits without the GIL.
  void Enter() {
    if (interrupted_) {
      throw py::value_error(
          "this iterator was interrupted (KeyboardInterrupt) and cannot go "
          "on; make a new one, or restore a saved state into a new one");
    }
    if (busy_) {
      throw py::value_error(
          "a recflow iterator is used by one thread at a time");
    }
    busy_ = true;
  }
  struct Leave {
    PyIterator* it;
    ~Leave() { it->busy_ = false; }
  };

  std::shared_ptr<Shared> shared_;
  std::thread watchdog_;
  bool busy_ = false;
  bool started_ = false;
  bool finished_ = false;
  bool interrupted_ = false;
};

// A sequence of recflow.Datasets (a list or tuple) for `fn`; anything else
// is a TypeError naming it.
std::vector<Dataset> DatasetsArg(const py::handle& seq, std::string_view fn) {
  if (!py::isinstance<py::sequence>(seq) || py::isinstance<py::str>(seq)) {
    throw py::type_error(fmt::format(
        "{} takes a sequence of recflow.Datasets, not {}", fn, TypeName(seq)));
  }
  std::vector<Dataset> datasets;
  for (py::handle h : seq.cast<py::sequence>()) {
    if (!py::isinstance<PyDataset>(h)) {
      throw py::type_error(
          fmt::format("{} takes recflow.Datasets, not {}", fn, TypeName(h)));
    }
    datasets.push_back(h.cast<const PyDataset&>().dataset);
  }
  return datasets;
}

// A `seed` argument: None, or an int of TensorFlow's int64 seeds or of
// uint64 (a negative seed is its two's complement, so -1 and 2**64 - 1
// give one order).  Anything else is a TypeError or ValueError naming it.
std::optional<uint64_t> SeedArg(const py::object& seed) {
  if (seed.is_none()) return std::nullopt;
  if (PyBool_Check(seed.ptr()) || !PyIndex_Check(seed.ptr())) {
    throw py::type_error("seed must be an int or None, not " + TypeName(seed));
  }
  const py::object value =
      py::reinterpret_steal<py::object>(PyNumber_Index(seed.ptr()));
  if (!value) throw py::error_already_set();
  int overflow = 0;
  const long long signed_value =
      PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
  if (overflow == 0) return static_cast<uint64_t>(signed_value);
  if (overflow > 0) {
    const unsigned long long u = PyLong_AsUnsignedLongLong(value.ptr());
    if (!PyErr_Occurred()) return u;
    PyErr_Clear();
  }
  throw py::value_error(fmt::format("seed {} is outside [-2^63, 2^64)",
                                    py::str(seed).cast<std::string>()));
}

// A `threads` argument: 0 means every core; a negative count is refused
// rather than read as 0.
int ThreadsArg(int threads, const char* function) {
  if (threads < 0) {
    throw py::value_error(
        fmt::format("{}: threads must be 0 (every core) or positive, not {}",
                    function, threads));
  }
  return threads;
}

std::unique_ptr<PyIterator> MakePyIterator(const PyDataset& d, int threads,
                                           bool optimize) {
  pipeline::IteratorOptions options;
  options.threads = ThreadsArg(threads, "iterator()");
  options.optimize = optimize;
  return std::make_unique<PyIterator>(d.dataset, options);
}

// --- Examples --------------------------------------------------------------

struct PyExample {
  std::string serialized;
};

// What one Python value in a feature's list is.
enum class ValueKind { kInt, kFloat, kBytes, kOther };

ValueKind KindOf(py::handle v, const py::module_& np) {
  if (PyBool_Check(v.ptr()) || PyLong_Check(v.ptr())) return ValueKind::kInt;
  if (PyFloat_Check(v.ptr())) return ValueKind::kFloat;
  if (PyBytes_Check(v.ptr()) || PyUnicode_Check(v.ptr()) ||
      PyByteArray_Check(v.ptr())) {
    return ValueKind::kBytes;
  }
  if (py::isinstance(v, np.attr("integer")) ||
      py::isinstance(v, np.attr("bool_"))) {
    return ValueKind::kInt;
  }
  if (py::isinstance(v, np.attr("floating"))) return ValueKind::kFloat;
  return ValueKind::kOther;
}

std::string BytesOf(py::handle v) {
  if (PyByteArray_Check(v.ptr())) {
    return std::string(PyByteArray_AsString(v.ptr()),
                       static_cast<size_t>(PyByteArray_Size(v.ptr())));
  }
  return v.cast<std::string>();
}

std::string FeatureWhat(const std::string& name) {
  return fmt::format("feature '{}'", name);
}

// A float_list value; beyond float's range it is +-inf, as protobuf's
// FloatList stores it.
float FloatOf(const std::string& name, py::handle v) {
  const double x = PyFloat_AsDouble(v.ptr());
  if (x == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    throw py::value_error(fmt::format("feature '{}': {} does not fit a float",
                                      name, py::repr(v).cast<std::string>()));
  }
  return static_cast<float>(x);
}

// Python values (a list, nested lists, a numpy object array) by what they
// hold rather than by numpy's promotion, which would turn [1, "a"] into
// strings and [2**63] into a wrapped uint64: all bytes/str, all ints, or
// numbers with at least one float; anything else is refused.
void AddObjects(records::ExampleBuilder& b, const std::string& name,
                const py::array& objects, const py::module_& np) {
  const py::object flat = objects.attr("ravel")();
  bool ints = false, floats = false, bytes = false;
  for (py::handle v : flat) {
    switch (KindOf(v, np)) {
      case ValueKind::kInt:
        ints = true;
        break;
      case ValueKind::kFloat:
        floats = true;
        break;
      case ValueKind::kBytes:
        bytes = true;
        break;
      case ValueKind::kOther:
        throw py::type_error(fmt::format(
            "feature '{}': a list must hold numbers, or bytes/str, not {}",
            name, TypeName(v)));
    }
  }
  if (bytes && (ints || floats)) {
    throw py::type_error(fmt::format(
        "feature '{}': a list holds both numbers and bytes/str; an Example "
        "feature is one int64, float or bytes list",
        name));
  }
  if (bytes) {
    std::vector<std::string> values;
    for (py::handle v : flat) values.push_back(BytesOf(v));
    b.AddBytesList(name, std::span<const std::string>(values));
  } else if (floats) {
    std::vector<float> values;
    for (py::handle v : flat) values.push_back(FloatOf(name, v));
    b.AddFloatList(name, values);
  } else {
    // numpy.bool_ is no index (numpy deprecates reading it as one).
    const py::object np_bool = np.attr("bool_");
    std::vector<int64_t> values;
    for (py::handle v : flat) {
      values.push_back(py::isinstance(v, np_bool)
                           ? static_cast<int64_t>(v.cast<bool>())
                           : Int64FromPython(v, FeatureWhat(name)));
    }
    b.AddInt64List(name, values);
  }
}

void AddFeature(records::ExampleBuilder& b, const std::string& name,
                py::handle value) {
  if (PyBytes_Check(value.ptr()) || PyUnicode_Check(value.ptr()) ||
      PyByteArray_Check(value.ptr())) {
    b.AddBytes(name, BytesOf(value));
    return;
  }
  if (PyBool_Check(value.ptr()) || PyLong_Check(value.ptr())) {
    b.AddInt64(name, Int64FromPython(value, FeatureWhat(name)));
    return;
  }
  if (PyFloat_Check(value.ptr())) {
    b.AddFloat(name, FloatOf(name, value));
    return;
  }
  py::module_ np = py::module_::import("numpy");
  if (!py::isinstance<py::array>(value)) {
    // A list, tuple or numpy scalar: its values decide the list's type.
    py::array objects = np.attr("asarray")(value, "dtype"_a = "object");
    if (objects.size() == 0) {
      throw py::type_error(fmt::format(
          "feature '{}': an empty list has no type; give a typed empty array "
          "(numpy.zeros(0, numpy.int64) or numpy.float32) or [] of bytes via "
          "numpy.array([], dtype=object)",
          name));
    }
    AddObjects(b, name, objects, np);
    return;
  }
  py::array array = py::reinterpret_borrow<py::array>(value);
  const char kind = array.dtype().kind();
  py::object flat = array.attr("ravel")();
  if (kind == 'f') {
    auto v = np.attr("ascontiguousarray")(flat, "dtype"_a = "float32")
                 .cast<py::array_t<float>>();
    b.AddFloatList(name, {v.data(), static_cast<size_t>(v.size())});
  } else if (kind == 'i' || kind == 'u' || kind == 'b') {
    if (kind == 'u' && array.dtype().itemsize() == 8 && array.size() > 0) {
      Int64FromPython(array.attr("max")(), FeatureWhat(name));  // in range?
    }
    auto v = np.attr("ascontiguousarray")(flat, "dtype"_a = "int64")
                 .cast<py::array_t<int64_t>>();
    b.AddInt64List(name, {v.data(), static_cast<size_t>(v.size())});
  } else if (kind == 'S' || kind == 'U') {
    std::vector<std::string> values;
    for (py::handle v : flat) values.push_back(v.cast<std::string>());
    b.AddBytesList(name, std::span<const std::string>(values));
  } else if (kind == 'O') {
    AddObjects(b, name, array, np);
  } else {
    throw py::type_error(fmt::format(
        "feature '{}': cannot store numpy dtype {} in an Example (int64, "
        "float or bytes lists)",
        name, py::str(array.dtype()).cast<std::string>()));
  }
}

PyExample ExampleFromDict(py::dict features) {
  records::ExampleBuilder b;
  for (auto [key, value] : features) {
    if (!PyUnicode_Check(key.ptr())) {
      throw py::type_error("Example: feature names must be str, not " +
                           TypeName(key));
    }
    AddFeature(b, key.cast<std::string>(), value);
  }
  return PyExample{std::string(b.Serialize())};
}

tensorflow::Example ParseExample(const std::string& bytes) {
  tensorflow::Example e;
  if (!e.ParseFromString(bytes)) {
    throw py::value_error(fmt::format(
        "{} bytes are not a serialized tf.train.Example", bytes.size()));
  }
  return e;
}

py::dict ExampleToDict(const PyExample& example) {
  const tensorflow::Example e = ParseExample(example.serialized);
  std::vector<std::string> names;
  for (const auto& [name, feature] : e.features().feature()) {
    names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  py::module_ np = py::module_::import("numpy");
  py::dict out;
  for (const std::string& name : names) {
    const tensorflow::Feature& f = e.features().feature().at(name);
    py::object value;
    if (f.has_int64_list()) {
      const auto& v = f.int64_list().value();
      value = py::array_t<int64_t>(v.size(), v.data());
    } else if (f.has_float_list()) {
      const auto& v = f.float_list().value();
      value = py::array_t<float>(v.size(), v.data());
    } else {
      py::list list;
      if (f.has_bytes_list()) {
        for (const std::string& s : f.bytes_list().value()) {
          list.append(py::bytes(s));
        }
      }
      value = list;
    }
    out[py::str(name)] = value;
  }
  return out;
}

// --- Records -----------------------------------------------------------------

class PyWriter {
 public:
  PyWriter(std::string path, std::optional<std::string> compression, int level,
           bool index)
      : path_(std::move(path)), index_(index) {
    records::WriterOptions options;
    options.compression = compression ? *CompressionArg(compression)
                                      : records::CompressionFromSuffix(path_);
    options.level = level;
    options.build_index = index;
    py::gil_scoped_release release;
    writer_ = std::make_unique<records::TFRecordWriter>(path_, options);
  }

  void Write(py::handle record) {
    Open();
    if (py::isinstance<PyExample>(record)) {
      writer_->Write(record.cast<const PyExample&>().serialized);
      return;
    }
    if (!PyBytes_Check(record.ptr())) {
      throw py::type_error("write() takes bytes or a recflow.Example, not " +
                           TypeName(record));
    }
    char* data;
    Py_ssize_t n;
    PyBytes_AsStringAndSize(record.ptr(), &data, &n);
    writer_->Write(std::string_view(data, static_cast<size_t>(n)));
  }
  void Flush() {
    Open();
    py::gil_scoped_release release;
    writer_->Flush();
  }
  void Close() {
    if (!writer_) return;  // closing twice is harmless, as for files
    std::unique_ptr<records::TFRecordWriter> w = std::move(writer_);
    py::gil_scoped_release release;
    w->Finish();
    w->Commit();
    if (index_) records::WriteIndex(records::IndexPathFor(path_), w->index());
    records_ = w->records_written();
  }
  // Leaves nothing behind: the file never appears under its name.
  void Abort() { writer_.reset(); }
  uint64_t records() const {
    return writer_ ? writer_->records_written() : records_;
  }
  const std::string& path() const { return path_; }
  bool closed() const { return writer_ == nullptr; }

 private:
  void Open() const {
    if (!writer_) throw py::value_error("write to a closed TFRecordWriter");
  }
  std::string path_;
  bool index_;
  uint64_t records_ = 0;
  std::unique_ptr<records::TFRecordWriter> writer_;
};

class PyRecordIterator {
 public:
  PyRecordIterator(std::string path, records::ReaderOptions options) {
    py::gil_scoped_release release;
    reader_ =
        std::make_unique<records::TFRecordReader>(std::move(path), options);
  }
  py::bytes Next() {
    std::string_view record;
    bool ok;
    {
      py::gil_scoped_release release;
      ok = reader_->ReadRecord(&record);
    }
    if (!ok) throw py::stop_iteration();
    return py::bytes(record.data(), record.size());
  }

 private:
  std::unique_ptr<records::TFRecordReader> reader_;
};

// recflow.TFRecordDataSource: records by number, through the files'
// indexes (pipeline::TFRecordDataSource), read and parsed without the GIL.
class PyDataSource {
 public:
  PyDataSource(py::handle files, py::handle spec) {
    std::vector<std::string> paths =
        records::ExpandRecordPaths(Paths(files, "TFRecordDataSource"));
    std::optional<records::FeatureSpec> parsed;
    if (!spec.is_none()) parsed = SpecArg(spec);
    py::gil_scoped_release release;
    source_ = std::make_shared<const pipeline::TFRecordDataSource>(
        std::move(paths), std::move(parsed));
  }

  uint64_t size() const { return source_->size(); }
  const pipeline::TFRecordDataSource& source() const { return *source_; }

  // An int: that record.  A slice, a sequence of ints or a 1-D integer
  // array: those records, as one batch.  Negative numbers count from the
  // end, as Python's sequences do.
  py::object GetItem(py::handle key) const {
    if (PyIndex_Check(key.ptr()) && !py::isinstance<py::array>(key)) {
      const uint64_t i =
          Normalize(py::reinterpret_steal<py::object>(PyNumber_Index(key.ptr()))
                        .cast<py::int_>());
      pipeline::Element e;
      {
        py::gil_scoped_release release;
        e = source_->Get(std::span<const uint64_t>(&i, 1), false);
      }
      if (!source_->spec()) {
        const std::string_view r = e["record"].bytes(0);
        return py::bytes(r.data(), r.size());
      }
      return ElementToDict(e);
    }
    std::vector<uint64_t> indices;
    if (PySlice_Check(key.ptr())) {
      py::ssize_t start = 0, stop = 0, step = 0, n = 0;
      if (!py::reinterpret_borrow<py::slice>(key).compute(
              static_cast<size_t>(size()), &start, &stop, &step, &n)) {
        throw py::error_already_set();
      }
      for (py::ssize_t k = 0; k < n; ++k) {
        indices.push_back(static_cast<uint64_t>(start + k * step));
      }
    } else {
      if (PyUnicode_Check(key.ptr()) || PyBytes_Check(key.ptr()) ||
          !py::isinstance<py::iterable>(key)) {
        throw py::type_error(fmt::format(
            "TFRecordDataSource indices must be an int, a slice, or a "
            "sequence or 1-D array of ints, not {}",
            TypeName(key)));
      }
      py::array array = py::module_::import("numpy").attr("asarray")(key);
      const char kind = array.dtype().kind();
      if (array.ndim() != 1 ||
          (array.size() > 0 && kind != 'i' && kind != 'u')) {
        throw py::type_error(fmt::format(
            "TFRecordDataSource indices must be ints in one dimension, not an "
            "array of {} with {} dimensions",
            py::str(array.dtype()).cast<std::string>(), array.ndim()));
      }
      indices.reserve(static_cast<size_t>(array.size()));
      const auto n = static_cast<int64_t>(size());
      if (kind == 'u') {
        const auto u = py::array_t<uint64_t, py::array::forcecast>(array);
        for (py::ssize_t k = 0; k < u.size(); ++k) {
          const uint64_t i = u.data()[k];
          if (i >= size()) Normalize(py::int_(i));  // throws IndexError
          indices.push_back(i);
        }
      } else if (array.size() > 0) {
        const auto s = py::array_t<int64_t, py::array::forcecast>(array);
        for (py::ssize_t k = 0; k < s.size(); ++k) {
          const int64_t i = s.data()[k];
          if (i < -n || i >= n) Normalize(py::int_(i));  // throws IndexError
          indices.push_back(static_cast<uint64_t>(i < 0 ? i + n : i));
        }
      }
    }
    pipeline::Element e;
    {
      py::gil_scoped_release release;
      e = source_->Get(indices, true);
    }
    if (source_->spec()) return ElementToDict(e);
    const pipeline::Tensor& records = e["record"];
    py::list out(indices.size());
    for (size_t k = 0; k < indices.size(); ++k) {
      const std::string_view r = records.bytes(static_cast<int64_t>(k));
      out[k] = py::bytes(r.data(), r.size());
    }
    return out;
  }

  py::tuple Locate(py::handle index) const {
    if (!PyIndex_Check(index.ptr())) {
      throw py::type_error(fmt::format(
          "TFRecordDataSource.locate takes an int, not {}", TypeName(index)));
    }
    const pipeline::TFRecordDataSource::Location at = source_->Locate(
        Normalize(py::reinterpret_steal<py::object>(PyNumber_Index(index.ptr()))
                      .cast<py::int_>()));
    return py::make_tuple(source_->files()[at.file], at.record, at.offset);
  }

 private:
  uint64_t Normalize(py::int_ value) const {
    // Python ints of any size: compare before converting.
    const py::int_ n(size());
    py::int_ i = value;
    if (i < py::int_(0)) i = py::int_(i + n);
    if (i < py::int_(0) || !(i < n)) {
      throw py::index_error(fmt::format(
          "record {} is out of range: the data source has {} records",
          py::str(value).cast<std::string>(), size()));
    }
    return i.cast<uint64_t>();
  }

  std::shared_ptr<const pipeline::TFRecordDataSource> source_;
};

records::ReaderOptions ReaderArgs(const std::optional<std::string>& compression,
                                  bool verify_checksums,
                                  uint64_t max_record_bytes) {
  records::ReaderOptions o;
  o.compression = CompressionArg(compression);
  o.verify_checksums = verify_checksums;
  o.max_record_bytes = max_record_bytes;
  return o;
}

// Every record of the files `paths` names, both CRCs checked (ScanFile,
// as `recflow count` and `verify` read them), without the GIL: {file,
// records} in order.  Throws the first damage.  `check_indexes` (verify):
// a file with an index beside it is read once checking both (VerifyFile,
// as `recflow verify`), and an index that is not the file's is a
// ValueError.
std::vector<std::pair<std::string, uint64_t>> ScanFiles(
    py::handle paths, const char* what,
    const std::optional<std::string>& compression, int threads,
    bool check_indexes = false) {
  ThreadsArg(threads, what);
  const std::vector<std::string> files =
      records::ExpandRecordPaths(Paths(paths, what));
  const auto options =
      ReaderArgs(compression, true, records::kDefaultMaxRecordBytes);
  std::vector<std::pair<std::string, uint64_t>> counts;
  py::gil_scoped_release release;
  for (const std::string& f : files) {
    if (check_indexes && std::filesystem::exists(records::IndexPathFor(f))) {
      const records::VerifiedFile v = records::VerifyFile(f, options);
      if (!v.index_problem.empty()) {
        throw py::value_error(v.index_problem +
                              " (recflow.index() writes it again)");
      }
      counts.emplace_back(f, v.records);
    } else {
      counts.emplace_back(f, records::ScanFile(f, options, threads).records);
    }
  }
  return counts;
}

records::FeatureSpec SpecArg(py::handle value) {
  if (py::isinstance<records::FeatureSpec>(value)) {
    return value.cast<records::FeatureSpec>();
  }
  if (PyDict_Check(value.ptr())) {
    py::dict d = py::reinterpret_borrow<py::dict>(value);
    std::string text =
        py::module_::import("json")
            .attr("dumps")(d.contains("features")
                               ? py::object(d)
                               : py::object(py::dict("features"_a = d)))
            .cast<std::string>();
    return records::FeatureSpec::FromJsonText(text);
  }
  if (PyUnicode_Check(value.ptr()) || py::hasattr(value, "__fspath__")) {
    std::string s =
        py::module_::import("os").attr("fsdecode")(value).cast<std::string>();
    const auto first = s.find_first_not_of(" \t\r\n");
    if (first != std::string::npos && s[first] == '{') {
      return records::FeatureSpec::FromJsonText(s);
    }
    return records::FeatureSpec::FromFile(s);
  }
  throw py::type_error(
      "a feature spec is a recflow.FeatureSpec, a dict, JSON text or the "
      "path of a JSON file, not " +
      TypeName(value));
}

void RegisterErrors(py::module_& m) {
  static py::exception<records::RecordError> record_error(m, "RecordError",
                                                          PyExc_ValueError);
  record_error.doc() =
      "A TFRecord file is damaged. Attributes: path, offset (of the record "
      "in the uncompressed stream), record_index, kind.";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const records::RecordError& e) {
      py::object error =
          py::reinterpret_borrow<py::object>(record_error.ptr())(e.what());
      error.attr("path") = e.path();
      error.attr("offset") = e.offset();
      error.attr("record_index") = e.record_index();
      error.attr("kind") = std::string(records::DamageKindName(e.kind()));
      PyErr_SetObject(record_error.ptr(), error.ptr());
    } catch (const records::IoError& e) {
      if (e.errno_value() != 0) {
        py::object error = py::reinterpret_borrow<py::object>(PyExc_OSError)(
            e.errno_value(), e.what());
        PyErr_SetObject(PyExc_OSError, error.ptr());
      } else {
        PyErr_SetString(PyExc_OSError, e.what());
      }
    } catch (const records::FileListError& e) {
      PyErr_SetString(PyExc_FileNotFoundError, e.what());
    } catch (const recflow::Error& e) {
      // Bad data or a misuse in any layer: records, pipeline, convert.
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
}

}  // namespace

PYBIND11_MODULE(_recflow, m) {
  m.doc() =
      "recflow's C++ library: TFRecords, Examples, conversion and the "
      "input pipeline (see the recflow package)";
  RegisterErrors(m);
  // Before finalization, while the GIL may still be taken by our threads.
  py::module_::import("atexit").attr("register")(
      py::cpp_function([] { CloseExitGate(); }));

  // --- FeatureSpec ---
  py::class_<records::FeatureSpec>(m, "FeatureSpec", R"doc(
Which features of a tf.train.Example to parse, and into what: the dict of
tf.io.FixedLenFeature / VarLenFeature that tf.io.parse_example takes.

FeatureSpec(spec) takes a dict in the JSON form that `recflow inspect --spec`
writes ({"image": {"kind": "fixed", "dtype": "bytes", "shape": []}, ...},
with or without an outer {"features": ...}), JSON text, or a file's path.
recflow.FixedLenFeature / recflow.VarLenFeature build the dict's values.
)doc")
      .def(py::init([](py::handle spec) { return SpecArg(spec); }), "spec"_a)
      .def(
          "to_dict",
          [](const records::FeatureSpec& s) {
            return py::module_::import("json").attr("loads")(s.ToJson().dump());
          },
          "The JSON form as a dict ({'features': {...}}).")
      .def(
          "to_json",
          [](const records::FeatureSpec& s) { return s.ToJson().dump(2); },
          "The JSON form as text (what --spec files hold).")
      .def_property_readonly("names",
                             [](const records::FeatureSpec& s) {
                               std::vector<std::string> names;
                               for (const auto& f : s.features) {
                                 names.push_back(f.first);
                               }
                               return names;
                             })
      .def("__repr__", [](const records::FeatureSpec& s) {
        return "FeatureSpec(" + s.ToJson().dump() + ")";
      });

  // --- Built-in maps ---
  py::class_<BuiltinMap>(m, "BuiltinMap",
                         "A map written in C++ (recflow.maps), for "
                         "Dataset.map; runs without the GIL.")
      .def("__repr__", [](const BuiltinMap& b) { return b.name; });
  py::module_ maps = m.def_submodule(
      "maps", "Built-in maps for Dataset.map, run in C++ without the GIL.");
  maps.def(
      "decode_raw",
      [](std::string key, py::handle dtype, std::vector<int64_t> shape) {
        std::string name = fmt::format("decode_raw('{}')", key);
        return BuiltinMap{
            pipeline::maps::DecodeRaw(std::move(key), DTypeArg(dtype), shape),
            name};
      },
      "key"_a, "dtype"_a, "shape"_a = std::vector<int64_t>{},
      "tf.io.decode_raw: the bytes of `key` as little-endian `dtype`, "
      "reshaped to `shape` per record (-1: inferred; empty: flat). uint8 is "
      "a view, other dtypes a copy.");
  maps.def(
      "cast",
      [](std::string key, py::handle dtype) {
        std::string name = fmt::format("cast('{}')", key);
        return BuiltinMap{pipeline::maps::Cast(std::move(key), DTypeArg(dtype)),
                          name};
      },
      "key"_a, "dtype"_a, "tf.cast of component `key` to `dtype`.");
  maps.def(
      "scale",
      [](std::string key, double scale, double offset) {
        std::string name = fmt::format("scale('{}')", key);
        return BuiltinMap{pipeline::maps::Scale(std::move(key), scale, offset),
                          name};
      },
      "key"_a, "scale"_a, "offset"_a = 0.0,
      "`key` * scale + offset as float32 (scale('image', 1/255)).");
  maps.def(
      "select",
      [](std::vector<std::string> keys) {
        return BuiltinMap{pipeline::maps::Select(keys), "select"};
      },
      "keys"_a, "Keeps only `keys`, in that order.");
  maps.def(
      "rename",
      [](std::string from, std::string to) {
        std::string name = fmt::format("rename('{}', '{}')", from, to);
        return BuiltinMap{pipeline::maps::Rename(from, to), name};
      },
      "old"_a, "new"_a, "Renames a component.");
  maps.def(
      "decode_element",
      [](std::string key) {
        std::string name = fmt::format("decode_element('{}')", key);
        return BuiltinMap{pipeline::maps::DecodeElement(std::move(key)), name};
      },
      "key"_a = "record",
      "The element a record of Dataset.save holds, exactly (Dataset.load "
      "applies it).");

  // --- Iterator ---
  py::class_<PyIterator>(m, "Iterator", R"doc(
Runs a Dataset. Yields dicts of arrays (recflow.Array, read-only numpy
arrays sharing memory with the C++ batch; bytes as bytes or object arrays;
ragged features as recflow.Ragged). save() returns the position after the
last element as bytes; restore(state) continues from one, before the first
element. Ctrl-C interrupts a wait promptly (the iterator is then spent)
unless the program installed a SIGINT handler of its own.
)doc")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", &PyIterator::Next)
      .def("save", &PyIterator::Save,
           "The position after the last element returned, as bytes.")
      .def("restore", &PyIterator::Restore, "state"_a,
           "Continues from a saved state; only before the first element.")
      .def("stats", &PyIterator::Stats,
           "Per stage: elements, bytes, busy and wait seconds, parallelism, "
           "elements buffered (asynchronous stages; else -1), errors ignored, "
           "and the takes that woke its sleeping driver (wakes).");

  // --- Dataset ---
  py::class_<PyDataset> dataset(m, "Dataset", R"doc(
An input pipeline with tf.data's semantics, run in C++ on every core.

    ds = (recflow.Dataset.from_tfrecords("data/train-*.tfrecord")
          .shuffle(10_000, seed=7)
          .batch(256, drop_remainder=True)
          .parse({"image": recflow.FixedLenFeature([], "bytes"),
                  "label": recflow.FixedLenFeature([], "int64")})
          .map(recflow.maps.decode_raw("image", "uint8", [28, 28]))
          .prefetch(2))
    for batch in ds:              # dicts of numpy arrays, zero-copy
        images = torch.from_dlpack(batch["image"])

Immutable: every transformation returns a new Dataset. The order depends
only on the inputs and seeds, never on the thread count.
)doc");
  dataset
      .def_static(
          "from_tfrecords",
          [](py::handle files, std::optional<std::string> compression,
             int num_parallel_reads, bool shuffle_files, const py::object& seed,
             bool reshuffle_each_iteration, bool verify_checksums,
             uint64_t max_record_bytes, int block_length, bool deterministic,
             int64_t shuffle_buffer_per_file) {
            pipeline::TFRecordOptions o;
            o.compression = CompressionArg(compression);
            o.num_parallel_reads = num_parallel_reads;
            o.block_length = block_length;
            o.deterministic = deterministic;
            o.shuffle_files = shuffle_files;
            o.seed = SeedArg(seed);
            o.reshuffle_each_iteration = reshuffle_each_iteration;
            o.verify_checksums = verify_checksums;
            o.max_record_bytes = max_record_bytes;
            o.shuffle_buffer_per_file = shuffle_buffer_per_file;
            // Expanded here so that a name matching nothing is a
            // FileNotFoundError, as for the other functions taking paths.
            std::vector<std::string> paths =
                records::ExpandRecordPaths(Paths(files, "from_tfrecords"));
            PyDataset d = Wrap(Dataset::FromTFRecords(paths, o));
            d.tfrecord_paths = std::move(paths);
            d.tfrecord_options = o;
            return d;
          },
          "files"_a, "compression"_a = py::none(), "num_parallel_reads"_a = 1,
          "shuffle_files"_a = false, "seed"_a = py::none(),
          "reshuffle_each_iteration"_a = true, "verify_checksums"_a = true,
          "max_record_bytes"_a = records::kDefaultMaxRecordBytes,
          "block_length"_a = 1, "deterministic"_a = true,
          "shuffle_buffer_per_file"_a = 0,
          "TFRecord files (paths, globs, directories): elements "
          "{'record': bytes}. compression: None detects it per file. "
          "num_parallel_reads: files read at once, each on a thread of "
          "its own, interleaved in a fixed order (deterministic=False: "
          "whichever file has a record read); "
          "recflow.AUTOTUNE (-1): one per core, at most one per file. "
          "shuffle_buffer_per_file: each file's records shuffled in a "
          "buffer of that many of its own before the interleave (tf.data's "
          "interleave(lambda f: TFRecordDataset(f).shuffle(n))), seeded by "
          "seed; batched and parsed with several calls, the reader "
          "threads draw, where one .shuffle() buffer is drawn from on one "
          "thread.")
      .def_static(
          "from_tensor_slices",
          [](py::dict arrays) {
            return Wrap(Dataset::FromTensorSlices(
                DictToElement(arrays, "from_tensor_slices", Arrays::kView)));
          },
          "arrays"_a,
          "Rows of in-memory arrays (a dict), viewed without a copy: do not "
          "change the arrays while the dataset is used.")
      .def_static(
          "from_tensors",
          [](py::dict arrays) {
            return Wrap(Dataset::FromTensors(
                DictToElement(arrays, "from_tensors", Arrays::kView)));
          },
          "arrays"_a,
          "tf.data's from_tensors: the arrays (a dict) as one element, "
          "viewed without a copy: do not change them while the dataset is "
          "used.")
      .def_static(
          "range",
          [](int64_t start, std::optional<int64_t> stop, int64_t step) {
            if (!stop) return Wrap(Dataset::Range(0, start, step));
            return Wrap(Dataset::Range(start, *stop, step));
          },
          "start"_a, "stop"_a = py::none(), "step"_a = 1,
          "{'value': int64} for range(start, stop, step).")
      .def_static(
          "counter",
          [](int64_t start, int64_t step) {
            return Wrap(Dataset::Counter(start, step));
          },
          "start"_a = 0, "step"_a = 1,
          "tf.data's counter: {'value': int64} for start, start + step, ... "
          "without end.")
      .def_static(
          "random",
          [](const py::object& seed, bool rerandomize_each_iteration) {
            return Wrap(
                Dataset::Random(SeedArg(seed), rerandomize_each_iteration));
          },
          "seed"_a = py::none(), "rerandomize_each_iteration"_a = false,
          "tf.data's random: {'value': int64}, uniform over every int64, "
          "without end; the same seed, the same sequence (recflow's "
          "generator, not TensorFlow's). rerandomize_each_iteration: a new "
          "sequence each epoch under repeat().")
      .def_static(
          "list_files",
          [](py::handle file_pattern, std::optional<bool> shuffle,
             const py::object& seed) {
            return Wrap(Dataset::ListFiles(Paths(file_pattern, "list_files"),
                                           shuffle.value_or(true),
                                           SeedArg(seed)));
          },
          "file_pattern"_a, "shuffle"_a = py::none(), "seed"_a = py::none(),
          "tf.data's list_files: {'filename': bytes}, one per file a "
          "pattern (or list of patterns; glob's *, ? and [...]) matches, "
          "sorted; shuffled each epoch unless shuffle=False. Matching "
          "nothing is a FileNotFoundError. Read them with interleave("
          "lambda e: Dataset.from_tfrecords(e['filename']), ...).")
      .def_static(
          "from_text_lines",
          [](py::handle files, std::optional<std::string> compression,
             int num_parallel_reads, size_t buffer_size,
             uint64_t max_line_bytes) {
            pipeline::PlainFileOptions o =
                PlainFileArgs(compression, num_parallel_reads, buffer_size);
            o.max_line_bytes = max_line_bytes;
            return Wrap(Dataset::FromTextLines(
                records::ExpandRecordPaths(Paths(files, "from_text_lines")),
                o));
          },
          "files"_a, "compression"_a = py::none(), "num_parallel_reads"_a = 1,
          "buffer_size"_a = size_t{256} << 10,
          "max_line_bytes"_a = records::kDefaultMaxRowBytes,
          "tf.data's TextLineDataset: {'line': bytes}, each line of each "
          "file (paths, globs) without its newline and with every '\\r' "
          "removed, as TensorFlow's reader. compression: None takes each "
          "file's from its name (.gz, .zz/.zlib, .zst/.zstd; else none). "
          "num_parallel_reads: files open at once, one line from each in "
          "turn (tf.data's order), each read ahead on a thread of its own. "
          "buffer_size: bytes per read. A line longer than max_line_bytes "
          "(before its newline) is a ValueError that ends its file's "
          "reading, rather than a file without newlines held whole.")
      .def_static(
          "from_fixed_length_records",
          [](py::handle files, uint64_t record_bytes, uint64_t header_bytes,
             uint64_t footer_bytes, std::optional<std::string> compression,
             int num_parallel_reads, size_t buffer_size) {
            return Wrap(Dataset::FromFixedLengthRecords(
                records::ExpandRecordPaths(
                    Paths(files, "from_fixed_length_records")),
                record_bytes, header_bytes, footer_bytes,
                PlainFileArgs(compression, num_parallel_reads, buffer_size)));
          },
          "files"_a, "record_bytes"_a, "header_bytes"_a = 0,
          "footer_bytes"_a = 0, "compression"_a = py::none(),
          "num_parallel_reads"_a = 1, "buffer_size"_a = size_t{256} << 10,
          "tf.data's FixedLengthRecordDataset: {'record': bytes} of "
          "record_bytes each, between each file's header_bytes and "
          "footer_bytes (CIFAR-10's binary files: record_bytes=3073, then "
          "maps.decode_raw). A body that is not whole records is an error "
          "naming the sizes. compression, num_parallel_reads and "
          "buffer_size as from_text_lines'.")
      .def_static(
          "from_csv",
          [](py::handle files, std::string delimiter,
             std::map<std::string, py::object> column_types,
             std::vector<std::string> select_columns,
             std::optional<std::string> compression, uint64_t max_row_bytes) {
            if (delimiter.size() != 1) {
              throw py::value_error("delimiter must be one character");
            }
            if (max_row_bytes == 0) {
              throw py::value_error("max_row_bytes must be at least 1");
            }
            pipeline::CsvOptions o;
            o.delimiter = delimiter[0];
            for (const auto& [name, dtype] : column_types) {
              o.column_types.emplace_back(name, DTypeArg(dtype));
            }
            o.select_columns = std::move(select_columns);
            o.compression = CompressionArg(compression);
            o.max_row_bytes = max_row_bytes;
            return Wrap(Dataset::FromCsv(Paths(files, "from_csv"), o));
          },
          "files"_a, "delimiter"_a = ",",
          "column_types"_a = std::map<std::string, py::object>{},
          "select_columns"_a = std::vector<std::string>{},
          "compression"_a = py::none(),
          "max_row_bytes"_a = records::kDefaultMaxRowBytes,
          "CSV files with a header row: one scalar per column, typed (where "
          "column_types does not say) by the first file's first row, for "
          "every file and every shard. compression: None takes each file's "
          "from its name (.gz, .zz/.zlib, .zst/.zstd; else none). A row "
          "whose cells and delimiters are longer than max_row_bytes is an "
          "error that ends the reading (a quote never closed, or no line "
          "ends). shard() takes whole files when there are as many as "
          "shards.")
      .def_static(
          "zip",
          [](const py::args& args) {
            // zip((a, b)) as tf.data's, or zip(a, b) as TF 2.13's.
            if (args.size() == 1 && (py::isinstance<py::tuple>(args[0]) ||
                                     py::isinstance<py::list>(args[0]))) {
              return Wrap(Dataset::Zip(DatasetsArg(args[0], "zip")));
            }
            return Wrap(Dataset::Zip(DatasetsArg(args, "zip")));
          },
          "zip(a, b, ...) or zip((a, b, ...)): elements whose entries are "
          "those of one element of each dataset (each name must be one "
          "dataset's); ends with the shortest. Shuffles given the same "
          "seed stay aligned, as in tf.data.")
      .def_static(
          "sample_from_datasets",
          [](const py::object& datasets,
             std::optional<std::vector<double>> weights, const py::object& seed,
             bool stop_on_empty_dataset, bool rerandomize_each_iteration) {
            pipeline::SampleOptions o;
            if (weights) o.weights = std::move(*weights);
            o.seed = SeedArg(seed);
            o.stop_on_empty_dataset = stop_on_empty_dataset;
            o.rerandomize_each_iteration = rerandomize_each_iteration;
            return Wrap(Dataset::SampleFromDatasets(
                DatasetsArg(datasets, "sample_from_datasets"), std::move(o)));
          },
          "datasets"_a, "weights"_a = py::none(), "seed"_a = py::none(),
          "stop_on_empty_dataset"_a = false,
          "rerandomize_each_iteration"_a = false,
          "tf.data's sample_from_datasets: each element the next of a "
          "dataset drawn at random with its weight's chance (default: "
          "alike). When the dataset drawn has ended: stop_on_empty_dataset "
          "ends the stream, else the draws go on among those left. Seeded, "
          "the same stream every run; resumable.")
      .def_static(
          "choose_from_datasets",
          [](const py::object& datasets, const PyDataset& choice_dataset,
             bool stop_on_empty_dataset) {
            return Wrap(Dataset::ChooseFromDatasets(
                DatasetsArg(datasets, "choose_from_datasets"),
                choice_dataset.dataset, stop_on_empty_dataset));
          },
          "datasets"_a, "choice_dataset"_a, "stop_on_empty_dataset"_a = true,
          "tf.data's choose_from_datasets: for each element of "
          "choice_dataset (one int64 or int32 scalar i), the next element "
          "of datasets[i]. When the dataset chosen has ended: "
          "stop_on_empty_dataset ends the stream, else the choice is "
          "skipped.")
      .def_static(
          "from_generator",
          [](py::function make) {
            auto holder = KeepAlive(std::move(make));
            pipeline::GeneratorFn gen = [holder]() {
              PythonCall python;
              auto it = KeepAlive(py::iter(Callable(holder)()));
              return std::function<std::optional<Element>()>(
                  [it]() -> std::optional<Element> {
                    PythonCall python;
                    PyObject* next = PyIter_Next(
                        static_cast<PyObject*>(const_cast<void*>(it.get())));
                    if (next == nullptr) {
                      if (PyErr_Occurred()) throw py::error_already_set();
                      return std::nullopt;
                    }
                    py::object value = py::reinterpret_steal<py::object>(next);
                    return DictToElement(value, "a generator's element",
                                         Arrays::kCopyUnlessImmutable);
                  });
            };
            return Wrap(Dataset::FromGenerator(gen, "from_generator"));
          },
          "generator"_a,
          "Elements from generator(), called once per epoch; each element "
          "a dict of arrays (copied where they could change later: a buffer "
          "filled again for each element is safe). Restoring needs the same "
          "elements each call.")
      .def(
          "global_shuffle",
          [](const PyDataset& d, const py::object& seed,
             bool reshuffle_each_iteration) {
            if (!d.tfrecord_paths) {
              throw py::value_error(
                  "global_shuffle() reads records by index, so it applies to "
                  "Dataset.from_tfrecords(...) directly, before any other "
                  "transformation");
            }
            if (d.tfrecord_options.shuffle_buffer_per_file > 0) {
              throw py::value_error(
                  "global_shuffle() draws every record in an order of its "
                  "own: from_tfrecords(shuffle_buffer_per_file=...) would "
                  "be ignored; give one of them");
            }
            pipeline::GlobalShuffleOptions o;
            o.seed = SeedArg(seed);
            o.reshuffle_each_iteration = reshuffle_each_iteration;
            o.verify_checksums = d.tfrecord_options.verify_checksums;
            return Wrap(
                Dataset::FromTFRecordsGlobalShuffle(*d.tfrecord_paths, o));
          },
          "seed"_a = py::none(), "reshuffle_each_iteration"_a = true,
          "Every record once per epoch in a uniform random order, read by "
          "index (FILE.idx, or indexed in memory).")
      .def(
          "map",
          [](const PyDataset& d, py::object fn, int num_parallel_calls,
             bool deterministic, std::optional<std::string> name) {
            pipeline::MapOptions o;
            o.num_parallel_calls = num_parallel_calls;
            o.deterministic = deterministic;
            if (py::isinstance<BuiltinMap>(fn)) {
              const auto& b = fn.cast<const BuiltinMap&>();
              o.name = name.value_or(b.name);
              return Wrap(d.dataset.Map(b.fn, o));
            }
            if (!PyCallable_Check(fn.ptr())) {
              throw py::type_error(
                  "map() takes a recflow.maps function or a callable, not " +
                  TypeName(fn));
            }
            o.name = name.value_or(
                py::str(py::getattr(fn, "__name__", py::str("map")))
                    .cast<std::string>());
            return Wrap(d.dataset.Map(PythonMap(fn, o.name), o));
          },
          "fn"_a, "num_parallel_calls"_a = 1, "deterministic"_a = true,
          "name"_a = py::none(),
          "fn: a recflow.maps function (C++, no GIL) or a Python callable "
          "taking and returning a dict of arrays (runs under the GIL; the "
          "arrays it returns are copied unless it made them or they are its "
          "input's, so a buffer it fills again is safe). "
          "num_parallel_calls: -1 for every thread.")
      .def(
          "filter",
          [](const PyDataset& d, py::function predicate) {
            return Wrap(
                d.dataset.Filter(PythonPredicate(std::move(predicate))));
          },
          "predicate"_a,
          "Keeps the elements for which predicate(dict) is true.")
      .def(
          "take_while",
          [](const PyDataset& d, py::function predicate) {
            return Wrap(
                d.dataset.TakeWhile(PythonPredicate(std::move(predicate))));
          },
          "predicate"_a,
          "tf.data's take_while: the elements before the first for which "
          "predicate(dict) is false; nothing after it is read.")
      .def(
          "unique", [](const PyDataset& d) { return Wrap(d.dataset.Unique()); },
          "tf.data's unique: each distinct element once, where it first "
          "comes; entries of integers or bytes (a float entry is an error). "
          "Every distinct element seen is kept, and saved with the "
          "iterator.")
      .def(
          "scan",
          [](const PyDataset& d, py::handle initial_state,
             py::function scan_func) {
            const std::string name =
                py::str(py::getattr(scan_func, "__name__", py::str("scan")));
            auto holder = KeepAlive(std::move(scan_func));
            return Wrap(d.dataset.Scan(
                DictToElement(initial_state, "scan's initial_state",
                              Arrays::kCopyUnlessImmutable),
                [holder, name](const Element& state, Element e) {
                  PythonCall python;
                  py::object out =
                      Callable(holder)(ElementToDict(state), ElementToDict(e));
                  if (!py::isinstance<py::tuple>(out) || py::len(out) != 2) {
                    throw py::type_error(
                        name +
                        " must return a tuple (new_state, output) of "
                        "dicts, not " +
                        TypeName(out));
                  }
                  auto t = out.cast<py::tuple>();
                  return std::pair<Element, Element>{
                      DictToElement(t[0], "the state " + name + " returned",
                                    Arrays::kCopyUnlessImmutable),
                      DictToElement(t[1], "the output " + name + " returned",
                                    Arrays::kCopyUnlessImmutable)};
                },
                name));
          },
          "initial_state"_a, "scan_func"_a,
          "tf.data's scan: scan_func(state, element) -> (new_state, "
          "output), dicts of arrays; output is the element delivered. The "
          "state keeps initial_state's entries and dtypes (shapes may "
          "change), starts afresh each epoch and is saved with the "
          "iterator.")
      .def(
          "parse",
          [](const PyDataset& d, py::handle spec, int num_parallel_calls,
             bool keep_record, std::string record_key) {
            pipeline::ParseOptions o;
            o.num_parallel_calls = num_parallel_calls;
            o.keep_record = keep_record;
            o.record_key = std::move(record_key);
            return Wrap(d.dataset.Parse(SpecArg(spec), o));
          },
          "spec"_a, "num_parallel_calls"_a = 1, "keep_record"_a = false,
          "record_key"_a = "record",
          "Parses tf.train.Examples with a feature spec (FeatureSpec, dict, "
          "JSON or a path). After batch(): one vectorised parse per batch.")
      .def(
          "parse_sequence",
          [](const PyDataset& d, py::handle context, py::handle sequence,
             int num_parallel_calls, bool keep_record, std::string record_key) {
            pipeline::ParseOptions o;
            o.num_parallel_calls = num_parallel_calls;
            o.keep_record = keep_record;
            o.record_key = std::move(record_key);
            return Wrap(d.dataset.ParseSequence(SpecArg(context),
                                                SpecArg(sequence), o));
          },
          "context"_a, "sequence"_a, "num_parallel_calls"_a = 1,
          "keep_record"_a = false, "record_key"_a = "record",
          "Parses tf.train.SequenceExamples (tf.io.parse_sequence_example): "
          "context features as parse() does; a feature_list of the "
          "sequence spec gives [steps, shape...] (FixedLen) or Ragged "
          "[steps, (values)] (VarLen) per record. After batch(): FixedLen "
          "-> Ragged [batch, (steps), shape...]; VarLen -> NAME, Ragged "
          "[batch, (values)], and NAME/step_lengths, Ragged [batch, "
          "(steps)]. `recflow inspect --sequence --spec` writes both specs.")
      .def(
          "shuffle",
          [](const PyDataset& d, int64_t buffer_size, const py::object& seed,
             bool reshuffle_each_iteration) {
            return Wrap(d.dataset.Shuffle(buffer_size, SeedArg(seed),
                                          reshuffle_each_iteration));
          },
          "buffer_size"_a, "seed"_a = py::none(),
          "reshuffle_each_iteration"_a = true, "tf.data's shuffle.")
      .def(
          "batch",
          [](const PyDataset& d, int64_t batch_size, bool drop_remainder) {
            return Wrap(d.dataset.Batch(batch_size, drop_remainder));
          },
          "batch_size"_a, "drop_remainder"_a = false)
      .def(
          "padded_batch",
          [](const PyDataset& d, int64_t batch_size,
             std::map<std::string, std::vector<int64_t>> padded_shapes,
             std::map<std::string, double> padding_values,
             bool drop_remainder) {
            pipeline::PaddedBatchOptions o;
            o.drop_remainder = drop_remainder;
            o.padded_shapes.assign(padded_shapes.begin(), padded_shapes.end());
            o.padding_values.assign(padding_values.begin(),
                                    padding_values.end());
            return Wrap(d.dataset.PaddedBatch(batch_size, o));
          },
          "batch_size"_a,
          "padded_shapes"_a = std::map<std::string, std::vector<int64_t>>{},
          "padding_values"_a = std::map<std::string, double>{},
          "drop_remainder"_a = false)
      .def(
          "bucket_by_sequence_length",
          [](const PyDataset& d, const py::object& element_length_func,
             std::vector<int64_t> bucket_boundaries,
             std::vector<int64_t> bucket_batch_sizes,
             std::map<std::string, std::vector<int64_t>> padded_shapes,
             std::map<std::string, double> padding_values,
             bool pad_to_bucket_boundary, bool no_padding,
             bool drop_remainder) {
            pipeline::BucketOptions o;
            o.bucket_boundaries = std::move(bucket_boundaries);
            o.bucket_batch_sizes = std::move(bucket_batch_sizes);
            o.padded_shapes.assign(padded_shapes.begin(), padded_shapes.end());
            o.padding_values.assign(padding_values.begin(),
                                    padding_values.end());
            o.pad_to_bucket_boundary = pad_to_bucket_boundary;
            o.no_padding = no_padding;
            o.drop_remainder = drop_remainder;
            if (py::isinstance<py::str>(element_length_func)) {
              return Wrap(d.dataset.BucketBySequenceLength(
                  element_length_func.cast<std::string>(), std::move(o)));
            }
            if (!PyCallable_Check(element_length_func.ptr())) {
              throw py::type_error(
                  "element_length_func must be a function of the element or "
                  "the name of an entry, not " +
                  TypeName(element_length_func));
            }
            auto holder = KeepAlive(element_length_func);
            return Wrap(d.dataset.BucketBySequenceLength(
                [holder](const Element& e) -> int64_t {
                  PythonCall python;
                  return IntResult(Callable(holder)(ElementToDict(e)),
                                   "element_length_func");
                },
                std::move(o)));
          },
          "element_length_func"_a, "bucket_boundaries"_a,
          "bucket_batch_sizes"_a,
          "padded_shapes"_a = std::map<std::string, std::vector<int64_t>>{},
          "padding_values"_a = std::map<std::string, double>{},
          "pad_to_bucket_boundary"_a = false, "no_padding"_a = false,
          "drop_remainder"_a = false,
          "tf.data's bucket_by_sequence_length: elements batched (padded) "
          "with others of a length in the same bucket. element_length_func: "
          "a function of the element, or the name of an entry (its first "
          "dimension; a bytes value: its size). pad_to_bucket_boundary pads "
          "the dimensions padded_shapes gives as -1 to the bucket's "
          "boundary - 1.")
      .def(
          "group_by_window",
          [](const PyDataset& d, const py::object& key_func,
             std::optional<int64_t> window_size,
             const py::object& window_size_func, bool drop_remainder) {
            pipeline::GroupOptions o;
            o.drop_remainder = drop_remainder;
            Dataset::KeyFn key = KeyArg(key_func, "key_func", &o.key_name);
            if (window_size.has_value() == !window_size_func.is_none()) {
              throw py::value_error(
                  "group_by_window() takes one of window_size and "
                  "window_size_func");
            }
            if (window_size) {
              return Wrap(
                  d.dataset.GroupByWindow(std::move(key), *window_size, o));
            }
            if (!PyCallable_Check(window_size_func.ptr())) {
              throw py::type_error("window_size_func must be a function, not " +
                                   TypeName(window_size_func));
            }
            o.window_size_name = py::str(py::getattr(
                window_size_func, "__name__", py::str("window_size_func")));
            return Wrap(d.dataset.GroupByWindow(
                std::move(key),
                [holder = KeepAlive(window_size_func)](int64_t k) {
                  PythonCall python;
                  return IntResult(Callable(holder)(k), "window_size_func");
                },
                o));
          },
          "key_func"_a, "window_size"_a = py::none(),
          "window_size_func"_a = py::none(), "drop_remainder"_a = false,
          "tf.data's group_by_window, each window batched (tf.data's "
          "reduce_func=lambda key, w: w.batch(window_size)): elements "
          "grouped by key_func (a function of the element returning an int, "
          "or the name of an integer entry); a group delivered when it "
          "holds window_size (or window_size_func(key)) elements; at the end "
          "the groups left, part-full, in key order unless drop_remainder.")
      .def(
          "ragged_batch",
          [](const PyDataset& d, int64_t batch_size, bool drop_remainder) {
            return Wrap(d.dataset.RaggedBatch(batch_size, drop_remainder));
          },
          "batch_size"_a, "drop_remainder"_a = false,
          "tf.data's ragged_batch: as batch, but entries of rank >= 1 become "
          "recflow.Ragged (rows of their own lengths; the rest of the shape "
          "must agree); scalars batch dense.")
      .def("unbatch",
           [](const PyDataset& d) { return Wrap(d.dataset.Unbatch()); })
      .def(
          "rebatch",
          [](const PyDataset& d, const py::object& batch_size,
             bool drop_remainder) {
            std::vector<int64_t> sizes;
            if (PyIndex_Check(batch_size.ptr()) &&
                !PyBool_Check(batch_size.ptr())) {
              sizes.push_back(batch_size.cast<int64_t>());
            } else {
              for (py::handle n : py::iter(batch_size)) {
                sizes.push_back(n.cast<int64_t>());
              }
            }
            return Wrap(d.dataset.Rebatch(std::move(sizes), drop_remainder));
          },
          "batch_size"_a, "drop_remainder"_a = false,
          "tf.data's rebatch: the rows of the batches in batches of "
          "batch_size (an int, or a list cycled through), as "
          "unbatch().batch(n) with one copy (none when a batch passes "
          "whole).")
      .def(
          "window",
          [](const PyDataset& d, int64_t size, std::optional<int64_t> shift,
             int64_t stride, bool drop_remainder) {
            pipeline::WindowOptions o;
            o.shift = shift.value_or(size);
            o.stride = stride;
            o.drop_remainder = drop_remainder;
            // (shift 0 means "size" in C++; here None does.  A size of 0
            // is refused by name below, not as the shift it stands for.)
            if (shift == 0) {
              throw py::value_error("window(): shift must be positive, not 0");
            }
            return Wrap(d.dataset.Window(size, o));
          },
          "size"_a, "shift"_a = py::none(), "stride"_a = 1,
          "drop_remainder"_a = false,
          "tf.data's window, each window batched (tf.data's "
          "window(...).flat_map(lambda w: w.batch(size)) for each entry): "
          "window k holds elements k*shift, k*shift + stride, ... (shift "
          "None: size); without drop_remainder the windows that run past the "
          "end come shorter.")
      .def(
          "repeat",
          [](const PyDataset& d, std::optional<int64_t> count) {
            return Wrap(d.dataset.Repeat(count.value_or(-1)));
          },
          "count"_a = py::none(), "count None: forever.")
      .def(
          "take",
          [](const PyDataset& d, int64_t n) { return Wrap(d.dataset.Take(n)); },
          "count"_a)
      .def(
          "rejection_resample",
          [](const PyDataset& d, const py::object& class_func,
             std::vector<double> target_dist,
             std::optional<std::vector<double>> initial_dist,
             const py::object& seed) {
            pipeline::ResampleOptions o;
            Dataset::KeyFn classes =
                KeyArg(class_func, "class_func", &o.class_name);
            o.target_dist = std::move(target_dist);
            if (initial_dist) o.initial_dist = std::move(*initial_dist);
            o.seed = SeedArg(seed);
            return Wrap(
                d.dataset.RejectionResample(std::move(classes), std::move(o)));
          },
          "class_func"_a, "target_dist"_a, "initial_dist"_a = py::none(),
          "seed"_a = py::none(),
          "tf.data's rejection_resample: elements dropped so that their "
          "classes (class_func: a function of the element returning an int "
          "in [0, len(target_dist)), or the name of an integer entry) come "
          "with target_dist; initial_dist None: estimated as elements come. "
          "Yields the elements themselves, where tf.data yields (class, "
          "element) pairs.")
      .def(
          "assert_cardinality",
          [](const PyDataset& d, int64_t expected_cardinality) {
            return Wrap(d.dataset.AssertCardinality(expected_cardinality));
          },
          "expected_cardinality"_a,
          "tf.data's assert_cardinality: cardinality() becomes "
          "expected_cardinality (or recflow.INFINITE_CARDINALITY); an error "
          "when the input turns out to hold more elements (on the first too "
          "many, naming its file and record) or fewer (at its end).")
      .def(
          "skip",
          [](const PyDataset& d, int64_t n) { return Wrap(d.dataset.Skip(n)); },
          "count"_a)
      .def(
          "shard",
          [](const PyDataset& d, int64_t num_shards, int64_t index) {
            return Wrap(d.dataset.Shard(num_shards, index));
          },
          "num_shards"_a, "index"_a,
          "Element i where i % num_shards == index; whole files on a TFRecord "
          "source with at least num_shards files (tf.data's AUTO policy).")
      .def(
          "interleave",
          [](const PyDataset& d, py::function fn, int64_t cycle_length,
             int64_t block_length, int num_parallel_calls, bool deterministic,
             int64_t buffer_output_elements) {
            pipeline::InterleaveOptions o;
            o.block_length = block_length;
            o.num_parallel_calls = num_parallel_calls;
            o.deterministic = deterministic;
            o.buffer_output_elements = buffer_output_elements;
            return Wrap(d.dataset.Interleave(
                PythonInterleaveFn(std::move(fn), "interleave"), cycle_length,
                std::move(o)));
          },
          "fn"_a, "cycle_length"_a = pipeline::kAutotune, "block_length"_a = 1,
          "num_parallel_calls"_a = 1, "deterministic"_a = true,
          "buffer_output_elements"_a = pipeline::kAutotune,
          "fn(element dict) -> Dataset; cycle_length of them at once "
          "(default recflow.AUTOTUNE: one per core, as tf.data's), their "
          "elements interleaved block_length at a time. num_parallel_calls "
          "> 1 (or AUTOTUNE: cycle_length): each open dataset read ahead on "
          "a thread of its own, up to buffer_output_elements elements "
          "(AUTOTUNE: 1,024 and 256 MiB / cycle_length), in the same order "
          "unless deterministic=False, which takes an element another "
          "dataset has ready when the one whose turn it is has none.")
      .def(
          "flat_map",
          [](const PyDataset& d, py::function fn) {
            return Wrap(d.dataset.FlatMap(
                PythonInterleaveFn(std::move(fn), "flat_map")));
          },
          "fn"_a,
          "fn(element dict) -> Dataset; their elements one dataset after "
          "another (tf.data's flat_map: interleave with cycle_length 1).")
      .def(
          "prefetch",
          [](const PyDataset& d, int64_t buffer_size, uint64_t max_bytes) {
            return Wrap(d.dataset.Prefetch(buffer_size, max_bytes));
          },
          "buffer_size"_a, "max_bytes"_a = 0,
          "Runs the pipeline ahead on a thread of its own, at most "
          "buffer_size elements (and max_bytes, 0: no byte bound) ahead. "
          "buffer_size=recflow.AUTOTUNE (-1), as tf.data.AUTOTUNE: the "
          "depth starts at one element and doubles while the consumer "
          "runs the buffer dry after bursts, up to 64 elements and "
          "max_bytes (256 MiB when 0).")
      .def(
          "cache",
          [](const PyDataset& d, std::string filename) {
            return Wrap(d.dataset.Cache(filename));
          },
          "filename"_a = "",
          "Keeps the first pass in memory, or in a file read by later runs.")
      .def(
          "ignore_errors",
          [](const PyDataset& d) { return Wrap(d.dataset.IgnoreErrors()); },
          "Skips elements whose production fails, counting them.")
      .def(
          "concatenate",
          [](const PyDataset& d, const PyDataset& other) {
            return Wrap(d.dataset.Concatenate(other.dataset));
          },
          "other"_a,
          "This dataset's elements, then other's (with the same names).")
      .def(
          "enumerate",
          [](const PyDataset& d, int64_t start, std::string name) {
            return Wrap(d.dataset.Enumerate(start, std::move(name)));
          },
          "start"_a = 0, "name"_a = "index",
          "Adds an int64 entry `name`: start, start + 1, ... (tf.data's "
          "enumerate, as a named entry).")
      .def("iterator", &MakePyIterator, "threads"_a = 0, "optimize"_a = true,
           "An iterator on `threads` threads (0: every core).")
      .def("__iter__",
           [](const PyDataset& d) { return MakePyIterator(d, 0, true); })
      .def(
          "restore",
          [](const PyDataset& d, py::bytes state, int threads) {
            auto it = MakePyIterator(d, threads, true);
            it->Restore(std::string(state));
            return it;
          },
          "state"_a, "threads"_a = 0,
          "An iterator continuing from `state` (Iterator.save()).")
      .def(
          "apply",
          [](const py::object& self, const py::function& transformation_func) {
            return transformation_func(self);
          },
          "transformation_func"_a,
          "tf.data's apply: transformation_func(self), for chaining a "
          "function of a whole dataset.")
      .def(
          "reduce",
          [](const py::object& self, py::object initial_state,
             const py::function& reduce_func) {
            py::object state = std::move(initial_state);
            for (py::handle e : py::iter(self)) {
              state = reduce_func(state, e);
            }
            return state;
          },
          "initial_state"_a, "reduce_func"_a,
          "tf.data's reduce: reduce_func(state, element) over one iteration, "
          "from initial_state; returns the last state.")
      .def(
          "as_numpy_iterator",
          [](const py::object& self) { return py::iter(self); },
          "tf.data's as_numpy_iterator: an iteration, its entries already "
          "numpy arrays.")
      .def(
          "get_single_element",
          [](const py::object& self) {
            py::iterator it = py::iter(self);
            if (it == py::iterator::sentinel()) {
              throw py::value_error(
                  "get_single_element(): the dataset is empty; it must have "
                  "exactly one element");
            }
            py::object first = py::reinterpret_borrow<py::object>(*it);
            if (++it != py::iterator::sentinel()) {
              throw py::value_error(
                  "get_single_element(): the dataset has more than one "
                  "element; it must have exactly one");
            }
            return first;
          },
          "tf.data's get_single_element: the one element of the dataset; "
          "ValueError when it has none or more.")
      .def(
          "write_tfrecords",
          [](const PyDataset& d, std::string output, uint64_t shards,
             bool index, std::string compression, int level, bool skip_bad,
             int threads, std::optional<std::string> record_key,
             uint64_t max_record_bytes) {
            convert::ConvertJob job =
                OutputJob(std::move(output), shards, index, compression, level,
                          skip_bad, max_record_bytes);
            convert::DatasetRecords records;
            records.threads = ThreadsArg(threads, "write_tfrecords()");
            records.record_key = record_key.value_or("");
            if (record_key && record_key->empty()) {
              throw py::value_error(
                  "record_key must name an entry (None: write Examples)");
            }
            return SummaryDict(RunInterruptibly([&](auto progress) {
              job.progress = std::move(progress);
              return convert::ConvertDataset(d.dataset, records, job);
            }));
          },
          "output"_a, "shards"_a = 1, "index"_a = false,
          "compression"_a = "none", "level"_a = 0, "skip_bad"_a = false,
          "threads"_a = 0, "record_key"_a = py::none(),
          "max_record_bytes"_a = records::kDefaultMaxRecordBytes,
          "Runs the dataset once and writes its elements as sharded "
          "TFRecords (OUTPUT-00000-of-0000N.tfrecord, as recflow.convert): "
          "each element a tf.train.Example of its entries (float32/float64 "
          "-> float_list, integers -> int64_list, bytes -> bytes_list, "
          "values flattened), or with record_key the bytes of that entry "
          "as the record itself (from_tfrecords(...).shuffle(...) with "
          "record_key='record' reshards). All shards appear together or "
          "none does; returns a summary dict.")
      .def(
          "save",
          [](const PyDataset& d, py::handle path, uint64_t shards,
             std::string compression, int level, int threads) {
            if (shards == 0) throw py::value_error("shards must be at least 1");
            convert::SaveOptions o;
            o.shards = shards;
            o.compression = *CompressionArg(compression);
            o.level = level;
            o.threads = ThreadsArg(threads, "save()");
            const std::string directory = Paths(path, "save").at(0);
            return SummaryDict(RunInterruptibly([&](auto progress) {
              o.progress = std::move(progress);
              return convert::SaveDataset(d.dataset, directory, o);
            }));
          },
          "path"_a, "shards"_a = 1, "compression"_a = "none", "level"_a = 0,
          "threads"_a = 0,
          "tf.data's save: runs the dataset once and keeps its elements "
          "exactly (entries, dtypes, shapes, Ragged) in the directory path: "
          "elements-00000-of-0000N.tfrecord shards with indexes, then "
          "dataset.json (the count, the shards). A directory that already "
          "holds one is refused. Dataset.load reads it back.")
      .def_static(
          "load",
          [](py::handle path, int num_parallel_reads, int num_parallel_calls,
             bool shuffle_files, const py::object& seed, bool global_shuffle,
             bool reshuffle_each_iteration) {
            convert::LoadOptions o;
            o.num_parallel_calls = num_parallel_calls;
            if (global_shuffle) {
              if (shuffle_files || num_parallel_reads != 1) {
                throw py::value_error(
                    "load(global_shuffle=True) reads by index: "
                    "shuffle_files and num_parallel_reads do not apply");
              }
              o.global_shuffle = pipeline::GlobalShuffleOptions{
                  .seed = SeedArg(seed),
                  .reshuffle_each_iteration = reshuffle_each_iteration};
            } else {
              o.reading.num_parallel_reads = num_parallel_reads;
              o.reading.shuffle_files = shuffle_files;
              o.reading.seed = SeedArg(seed);
              o.reading.reshuffle_each_iteration = reshuffle_each_iteration;
            }
            std::string directory = Paths(path, "load").at(0);
            std::optional<pipeline::Dataset> loaded;
            {
              py::gil_scoped_release release;  // a global shuffle indexes
              loaded.emplace(convert::LoadDataset(directory, o));
            }
            return Wrap(std::move(*loaded));
          },
          "path"_a, "num_parallel_reads"_a = 1, "num_parallel_calls"_a = 1,
          "shuffle_files"_a = false, "seed"_a = py::none(),
          "global_shuffle"_a = false, "reshuffle_each_iteration"_a = true,
          "tf.data's load: the elements Dataset.save kept in path, each "
          "shard in the order saved (num_parallel_reads shards interleaved; "
          "shuffle_files: in a new order each epoch), decoded on "
          "num_parallel_calls threads; global_shuffle: every element once "
          "per epoch in a uniform random order (seed), read by the indexes "
          "saved. cardinality() is the count saved, "
          "checked as they are read: a shard cut short is an error, never "
          "fewer elements.")
      .def(
          "cardinality",
          [](const PyDataset& d) { return d.dataset.Cardinality(); },
          "tf.data's cardinality: the elements one iteration gives where "
          "that is known without running it, else "
          "recflow.INFINITE_CARDINALITY (-1) or recflow.UNKNOWN_CARDINALITY "
          "(-2).")
      .def(
          "__len__",
          [](const PyDataset& d) {
            const int64_t n = d.dataset.Cardinality();
            if (n == pipeline::kInfiniteCardinality) {
              throw py::type_error("The dataset is infinite.");
            }
            if (n < 0) throw py::type_error("The dataset length is unknown.");
            return n;
          },
          "The cardinality where it is a count; else TypeError, as tf.data.")
      // With __len__ defined, truth would call it (and raise for unknown
      // lengths); a dataset is always true, as tf.data's.
      .def("__bool__", [](const PyDataset&) { return true; })
      .def("describe", [](const PyDataset& d) { return d.dataset.Describe(); })
      .def("__repr__", [](const PyDataset& d) {
        return "<recflow.Dataset " + d.dataset.Describe() + ">";
      });

  // --- Records ---
  py::class_<PyExample>(m, "Example", R"doc(
A tf.train.Example. Example({"label": 7, "image": b"...", "x": [1.0, 2.0]})
builds one (int -> int64_list, float -> float_list, bytes/str ->
bytes_list; lists and numpy arrays by their dtype); Example.from_bytes(b)
reads one; to_dict() gives {name: int64/float32 array or list of bytes}.
)doc")
      .def(
          py::init([](py::dict features) { return ExampleFromDict(features); }),
          "features"_a = py::dict())
      .def_static(
          "from_bytes",
          [](py::bytes data) {
            PyExample e{std::string(data)};
            ParseExample(e.serialized);
            return e;
          },
          "data"_a)
      .def("to_dict", &ExampleToDict)
      .def("serialize",
           [](const PyExample& e) { return py::bytes(e.serialized); })
      .def("__bytes__",
           [](const PyExample& e) { return py::bytes(e.serialized); })
      .def("__eq__",
           [](const PyExample& a, const PyExample& b) {
             return google::protobuf::util::MessageDifferencer::Equals(
                 ParseExample(a.serialized), ParseExample(b.serialized));
           })
      .def("__repr__", [](const PyExample& e) {
        return "Example(" + py::repr(ExampleToDict(e)).cast<std::string>() +
               ")";
      });

  py::class_<PyWriter>(m, "TFRecordWriter", R"doc(
Writes a TFRecord file exactly as TensorFlow does (ZLIB, GZIP; ZSTD is
recflow's own). The file appears under its name only when close() (or the
end of a `with` block without an exception) succeeds; an error or an
exception leaves nothing behind. compression None: from the name's suffix
(.gz, .zz, .zst). index: write PATH.idx (uncompressed and ZSTD only).
)doc")
      .def(py::init<std::string, std::optional<std::string>, int, bool>(),
           "path"_a, "compression"_a = py::none(), "level"_a = 0,
           "index"_a = false)
      .def("write", &PyWriter::Write, "record"_a,
           "Appends a record (bytes or recflow.Example).")
      .def("flush", &PyWriter::Flush)
      .def("close", &PyWriter::Close)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](PyWriter& w, py::handle type, py::handle, py::handle) {
             if (type.is_none()) {
               w.Close();
             } else {
               w.Abort();
             }
           })
      .def_property_readonly("path", &PyWriter::path)
      .def_property_readonly("records", &PyWriter::records)
      .def_property_readonly("closed", &PyWriter::closed);

  py::class_<PyRecordIterator>(m, "TFRecordIterator")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", &PyRecordIterator::Next);

  py::class_<PyDataSource>(m, "TFRecordDataSource", R"doc(
Random access to the records of TFRecord files: a map-style dataset.

    src = recflow.TFRecordDataSource("data/train-*.tfrecord", spec=spec)
    len(src)            # every record of every file
    src[17]             # one record: a dict of arrays (bytes without a spec)
    src[[3, 99, 4]]     # a batch: one read of all, one vectorised parse
    src[100:356]        # the same for a slice

files: paths, globs or directories, taken one after another (record i is
the i-th of all). Each file is read through its index (FILE.idx, which
`recflow index` and recflow.index() write); a file without one is indexed
in memory once, by reading it, when the source is made. Uncompressed and
recflow's ZSTD files only: GZIP and ZLIB streams cannot be read at an
offset. spec: as Dataset.parse takes it; records are then parsed into
dicts of arrays (as .batch(n).parse(spec) gives them for a batch); None:
records are bytes (a list of them for a batch).
Both CRCs are checked on every read; a damaged record is a RecordError
naming the file, offset and record. Reads run without the GIL; the source
may be used from several threads, and by DataLoader worker processes
(pickled as its files and spec).
)doc")
      .def(py::init<py::handle, py::handle>(), "files"_a, "spec"_a = py::none())
      .def("__len__", &PyDataSource::size)
      .def("__getitem__", &PyDataSource::GetItem, "index"_a)
      .def("locate", &PyDataSource::Locate, "index"_a,
           "(file, record number in that file, byte offset of its frame) of "
           "record `index`.")
      .def_property_readonly(
          "files", [](const PyDataSource& s) { return s.source().files(); })
      .def_property_readonly("spec",
                             [](const PyDataSource& s) -> py::object {
                               if (!s.source().spec()) return py::none();
                               return py::cast(*s.source().spec());
                             })
      .def("__repr__",
           [](const PyDataSource& s) {
             return fmt::format(
                 "<recflow.TFRecordDataSource: {} records in {} files{}>",
                 s.size(), s.source().files().size(),
                 s.source().spec() ? ", parsed" : "");
           })
      .def(py::pickle(
          [](const PyDataSource& s) {
            py::object spec = py::none();
            if (s.source().spec())
              spec = py::str(s.source().spec()->ToJson().dump());
            return py::make_tuple(s.source().files(), spec);
          },
          [](py::tuple t) {
            if (t.size() != 2)
              throw py::value_error("bad TFRecordDataSource state");
            return PyDataSource(t[0], t[1]);
          }));

  m.def(
      "tfrecord_iterator",
      [](py::handle path, std::optional<std::string> compression,
         bool verify_checksums, uint64_t max_record_bytes) {
        return std::make_unique<PyRecordIterator>(
            Paths(path, "tfrecord_iterator").at(0),
            ReaderArgs(compression, verify_checksums, max_record_bytes));
      },
      "path"_a, "compression"_a = py::none(), "verify_checksums"_a = true,
      "max_record_bytes"_a = records::kDefaultMaxRecordBytes,
      "The records of one file as bytes, both CRCs checked "
      "(tf.compat.v1.io.tf_record_iterator).");

  m.def(
      "count",
      [](py::handle paths, std::optional<std::string> compression,
         int threads) {
        uint64_t total = 0;
        for (const auto& [file, records] :
             ScanFiles(paths, "count", compression, threads)) {
          total += records;
        }
        return total;
      },
      "paths"_a, "compression"_a = py::none(), "threads"_a = 0,
      "The number of records in the files (CRCs checked), as `recflow "
      "count`.");

  m.def(
      "verify",
      [](py::handle paths, std::optional<std::string> compression,
         int threads) {
        py::dict out;
        for (const auto& [file, records] :
             ScanFiles(paths, "verify", compression, threads,
                       /*check_indexes=*/true)) {
          out[py::str(file)] = records;
        }
        return out;
      },
      "paths"_a, "compression"_a = py::none(), "threads"_a = 0,
      "Reads every record checking both CRCs, and the index beside a file "
      "(FILE.idx) against its records, as `recflow verify`: {path: "
      "records}; raises RecordError naming the file, offset and record of "
      "the first damage, ValueError for an index that is not the file's.");

  m.def(
      "index",
      [](py::handle paths) {
        std::vector<std::string> files =
            records::ExpandRecordPaths(Paths(paths, "index"));
        std::vector<std::string> written;
        py::gil_scoped_release release;
        for (const std::string& f : files) {
          records::Index index = records::BuildIndex(f);
          written.push_back(records::IndexPathFor(f));
          records::WriteIndex(written.back(), index);
        }
        return written;
      },
      "paths"_a,
      "Writes FILE.idx (DALI's format; recflow's for ZSTD) beside each "
      "file; returns their paths.");

  m.def(
      "convert",
      [](std::string format, py::handle inputs, std::string output,
         uint64_t shards, bool index, std::string compression, int level,
         bool skip_bad, int threads, std::optional<std::string> images,
         std::optional<std::string> labels, py::handle spec,
         std::string delimiter, uint64_t max_record_bytes,
         uint64_t max_row_bytes) {
        convert::ConvertJob job =
            OutputJob(std::move(output), shards, index, compression, level,
                      skip_bad, max_record_bytes);
        if (delimiter.size() != 1) {
          throw py::value_error("delimiter must be one character");
        }
        if (delimiter != "," && format != "csv") {
          throw py::value_error("delimiter is for csv, not " + format);
        }
        job.inputs.delimiter = delimiter[0];
        if (max_row_bytes == 0) {
          throw py::value_error("max_row_bytes must be at least 1");
        }
        if (max_row_bytes != records::kDefaultMaxRowBytes && format != "csv" &&
            format != "jsonl") {
          throw py::value_error("max_row_bytes is for csv and jsonl, not " +
                                format);
        }
        job.inputs.max_row_bytes = max_row_bytes;
        job.format = std::move(format);
        if (!inputs.is_none()) job.inputs.files = Paths(inputs, "convert");
        job.inputs.images = images.value_or("");
        job.inputs.labels = labels.value_or("");
        std::optional<records::FeatureSpec> feature_spec;
        if (!spec.is_none()) {
          feature_spec = SpecArg(spec);
          job.inputs.spec = &*feature_spec;
        }
        job.threads = ThreadsArg(threads, "convert");
        return SummaryDict(RunInterruptibly([&](auto progress) {
          job.progress = std::move(progress);
          return convert::Convert(job);
        }));
      },
      "format"_a, "inputs"_a, "output"_a, "shards"_a = 1, "index"_a = false,
      "compression"_a = "none", "level"_a = 0, "skip_bad"_a = false,
      "threads"_a = 0, "images"_a = py::none(), "labels"_a = py::none(),
      "spec"_a = py::none(), "delimiter"_a = ",",
      "max_record_bytes"_a = records::kDefaultMaxRecordBytes,
      "max_row_bytes"_a = records::kDefaultMaxRowBytes,
      "Converts csv, jsonl, npy, npz, idx (images=, labels=) or images (a "
      "folder per class) into sharded TFRecords of Examples, as `recflow "
      "convert`; returns a summary dict. All shards appear together or "
      "none does.");

  m.def("_export_dlpack", &ExportDlpack, "array"_a,
        "A DLPack capsule viewing a numpy array (recflow.Array.__dlpack__).");
}

}  // namespace recflow::python
