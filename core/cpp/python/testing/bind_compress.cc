// byteps._core_testing: the gradient compressors (compress/compressor.h) for tests and the
// benchmark. Not a public API.
//
//   c = Compressor(kwargs, side, dtype, count)  kwargs: dict str -> str; side "worker"|"server";
//                                               dtype "float16"|"float32"|"float64"
//   c.compress(x, scale=1.0, lr=0.0) -> bytes   x: C-contiguous NumPy array of dtype, count
//                                               elements; updates c's state (error, momentum,
//                                               random stream)
//   c.decompress(data) -> ndarray               count elements of dtype
//   c.decompress_add(data, x) -> ndarray        a copy of x plus the decoded values
//   c.max_encoded_bytes, c.count, c.dtype
//   format_spec(kwargs) -> str; parse_spec(str) -> dict; validate(kwargs, dtype) -> None
//   set_learning_rate(lr); learning_rate() -> float
//   compressor_throughput(kwargs, dtype, count, seconds) -> (compress GB/s, decompress GB/s)
//       one thread, a worker-side instance, GB/s of raw input bytes (1e9 bytes), half the time
//       compressing standard-normal data and half decompressing its encoding.
// Bad arguments raise byteps.errors.InvalidArgumentError / InvalidTypeError; a malformed
// encoding raises InvalidArgumentError.
#include <cstdint>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "testing_bindings.h"
#include "compress/compressor.h"
#include "reduce/half.h"

namespace py = pybind11;

namespace byteps {
namespace python {
namespace {

using compress::Kwargs;

Kwargs ToKwargs(const py::handle& obj) {
  if (!py::isinstance<py::dict>(obj)) {
    ThrowInvalidType(std::string("compressor kwargs must be a dict, got ") +
                     Py_TYPE(obj.ptr())->tp_name);
  }
  Kwargs kw;
  for (auto item : py::reinterpret_borrow<py::dict>(obj)) {
    if (!py::isinstance<py::str>(item.first) || !py::isinstance<py::str>(item.second)) {
      ThrowInvalidType("compressor kwargs map str to str, got " +
                       std::string(Py_TYPE(item.first.ptr())->tp_name) + " -> " +
                       Py_TYPE(item.second.ptr())->tp_name);
    }
    kw[item.first.cast<std::string>()] = item.second.cast<std::string>();
  }
  return kw;
}

py::dict ToDict(const Kwargs& kw) {
  py::dict d;
  for (const auto& [k, v] : kw) d[py::str(k)] = py::str(v);
  return d;
}

DType ParseDTypeName(const std::string& name) {
  DType t;
  if (!ParseDType(name, &t)) {
    ThrowInvalidType("unsupported dtype '" + name + "'; supported: " + SupportedDTypeNames());
  }
  return t;
}

compress::Side ParseSide(const std::string& side) {
  if (side == "worker") return compress::Side::kWorker;
  if (side == "server") return compress::Side::kServer;
  ThrowInvalidArgument("side must be 'worker' or 'server', got '" + side + "'");
}

std::string_view BytesView(const py::bytes& b) {
  char* p = nullptr;
  Py_ssize_t n = 0;
  if (PyBytes_AsStringAndSize(b.ptr(), &p, &n) != 0) throw py::error_already_set();
  return {p, static_cast<size_t>(n)};
}

class PyCompressor {
 public:
  PyCompressor(const py::object& kwargs, const std::string& side, const std::string& dtype,
               size_t count) {
    Check(compress::Create(ToKwargs(kwargs), ParseSide(side), ParseDTypeName(dtype), count,
                           &c_));
  }

  py::bytes Compress(const py::array& x, double scale, double lr) {
    const void* data = CheckArray(x, "x");
    std::string out(c_->MaxEncodedBytes(), '\0');
    size_t len = 0;
    Status st;
    compress::CompressArgs args;
    args.scale = scale;
    args.lr = lr;
    {
      py::gil_scoped_release nogil;
      st = c_->Compress(data, args, out.data(), &len);
    }
    Check(st);
    out.resize(len);
    return py::bytes(out);
  }

  py::array Decompress(const py::bytes& data) {
    py::array out = NewArray();
    const std::string_view in = BytesView(data);
    void* dst = out.mutable_data();
    Status st;
    {
      py::gil_scoped_release nogil;
      st = c_->Decompress(in.data(), in.size(), dst);
    }
    Check(st);
    return out;
  }

  py::array DecompressAdd(const py::bytes& data, const py::array& x) {
    CheckArray(x, "x");
    py::array out = NewArray();
    std::memcpy(out.mutable_data(), x.data(), c_->raw_bytes());
    const std::string_view in = BytesView(data);
    void* dst = out.mutable_data();
    Status st;
    {
      py::gil_scoped_release nogil;
      st = c_->DecompressAdd(in.data(), in.size(), dst);
    }
    Check(st);
    return out;
  }

  size_t max_encoded_bytes() const { return c_->MaxEncodedBytes(); }
  size_t count() const { return c_->count(); }
  std::string dtype() const { return DTypeName(c_->dtype()); }

 private:
  py::array NewArray() const {
    const std::vector<py::ssize_t> shape{static_cast<py::ssize_t>(c_->count())};
    return py::array(py::dtype(DTypeName(c_->dtype())), shape);
  }

  const void* CheckArray(const py::array& x, const char* role) {
    const std::string got = py::str(x.dtype());
    if (got != DTypeName(c_->dtype())) {
      ThrowInvalidType(std::string(role) + " has dtype " + got + ", the compressor takes " +
                       DTypeName(c_->dtype()));
    }
    if (!(x.flags() & py::array::c_style)) {
      ThrowInvalidArgument(std::string(role) + " must be C-contiguous");
    }
    if (static_cast<size_t>(x.size()) != c_->count()) {
      ThrowInvalidArgument(std::string(role) + " has " + std::to_string(x.size()) +
                           " elements, the compressor takes " + std::to_string(c_->count()));
    }
    if (reinterpret_cast<uintptr_t>(x.data()) % DTypeSize(c_->dtype()) != 0) {
      ThrowInvalidArgument(std::string(role) + " is not aligned to its element size");
    }
    return x.data();
  }

  std::unique_ptr<compress::Compressor> c_;
};

// Standard-normal input of `count` elements of dtype (fixed seed).
std::vector<uint8_t> NormalData(DType dtype, size_t count) {
  std::vector<uint8_t> data(count * DTypeSize(dtype));
  std::mt19937_64 gen(12345);
  std::normal_distribution<double> dist;
  for (size_t i = 0; i < count; ++i) {
    const double v = dist(gen);
    if (dtype == DType::kFloat64) {
      std::memcpy(data.data() + 8 * i, &v, 8);
    } else if (dtype == DType::kFloat16) {
      const uint16_t h = half::FloatToHalf(static_cast<float>(v));
      std::memcpy(data.data() + 2 * i, &h, 2);
    } else {
      const float f = static_cast<float>(v);
      std::memcpy(data.data() + 4 * i, &f, 4);
    }
  }
  return data;
}

py::tuple Throughput(const py::object& kwargs, const std::string& dtype_name, size_t count,
                     double seconds) {
  if (!(seconds > 0 && seconds <= 600)) ThrowInvalidArgument("seconds must be in (0, 600]");
  const DType dtype = ParseDTypeName(dtype_name);
  std::unique_ptr<compress::Compressor> c;
  Check(compress::Create(ToKwargs(kwargs), compress::Side::kWorker, dtype, count, &c));
  double rates[2] = {0, 0};
  Status st;
  {
    py::gil_scoped_release nogil;
    const std::vector<uint8_t> in = NormalData(dtype, count);
    std::vector<uint8_t> enc(c->MaxEncodedBytes());
    std::vector<uint8_t> out(c->raw_bytes());
    size_t len = 0;
    using Clock = std::chrono::steady_clock;
    const auto budget = std::chrono::duration<double>(seconds / 2);
    for (int phase = 0; phase < 2 && st.ok(); ++phase) {
      size_t iters = 0;
      const auto t0 = Clock::now();
      std::chrono::duration<double> elapsed{0};
      do {
        st = phase == 0 ? c->Compress(in.data(), compress::CompressArgs(), enc.data(), &len)
                        : c->Decompress(enc.data(), len, out.data());
        ++iters;
        elapsed = Clock::now() - t0;
      } while (st.ok() && elapsed < budget);
      rates[phase] = static_cast<double>(c->raw_bytes()) * static_cast<double>(iters) /
                     elapsed.count() / 1e9;
    }
  }
  Check(st);
  return py::make_tuple(rates[0], rates[1]);
}

}  // namespace

void BindCompress(py::module_& m) {
  py::class_<PyCompressor>(m, "Compressor")
      .def(py::init<const py::object&, const std::string&, const std::string&, size_t>(),
           py::arg("kwargs"), py::arg("side"), py::arg("dtype"), py::arg("count"))
      .def("compress", &PyCompressor::Compress, py::arg("x"), py::arg("scale") = 1.0,
           py::arg("lr") = 0.0)
      .def("decompress", &PyCompressor::Decompress, py::arg("data"))
      .def("decompress_add", &PyCompressor::DecompressAdd, py::arg("data"), py::arg("x"))
      .def_property_readonly("max_encoded_bytes", &PyCompressor::max_encoded_bytes)
      .def_property_readonly("count", &PyCompressor::count)
      .def_property_readonly("dtype", &PyCompressor::dtype);
  m.def(
      "format_spec", [](const py::object& kw) { return compress::FormatSpec(ToKwargs(kw)); },
      py::arg("kwargs"));
  m.def(
      "parse_spec",
      [](const std::string& spec) {
        Kwargs kw;
        Check(compress::ParseSpec(spec, &kw));
        return ToDict(kw);
      },
      py::arg("spec"));
  m.def(
      "validate",
      [](const py::object& kw, const std::string& dtype) {
        Check(compress::Validate(ToKwargs(kw), ParseDTypeName(dtype)));
      },
      py::arg("kwargs"), py::arg("dtype"));
  m.def("set_learning_rate", &compress::SetLearningRate, py::arg("lr"));
  m.def("learning_rate", &compress::LearningRate);
  m.def("compressor_throughput", &Throughput, py::arg("kwargs"), py::arg("dtype"),
        py::arg("count"), py::arg("seconds"));
}

}  // namespace python
}  // namespace byteps
