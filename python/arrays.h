// Between recflow's tensors and Python: numpy arrays that share memory
// with a pipeline::Tensor, tensors that view numpy arrays, and DLPack
// export, for the extension module (module.cc).  Internal to python/.
//
// Lifetimes: an array made by ToPython keeps a copy of the Tensor (and so
// its storage) alive through its base object; a Tensor made by
// TensorFromPython keeps the numpy array alive through its owner, which
// takes the GIL to let go of it, so such tensors may die on any thread.
//
// Every function here needs the GIL, except that the owners may be
// released without it.
#ifndef RECFLOW_PYTHON_ARRAYS_H_
#define RECFLOW_PYTHON_ARRAYS_H_

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <optional>
#include <string>

#include "pipeline/tensor.h"

namespace recflow::python {

namespace py = pybind11;

// The name of `object`'s type, for error messages ("int", "list").
std::string TypeName(py::handle object);

// An int (or numpy integer, such as a uint64 array's max()) as int64; one
// outside int64 is a py::value_error naming `what` and the value (never a
// wrapped value).
int64_t Int64FromPython(py::handle value, const std::string& what);

// Holds a reference to `object` that may be dropped on any thread: the
// deleter takes the GIL (and leaks the reference once the interpreter is
// exiting, when it may no longer be taken).
std::shared_ptr<const void> KeepAlive(py::object object);

// Held by a thread of the pipeline while it runs Python code (a map,
// filter, interleave or generator function): takes the GIL, or throws
// pipeline::Error once Python is exiting (the exit gate below is closed),
// never asking for the GIL then: Python 3.11 ends such a thread with
// pthread_exit, whose unwinding through oneTBB's catch (...) aborted the
// process ("FATAL: exception not rethrown") when a program exited with a
// Python map still running.  Destroy Python objects before it.
class PythonCall {
 public:
  PythonCall();
  ~PythonCall();
  PythonCall(const PythonCall&) = delete;
  PythonCall& operator=(const PythonCall&) = delete;

 private:
  std::optional<py::gil_scoped_acquire> gil_;
};

// Called once from an atexit handler, with the GIL: from then on the
// deleters above (and DLPack's) leak instead of taking the GIL and
// PythonCall throws, and this returns when the threads already inside
// (dropping a reference, running a Python function) are done, or after
// 5 s (a Python function that runs longer does not hold the exit).
void CloseExitGate();

// A numeric tensor as a read-only recflow.Array (a numpy.ndarray subclass
// with __dlpack__) viewing its storage; a bytes tensor as a read-only
// numpy object array of bytes (copied: Python bytes own their memory); a
// ragged tensor as recflow.Ragged(values, row_lengths).
py::object ToPython(const pipeline::Tensor& tensor);

// An element as a dict {name: ToPython(tensor)} in the element's order.
py::dict ElementToDict(const pipeline::Element& element);

// A value as a tensor: a numpy array of a supported numeric dtype (viewed
// without a copy when C-contiguous, else copied), bool (as uint8), an
// array of bytes/str objects, bytes, str, int (int64), float (float32, as
// tf.data makes Python floats), lists of those, or recflow.Ragged.
// Throws py::type_error naming `what` for anything else (a list mixing
// numbers and bytes/str included), py::value_error for an int outside
// int64.
//
// `arrays` says whether a numpy array given is viewed or copied:
enum class Arrays {
  // Viewed as it is (from_tensor_slices, from_tensors, which document it:
  // the arrays must not change while the dataset is used).
  kView,
  // Viewed only where nothing can change it: the memory of a recflow
  // tensor (immutable; a map that returns its input's arrays), or an
  // array made here (from a list, a dtype or layout converted); any other
  // is copied, as tf.data copies what a py_function returns.  For what
  // Python functions return: a map or generator that fills one buffer
  // again for each element would otherwise change the elements it gave
  // before, batched or buffered, silently.
  kCopyUnlessImmutable,
};
pipeline::Tensor TensorFromPython(py::handle value, const std::string& what,
                                  Arrays arrays);

// A dict {name: value} as an element (TensorFromPython per value).
pipeline::Element DictToElement(py::handle dict, const std::string& what,
                                Arrays arrays);

// A DLPack capsule ("dltensor") viewing `array` (any numpy array of a
// numeric dtype, read-only or not), keeping it alive until the consumer
// calls the deleter.  What recflow.Array.__dlpack__ returns.
py::capsule ExportDlpack(py::array array);

}  // namespace recflow::python

#endif  // RECFLOW_PYTHON_ARRAYS_H_
