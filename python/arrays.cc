#include "python/arrays.h"

#include <dlpack/dlpack.h>
#include <fmt/format.h>
#include <pybind11/stl.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <vector>

namespace recflow::python {
namespace {

using pipeline::DType;
using pipeline::Tensor;
using npy = py::detail::npy_api;

// The Python classes of recflow/_array.py, imported once and kept for the
// life of the process (never released: they outlive every array).
PyObject* PythonClass(const char* name) {
  return py::object(py::module_::import("recflow._array").attr(name))
      .release()
      .ptr();
}
PyObject* ArrayClass() {
  static PyObject* const cls = PythonClass("Array");
  return cls;
}
PyObject* RaggedClass() {
  static PyObject* const cls = PythonClass("Ragged");
  return cls;
}

int NumpyType(DType d) {
  switch (d) {
    case DType::kFloat32:
      return npy::NPY_FLOAT_;
    case DType::kFloat64:
      return npy::NPY_DOUBLE_;
    case DType::kInt32:
      return npy::NPY_INT32_;
    case DType::kInt64:
      return npy::NPY_INT64_;
    case DType::kUInt8:
      return npy::NPY_UINT8_;
    case DType::kBytes:
      break;
  }
  throw std::logic_error("bytes has no numpy number type");
}

// The recflow dtype of a numpy dtype, if it is one we hold.
std::optional<DType> FromNumpy(const py::dtype& dt) {
  const char kind = dt.kind();
  const auto size = dt.itemsize();
  if (kind == 'f' && size == 4) return DType::kFloat32;
  if (kind == 'f' && size == 8) return DType::kFloat64;
  if (kind == 'i' && size == 4) return DType::kInt32;
  if (kind == 'i' && size == 8) return DType::kInt64;
  if (kind == 'u' && size == 1) return DType::kUInt8;
  return std::nullopt;
}

// The name of the capsule that keeps an array's tensor (NumericArray).
constexpr const char* kTensorCapsule = "recflow.Tensor";

// The recflow tensor behind `array`: the capsule at the end of its chain
// of bases (a view's base is the array it views), or null when the memory
// was not handed out by NumericArray.
const Tensor* TensorBehind(py::handle array) {
  py::object o = py::reinterpret_borrow<py::object>(array);
  for (int depth = 0; depth < 64 && !o.is_none(); ++depth) {
    if (PyCapsule_CheckExact(o.ptr())) {
      if (!PyCapsule_IsValid(o.ptr(), kTensorCapsule)) return nullptr;
      return static_cast<const Tensor*>(
          PyCapsule_GetPointer(o.ptr(), kTensorCapsule));
    }
    if (!py::hasattr(o, "base")) return nullptr;
    o = o.attr("base");
  }
  return nullptr;
}

py::object NumericArray(const Tensor& t) {
  auto& api = npy::get();
  const int rank = t.shape().rank();
  std::vector<Py_intptr_t> dims(rank), strides(rank);
  Py_intptr_t stride = static_cast<Py_intptr_t>(pipeline::DTypeSize(t.dtype()));
  for (int i = rank - 1; i >= 0; --i) {
    dims[i] = static_cast<Py_intptr_t>(t.shape()[i]);
    strides[i] = stride;
    stride *= std::max<Py_intptr_t>(dims[i], 1);
  }
  // numpy allocates its own memory for a null pointer; an empty tensor
  // has none, so point at something that is never read.
  static const int64_t kEmpty = 0;
  void* data = const_cast<char*>(t.raw_data());
  if (data == nullptr) data = const_cast<int64_t*>(&kEmpty);
  PyObject* descr = api.PyArray_DescrFromType_(NumpyType(t.dtype()));
  if (descr == nullptr) throw py::error_already_set();
  // flags 0: not writeable (tensors are immutable and may be shared).
  PyObject* array = api.PyArray_NewFromDescr_(
      reinterpret_cast<PyTypeObject*>(ArrayClass()), descr, rank, dims.data(),
      strides.data(), data, 0, nullptr);
  if (array == nullptr) throw py::error_already_set();
  py::object result = py::reinterpret_steal<py::object>(array);
  // Named, so that ExportDlpack knows the tensor behind an array.
  PyObject* keep =
      PyCapsule_New(new Tensor(t), kTensorCapsule, [](PyObject* c) {
        delete static_cast<Tensor*>(PyCapsule_GetPointer(c, kTensorCapsule));
      });
  if (keep == nullptr) throw py::error_already_set();
  if (api.PyArray_SetBaseObject_(array, keep) != 0) {
    Py_DECREF(keep);
    throw py::error_already_set();
  }
  return result;
}

// The values of a bytes tensor as a read-only numpy object array of bytes
// shaped `dims` (copied: Python's bytes own their memory).
py::object BytesObjects(const Tensor& t, const std::vector<py::ssize_t>& dims) {
  const int64_t n = t.num_elements();
  py::list values(n);
  for (int64_t k = 0; k < n; ++k) {
    const std::string_view v = t.bytes(k);
    values[k] = py::bytes(v.data(), v.size());
  }
  py::object array = py::module_::import("numpy").attr("array")(
      values, py::arg("dtype") = "object");
  array = array.attr("reshape")(py::tuple(py::cast(dims)));
  array.attr("flags").attr("writeable") = false;
  return array;
}

py::object BytesArray(const Tensor& t) {
  if (t.shape().rank() == 0) {
    const std::string_view v = t.bytes(0);
    return py::bytes(v.data(), v.size());
  }
  return BytesObjects(t, {t.shape().dims().begin(), t.shape().dims().end()});
}

Tensor StringsTensor(const py::array& array, const std::string& what) {
  std::vector<std::string> values;
  values.reserve(static_cast<size_t>(array.size()));
  py::object flat = array.attr("ravel")();
  for (py::handle v : flat) {
    if (!PyBytes_Check(v.ptr()) && !PyUnicode_Check(v.ptr())) {
      throw py::type_error(
          fmt::format("{}: a list or object array of strings must hold "
                      "only bytes or str, not {}",
                      what, TypeName(v)));
    }
    values.emplace_back(py::cast<std::string>(v));
  }
  std::vector<int64_t> dims(array.shape(), array.shape() + array.ndim());
  return Tensor::FromStrings(values, pipeline::Shape(dims));
}

}  // namespace

int64_t Int64FromPython(py::handle value, const std::string& what) {
  const py::object index =
      py::reinterpret_steal<py::object>(PyNumber_Index(value.ptr()));
  if (!index) throw py::error_already_set();
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow != 0) {
    throw py::value_error(
        fmt::format("{}: {} is outside int64's range [-2^63, 2^63 - 1]", what,
                    py::str(value).cast<std::string>()));
  }
  if (x == -1 && PyErr_Occurred()) throw py::error_already_set();
  return x;
}

std::string TypeName(py::handle object) {
  return py::str(py::type::of(object).attr("__name__")).cast<std::string>();
}

namespace {

// Python 3.11 ends a thread it does not know that asks for the GIL once
// finalization has begun (pthread_exit inside PyEval_AcquireThread), and
// the unwinding that pthread_exit does through a noexcept destructor is
// std::terminate: an iterator destroyed on a thread of its own as the
// program exits (PyIterator after a Ctrl-C) aborted the process about one
// exit in four.  Checking _Py_IsFinalizing() first leaves a window; the
// gate closes it.  The module's atexit handler (which Python runs before
// finalization, with the GIL) closes the gate, then releases the GIL until
// every thread already past the gate has dropped its reference or finished
// its Python function (PythonCall), for at most 5 s.
struct ExitGate {
  std::mutex mu;
  std::condition_variable cv;
  bool closed = false;
  int inside = 0;
};

ExitGate& Gate() {
  static ExitGate* gate = new ExitGate;  // outlives every static destructor
  return *gate;
}

// Counts the calling thread inside the gate; false once it is closed (or
// Python is not running), when the thread must not take the GIL.
bool EnterGate() {
  ExitGate& gate = Gate();
  std::lock_guard lock(gate.mu);
  if (gate.closed || !Py_IsInitialized() || _Py_IsFinalizing()) return false;
  ++gate.inside;
  return true;
}

void LeaveGate() {
  ExitGate& gate = Gate();
  std::lock_guard lock(gate.mu);
  if (--gate.inside == 0) gate.cv.notify_all();
}

// Py_DECREF(p) with the GIL from any thread, or nothing once Python exits.
void DropReference(PyObject* p) {
  if (!EnterGate()) return;
  {
    py::gil_scoped_acquire gil;
    Py_DECREF(p);
  }
  LeaveGate();
}

}  // namespace

PythonCall::PythonCall() {
  if (!EnterGate()) {
    throw pipeline::Error(
        "Python is exiting: the pipeline's Python functions no longer run");
  }
  gil_.emplace();
}

PythonCall::~PythonCall() {
  gil_.reset();
  LeaveGate();
}

void CloseExitGate() {
  ExitGate& gate = Gate();
  {
    std::lock_guard lock(gate.mu);
    gate.closed = true;
    if (gate.inside == 0) return;
  }
  // A Python function that outlasts the wait (a map sleeping for minutes)
  // is left behind: the program should not hang on it, and a thread that
  // asks for the GIL after that long is past the window this closes.
  py::gil_scoped_release release;
  std::unique_lock lock(gate.mu);
  gate.cv.wait_for(lock, std::chrono::seconds(5),
                   [&] { return gate.inside == 0; });
}

std::shared_ptr<const void> KeepAlive(py::object object) {
  PyObject* p = object.release().ptr();
  return std::shared_ptr<const void>(p, [](const void* q) {
    DropReference(static_cast<PyObject*>(const_cast<void*>(q)));
  });
}

py::object ToPython(const Tensor& t) {
  if (t.ragged()) {
    py::object values;
    if (t.dtype() == DType::kBytes) {
      values = BytesObjects(t, {t.num_elements()});
    } else {
      // The flat values, sharing the ragged tensor's storage.
      values = NumericArray(t.FlatValues());
    }
    return py::reinterpret_borrow<py::object>(RaggedClass())(
        values, NumericArray(t.row_lengths()));
  }
  t.CheckHost("a Python array");
  if (t.dtype() == DType::kBytes) return BytesArray(t);
  return NumericArray(t);
}

py::dict ElementToDict(const pipeline::Element& element) {
  py::dict d;
  for (const auto& c : element.components) {
    d[py::str(c.name)] = ToPython(c.tensor);
  }
  return d;
}

Tensor TensorFromPython(py::handle value, const std::string& what,
                        Arrays arrays) {
  if (py::isinstance(value, py::handle(RaggedClass()))) {
    Tensor values =
        TensorFromPython(value.attr("values"), what + ".values", arrays);
    py::object lengths = py::module_::import("numpy").attr("asarray")(
        value.attr("row_lengths"), py::arg("dtype") = "int64");
    return Tensor::Ragged(
        values, TensorFromPython(lengths, what + ".row_lengths", arrays));
  }
  if (PyBytes_Check(value.ptr()) || PyUnicode_Check(value.ptr())) {
    return Tensor::BytesScalar(py::cast<std::string>(value));
  }
  if (PyBool_Check(value.ptr()) || PyLong_Check(value.ptr())) {
    return Tensor::Scalar<int64_t>(Int64FromPython(value, what));
  }
  if (PyFloat_Check(value.ptr())) {
    return Tensor::Scalar<float>(py::cast<float>(value));
  }
  const bool from_numpy = py::isinstance<py::array>(value);
  py::module_ np = py::module_::import("numpy");
  py::array array = np.attr("asarray")(value);
  const char kind = array.dtype().kind();
  if (!from_numpy && (kind == 'S' || kind == 'U')) {
    // numpy makes [1, "a"] two strings; a list's values must all be
    // bytes/str for a bytes tensor, as tf.constant wants them.
    array = np.attr("asarray")(value, py::arg("dtype") = "object");
    return StringsTensor(array, what);
  }
  if (kind == 'O' || kind == 'S' || kind == 'U') {
    return StringsTensor(array, what);
  }
  if (!from_numpy && kind == 'u') {
    // numpy's promotion of a list with an int past int64's maximum: that
    // maximum is refused by name (the uint64 array then by FromNumpy).
    Int64FromPython(array.attr("max")(), what);
  }
  if (kind == 'b') {
    array = np.attr("asarray")(array, py::arg("dtype") = "uint8");
  } else if (!from_numpy && kind == 'f') {
    // Python floats become float32, as tf.data makes them.
    array = np.attr("asarray")(array, py::arg("dtype") = "float32");
  }
  const std::optional<DType> dtype = FromNumpy(array.dtype());
  if (!dtype) {
    throw py::type_error(fmt::format(
        "{}: numpy dtype {} is not one recflow holds (float32, float64, "
        "int32, int64, uint8, bytes); convert it with .astype()",
        what, py::str(array.dtype()).cast<std::string>()));
  }
  if (!(array.flags() & npy::NPY_ARRAY_C_CONTIGUOUS_)) {
    array = np.attr("ascontiguousarray")(array);
  }
  // Made here: a new array that owns its memory (np.asarray of a list, a
  // conversion); nothing else holds it.
  const bool made_here = !array.is(value) && array.owndata();
  if (arrays == Arrays::kCopyUnlessImmutable && !made_here &&
      TensorBehind(array) == nullptr) {
    array =
        np.attr("array")(array, py::arg("copy") = true, py::arg("order") = "C");
  }
  std::vector<int64_t> dims(array.shape(), array.shape() + array.ndim());
  const void* data = array.data();
  return Tensor::View(*dtype, pipeline::Shape(dims), data,
                      KeepAlive(std::move(array)));
}

pipeline::Element DictToElement(py::handle dict, const std::string& what,
                                Arrays arrays) {
  if (!PyDict_Check(dict.ptr())) {
    throw py::type_error(fmt::format("{} must be a dict of arrays, not {}",
                                     what, TypeName(dict)));
  }
  pipeline::Element e;
  for (auto [key, value] : py::reinterpret_borrow<py::dict>(dict)) {
    if (!PyUnicode_Check(key.ptr())) {
      throw py::type_error(fmt::format("{}: keys must be str", what));
    }
    std::string name = py::cast<std::string>(key);
    e.Set(name,
          TensorFromPython(value, fmt::format("{}['{}']", what, name), arrays));
  }
  return e;
}

py::capsule ExportDlpack(py::array array) {
  // A framework may write into what it takes (torch has no read-only
  // tensors).  So a recflow tensor is exported as it is only where that
  // can change nothing else (Tensor::Exclusive: a batch made for this
  // element); one that a cache, the arrays a dataset was made from, or
  // another tensor shares is exported as a copy.
  if (const Tensor* t = TensorBehind(array); t != nullptr && !t->Exclusive()) {
    array = py::array(array.attr("copy")());
  }
  const std::optional<DType> dtype = FromNumpy(array.dtype());
  if (!dtype) {
    throw py::buffer_error(
        fmt::format("DLPack export of numpy dtype {} is not supported",
                    py::str(array.dtype()).cast<std::string>()));
  }
  struct Context {
    DLManagedTensor managed{};
    std::vector<int64_t> shape, strides;
    PyObject* array = nullptr;
  };
  auto context = std::make_unique<Context>();
  const auto itemsize = array.itemsize();
  for (py::ssize_t i = 0; i < array.ndim(); ++i) {
    if (array.strides(i) % itemsize != 0) {
      throw py::buffer_error(
          "DLPack cannot express strides that are not a multiple of the "
          "item size");
    }
    context->shape.push_back(array.shape(i));
    context->strides.push_back(array.strides(i) / itemsize);
  }
  DLTensor& t = context->managed.dl_tensor;
  t.data = const_cast<void*>(array.data());
  t.device = {kDLCPU, 0};
  t.ndim = static_cast<int32_t>(array.ndim());
  switch (*dtype) {
    case DType::kFloat32:
      t.dtype = {kDLFloat, 32, 1};
      break;
    case DType::kFloat64:
      t.dtype = {kDLFloat, 64, 1};
      break;
    case DType::kInt32:
      t.dtype = {kDLInt, 32, 1};
      break;
    case DType::kInt64:
      t.dtype = {kDLInt, 64, 1};
      break;
    case DType::kUInt8:
    case DType::kBytes:
      t.dtype = {kDLUInt, 8, 1};
      break;
  }
  t.shape = context->shape.data();
  t.strides = context->strides.data();
  t.byte_offset = 0;
  context->array = array.release().ptr();
  context->managed.manager_ctx = context.get();
  context->managed.deleter = [](DLManagedTensor* m) {
    auto* c = static_cast<Context*>(m->manager_ctx);
    DropReference(c->array);
    delete c;
  };
  DLManagedTensor* managed = &context.release()->managed;
  // A capsule still named "dltensor" when it dies was never consumed: the
  // consumer renames it "used_dltensor" and calls the deleter itself.
  PyObject* capsule = PyCapsule_New(managed, "dltensor", [](PyObject* cap) {
    if (PyCapsule_IsValid(cap, "dltensor")) {
      auto* m =
          static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
      m->deleter(m);
    }
  });
  if (capsule == nullptr) {
    managed->deleter(managed);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(capsule);
}

}  // namespace recflow::python
