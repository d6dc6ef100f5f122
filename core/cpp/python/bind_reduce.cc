// byteps._core.reduce: Python access to the SIMD summation kernels (reduce/,
// docs/architecture.md §7), for tests and benchmarks. Operates in place on NumPy arrays.
//
//   sum_into(dst, src, dtype=None)     dst += src
//   sum3(dst, a, b, dtype=None)        dst = a + b
//   divide(dst, divisor, dtype=None)   dst /= divisor (floats: true division; ints: floor)
//   copy_streaming(dst, src)          dst[:] = src with non-temporal stores (reduce/copy.h)
//   active_isa(), available_isas(), force_isa(name)
//
// The element type comes from the arrays' NumPy dtype, or from the `dtype` string when given
// (needed for bfloat16, which NumPy lacks: pass uint16 arrays holding bfloat16 bits); with
// an explicit dtype only the byte sizes of the arrays must agree. Arrays must be NumPy
// arrays (no silent copies), C-contiguous, and dst writable. The GIL is released while the
// kernel runs. Bad arguments raise byteps.errors.InvalidTypeError / InvalidArgumentError.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "reduce/copy.h"
#include "reduce/sum.h"

namespace py = pybind11;

namespace byteps {
namespace python {
namespace {

[[noreturn]] void Unsupported(const std::string& what) {
  ThrowInvalidType("unsupported dtype " + what + "; supported: " + SupportedDTypeNames());
}

// DType of a NumPy array from its dtype (kind + itemsize, native byte order only).
DType FromNumpy(const py::array& arr) {
  const py::dtype dt = arr.dtype();
  const std::string repr = py::str(dt);
  if (!dt.attr("isnative").cast<bool>()) Unsupported(repr + " (non-native byte order)");
  const char kind = dt.kind();
  const py::ssize_t size = dt.itemsize();
  if (kind == 'f') {
    if (size == 2) return DType::kFloat16;
    if (size == 4) return DType::kFloat32;
    if (size == 8) return DType::kFloat64;
  } else if (kind == 'i') {
    if (size == 1) return DType::kInt8;
    if (size == 4) return DType::kInt32;
    if (size == 8) return DType::kInt64;
  } else if (kind == 'u' && size == 1) {
    return DType::kUInt8;
  }
  Unsupported(repr);
}

DType FromName(const std::string& name) {
  DType t;
  if (!ParseDType(name, &t)) Unsupported("'" + name + "'");
  return t;
}

void CheckArray(const py::array& arr, const char* role, bool writable) {
  if (!(arr.flags() & py::array::c_style)) {
    ThrowInvalidArgument(std::string(role) + " must be C-contiguous");
  }
  if (writable && !arr.writeable()) {
    ThrowInvalidArgument(std::string(role) + " must be writable");
  }
}

// Resolved view of the arguments of one call: element type, count and checked pointers.
struct Operands {
  DType dtype;
  size_t count;
};

Operands Resolve(const std::vector<std::pair<const py::array*, const char*>>& arrays,
                 const std::optional<std::string>& dtype_name) {
  const py::array& first = *arrays[0].first;
  Operands ops{};
  ops.dtype = dtype_name ? FromName(*dtype_name) : FromNumpy(first);
  const size_t esize = DTypeSize(ops.dtype);
  const size_t nbytes = static_cast<size_t>(first.nbytes());
  for (size_t i = 0; i < arrays.size(); ++i) {
    const py::array& arr = *arrays[i].first;
    const char* role = arrays[i].second;
    CheckArray(arr, role, i == 0);
    if (!dtype_name && FromNumpy(arr) != ops.dtype) {
      ThrowInvalidType(std::string("dtype mismatch: ") + arrays[0].second + " is " +
                           DTypeName(ops.dtype) + " but " + role + " is " +
                           DTypeName(FromNumpy(arr)));
    }
    if (static_cast<size_t>(arr.nbytes()) != nbytes) {
      ThrowInvalidArgument(std::string("size mismatch: ") + arrays[0].second + " has " +
                            std::to_string(nbytes) + " bytes but " + role + " has " +
                            std::to_string(arr.nbytes()));
    }
    if (reinterpret_cast<uintptr_t>(arr.data()) % esize != 0) {
      ThrowInvalidArgument(std::string(role) + " is not aligned to the " +
                            std::to_string(esize) + "-byte " + DTypeName(ops.dtype) +
                            " element size");
    }
  }
  if (nbytes % esize != 0) {
    ThrowInvalidArgument(std::to_string(nbytes) + " bytes is not a whole number of " +
                          DTypeName(ops.dtype) + " elements");
  }
  // dst may be exactly one of the inputs, but must not partially overlap any of them.
  const auto* d = static_cast<const char*>(first.data());
  for (size_t i = 1; i < arrays.size(); ++i) {
    const auto* s = static_cast<const char*>(arrays[i].first->data());
    if (s != d && nbytes != 0 && s < d + nbytes && d < s + nbytes) {
      ThrowInvalidArgument(std::string(arrays[0].second) + " partially overlaps " +
                            arrays[i].second);
    }
  }
  ops.count = nbytes / esize;
  return ops;
}

// The arguments arrive as plain objects so that a wrong type raises InvalidTypeError (pybind11's
// own argument matching would raise a bare TypeError).
py::array AsArray(const py::object& o, const char* role) {
  if (!py::isinstance<py::array>(o))
    ThrowInvalidType(std::string(role) + " must be a NumPy array, got " +
                     Py_TYPE(o.ptr())->tp_name);
  return py::reinterpret_borrow<py::array>(o);
}

std::optional<std::string> AsDTypeName(const py::object& o) {
  if (o.is_none()) return std::nullopt;
  if (!py::isinstance<py::str>(o))
    ThrowInvalidType(std::string("dtype must be a str or None, got ") + Py_TYPE(o.ptr())->tp_name);
  return o.cast<std::string>();
}

int64_t AsInt64(const py::object& o, const char* what) {
  if (!PyIndex_Check(o.ptr()) || py::isinstance<py::bool_>(o))
    ThrowInvalidType(std::string(what) + " must be an int, got " + Py_TYPE(o.ptr())->tp_name);
  try {
    return py::int_(o).cast<int64_t>();
  } catch (const py::cast_error&) {
    ThrowInvalidArgument(std::string(what) + " " + std::string(py::str(o)) +
                         " does not fit in 64 bits");
  }
}

void SumIntoPy(const py::object& dst_o, const py::object& src_o, const py::object& dtype_o) {
  py::array dst = AsArray(dst_o, "dst");
  py::array src = AsArray(src_o, "src");
  const Operands ops = Resolve({{&dst, "dst"}, {&src, "src"}}, AsDTypeName(dtype_o));
  void* d = dst.mutable_data();
  const void* s = src.data();
  py::gil_scoped_release release;
  reduce::SumInto(d, s, ops.count, ops.dtype);
}

// dst = a op b (reduce::Reduce3; kSum is reduce::Sum3).
void Reduce3With(const py::object& dst_o, const py::object& a_o, const py::object& b_o,
                 reduce::ReduceOp op, const py::object& dtype_o) {
  py::array dst = AsArray(dst_o, "dst");
  py::array a = AsArray(a_o, "a");
  py::array b = AsArray(b_o, "b");
  const Operands ops = Resolve({{&dst, "dst"}, {&a, "a"}, {&b, "b"}}, AsDTypeName(dtype_o));
  void* d = dst.mutable_data();
  const void* pa = a.data();
  const void* pb = b.data();
  py::gil_scoped_release release;
  reduce::Reduce3(d, pa, pb, ops.count, ops.dtype, op);
}

void Sum3Py(const py::object& dst_o, const py::object& a_o, const py::object& b_o,
            const py::object& dtype_o) {
  Reduce3With(dst_o, a_o, b_o, reduce::ReduceOp::kSum, dtype_o);
}

void Reduce3Py(const py::object& dst_o, const py::object& a_o, const py::object& b_o,
               const std::string& op_name, const py::object& dtype_o) {
  reduce::ReduceOp op;
  if (!reduce::ParseReduceOp(op_name, &op))
    ThrowInvalidArgument("unsupported op '" + op_name + "' (sum, min, max, product)");
  Reduce3With(dst_o, a_o, b_o, op, dtype_o);
}

void DividePy(const py::object& dst_o, const py::object& divisor_o, const py::object& dtype_o) {
  py::array dst = AsArray(dst_o, "dst");
  const int64_t divisor = AsInt64(divisor_o, "divisor");
  const Operands ops = Resolve({{&dst, "dst"}}, AsDTypeName(dtype_o));
  if (!DTypeIsFloat(ops.dtype) && divisor <= 0) {
    ThrowInvalidArgument("integer divide needs a positive divisor, got " +
                          std::to_string(divisor));
  }
  void* d = dst.mutable_data();
  py::gil_scoped_release release;
  reduce::DivideInPlace(d, ops.count, ops.dtype, divisor);
}

void CopyStreamingPy(const py::object& dst_o, const py::object& src_o) {
  py::array dst = AsArray(dst_o, "dst");
  py::array src = AsArray(src_o, "src");
  CheckArray(dst, "dst", true);
  CheckArray(src, "src", false);
  const size_t n = static_cast<size_t>(dst.nbytes());
  if (static_cast<size_t>(src.nbytes()) != n) {
    ThrowInvalidArgument("size mismatch: dst has " + std::to_string(n) + " bytes but src has " +
                          std::to_string(src.nbytes()));
  }
  auto* d = static_cast<char*>(dst.mutable_data());
  const auto* s = static_cast<const char*>(src.data());
  if (n != 0 && s < d + n && d < s + n) ThrowInvalidArgument("dst overlaps src");
  py::gil_scoped_release release;
  reduce::CopyStreaming(d, s, n);
}

std::vector<std::string> AvailableIsaList() {
  std::vector<std::string> out;
  std::string all = reduce::AvailableIsas();
  size_t start = 0;
  while (start <= all.size()) {
    const size_t comma = all.find(',', start);
    const size_t end = comma == std::string::npos ? all.size() : comma;
    if (end > start) out.push_back(all.substr(start, end - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

void ForceIsaPy(const std::string& name) {
  if (!reduce::ForceIsa(name.c_str())) {
    ThrowInvalidArgument("ISA '" + name + "' is not available on this CPU; available: " +
                          reduce::AvailableIsas());
  }
}

}  // namespace

void BindReduce(py::module_& m) {
  py::module_ r = m.def_submodule("reduce", "SIMD summation kernels (runtime CPU dispatch).");
  r.def("sum_into", &SumIntoPy, py::arg("dst"), py::arg("src"),
        py::arg("dtype") = py::none(),
        "dst += src in place. dtype (str) overrides the arrays' dtype, e.g. 'bfloat16' for "
        "uint16 arrays holding bfloat16 bits.");
  r.def("sum3", &Sum3Py, py::arg("dst"), py::arg("a"), py::arg("b"),
        py::arg("dtype") = py::none(),
        "dst = a + b (dst may be a or b).");
  r.def("reduce3", &Reduce3Py, py::arg("dst"), py::arg("a"), py::arg("b"), py::arg("op"),
        py::arg("dtype") = py::none(),
        "dst = a op b for op 'sum', 'min', 'max' or 'product' (dst may be a or b): the kernels "
        "the local reduce, the collectives and the servers combine values with.");
  r.def("divide", &DividePy, py::arg("dst"), py::arg("divisor"),
        py::arg("dtype") = py::none(),
        "dst /= divisor in place: true division for floating types (float16/bfloat16 via "
        "float32, rounded to nearest even), floor division for integers (divisor > 0).");
  r.def("copy_streaming", &CopyStreamingPy, py::arg("dst"), py::arg("src"),
        "dst[:] = src (same number of bytes, any dtypes, no overlap) with non-temporal stores, "
        "as the worker copies large outputs (reduce::CopyStreaming).");
  r.def("active_isa", &reduce::ActiveIsa, "ISA of the kernels in use: avx512, avx2 or scalar.");
  r.def("available_isas", &AvailableIsaList, "ISAs usable on this CPU, best first.");
  r.def("force_isa", &ForceIsaPy, py::arg("name"),
        "Use the kernels of one ISA (tests, benchmarks); InvalidArgumentError (a ValueError) if "
        "unavailable here.");
}

}  // namespace python
}  // namespace byteps
