// Python access to Lucid's sgemm (lucid/sgemm.h) outside a program: the kernel tests call it with
// strided views, alpha/beta and each epilogue, and bench_kernels.py times it against the BLAS.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "lucid/blas.h"
#include "lucid/sgemm.h"

namespace py = pybind11;

namespace lucid {

namespace {

using F32Array = py::array_t<float, 0>;

// A 2-D float32 array whose rows are contiguous: (rows, cols, row stride in elements).
struct Matrix {
  int64_t rows, cols, ld;
};

Matrix matrix_of(const py::array& a, const char* name) {
  if (a.ndim() != 2 || !py::isinstance<F32Array>(a))
    throw std::invalid_argument(std::string(name) + " must be a 2-D float32 array");
  if (a.shape(0) == 0 || a.shape(1) == 0) return {a.shape(0), a.shape(1), std::max<int64_t>(1, a.shape(1))};
  if (a.strides(1) != static_cast<py::ssize_t>(sizeof(float)) || a.strides(0) % sizeof(float) != 0 ||
      a.strides(0) < a.shape(1) * static_cast<py::ssize_t>(sizeof(float)))
    throw std::invalid_argument(std::string(name) + " must have contiguous rows (any row stride)");
  return {a.shape(0), a.shape(1), a.strides(0) / static_cast<py::ssize_t>(sizeof(float))};
}

GemmActivation activation_of(const std::string& s) {
  if (s == "none") return GemmActivation::none;
  if (s == "relu") return GemmActivation::relu;
  if (s == "gelu") return GemmActivation::gelu;
  throw std::invalid_argument("activation must be 'none', 'relu' or 'gelu', got '" + s + "'");
}

void call_sgemm(const py::array& a, const py::array& b, py::array& c, bool ta, bool tb,
                float alpha, float beta, const py::object& bias, const py::object& addend,
                const std::string& activation, const std::string& kernel) {
  const Matrix ma = matrix_of(a, "a"), mb = matrix_of(b, "b"), mc = matrix_of(c, "c");
  if (!c.writeable()) throw std::invalid_argument("c must be writeable");
  const int64_t M = ta ? ma.cols : ma.rows, K = ta ? ma.rows : ma.cols;
  const int64_t Kb = tb ? mb.cols : mb.rows, N = tb ? mb.rows : mb.cols;
  if (K != Kb) throw std::invalid_argument("contraction sizes differ");
  if (mc.rows != M || mc.cols != N) throw std::invalid_argument("c has the wrong shape");
  GemmEpilogue ep;
  ep.act = activation_of(activation);
  py::array bias_a, addend_a;
  if (!bias.is_none()) {
    bias_a = py::array::ensure(bias);
    if (!py::isinstance<F32Array>(bias_a) || bias_a.ndim() != 1 || bias_a.shape(0) != N ||
        bias_a.strides(0) != static_cast<py::ssize_t>(sizeof(float)))
      throw std::invalid_argument("bias must be a contiguous float32 array of shape [N]");
    ep.bias = static_cast<const float*>(bias_a.data());
  }
  if (!addend.is_none()) {
    addend_a = py::array::ensure(addend);
    const Matrix md = matrix_of(addend_a, "addend");
    if (md.rows != M || md.cols != N) throw std::invalid_argument("addend must have c's shape");
    ep.addend = static_cast<const float*>(addend_a.data());
    ep.ld_addend = md.ld;
  }
  if (kernel != "lucid" && kernel != "blas")
    throw std::invalid_argument("kernel must be 'lucid' or 'blas', got '" + kernel + "'");
  if (kernel == "lucid" && !sgemm_supported())
    throw std::runtime_error("Lucid's sgemm needs a CPU with AVX2 and FMA");
  const float* A = static_cast<const float*>(a.data());
  const float* B = static_cast<const float*>(b.data());
  float* C = static_cast<float*>(c.mutable_data());
  py::gil_scoped_release release;
  if (kernel == "lucid") {
    sgemm(ta, tb, M, N, K, alpha, A, ma.ld, B, mb.ld, beta, C, mc.ld, ep);
    return;
  }
  // The BLAS, then the epilogue as separate passes (what gemm() does without Lucid's kernel).
  if (M == 0 || N == 0) return;
  blas_gemm(ta, tb, M, N, K, alpha, A, ma.ld, B, mb.ld, beta, C, mc.ld);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      if (ep.bias != nullptr) C[i * mc.ld + j] += ep.bias[j];
      if (ep.addend != nullptr) C[i * mc.ld + j] += ep.addend[i * ep.ld_addend + j];
    }
  sgemm_activation(ep.act, M, N, C, mc.ld);
}

// The storage type of a float32, float16 or bfloat16 (ml_dtypes) array.
GemmType gemm_type_of(const py::array& a, const char* name) {
  const std::string dtype = py::str(a.dtype().attr("name"));
  if (dtype == "float32") return GemmType::f32;
  if (dtype == "float16") return GemmType::f16;
  if (dtype == "bfloat16") return GemmType::bf16;
  throw std::invalid_argument(std::string(name) + " must be float32, float16 or bfloat16, got " +
                              dtype);
}

GemmType round_type_of(const std::string& s) {
  if (s == "none") return GemmType::f32;
  if (s == "f16") return GemmType::f16;
  if (s == "bf16") return GemmType::bf16;
  throw std::invalid_argument("round_product must be 'none', 'f16' or 'bf16', got '" + s + "'");
}

// A 2-D array of any element size whose rows are contiguous.
Matrix typed_matrix_of(const py::array& a, const char* name) {
  const py::ssize_t item = a.itemsize();
  if (a.ndim() != 2) throw std::invalid_argument(std::string(name) + " must be 2-D");
  if (a.shape(0) == 0 || a.shape(1) == 0)
    return {a.shape(0), a.shape(1), std::max<int64_t>(1, a.shape(1))};
  if (a.strides(1) != item || a.strides(0) % item != 0 || a.strides(0) < a.shape(1) * item)
    throw std::invalid_argument(std::string(name) + " must have contiguous rows (any row stride)");
  return {a.shape(0), a.shape(1), a.strides(0) / item};
}

void call_gemm_mixed(const py::array& a, const py::array& b, py::array& c, bool ta, bool tb,
                     float alpha, const py::object& bias, const py::object& addend,
                     const std::string& activation, const std::string& round_product) {
  MixedGemm g;
  g.a_type = gemm_type_of(a, "a");
  g.b_type = gemm_type_of(b, "b");
  g.c_type = gemm_type_of(c, "c");
  const Matrix ma = typed_matrix_of(a, "a"), mb = typed_matrix_of(b, "b");
  const Matrix mc = typed_matrix_of(c, "c");
  if (!c.writeable()) throw std::invalid_argument("c must be writeable");
  g.ta = ta, g.tb = tb;
  g.M = ta ? ma.cols : ma.rows, g.K = ta ? ma.rows : ma.cols;
  const int64_t Kb = tb ? mb.cols : mb.rows;
  g.N = tb ? mb.rows : mb.cols;
  if (g.K != Kb) throw std::invalid_argument("contraction sizes differ");
  if (mc.rows != g.M || mc.cols != g.N) throw std::invalid_argument("c has the wrong shape");
  g.alpha = alpha;
  g.act = activation_of(activation);
  g.round_product = round_type_of(round_product);
  if (g.round_product != GemmType::f32 && g.c_type == GemmType::f32)
    throw std::invalid_argument("round_product needs a float16 or bfloat16 c");
  py::array bias_a, addend_a;
  if (!bias.is_none()) {
    bias_a = py::array::ensure(bias);
    g.bias_type = gemm_type_of(bias_a, "bias");
    if (bias_a.ndim() != 1 || bias_a.shape(0) != g.N || bias_a.strides(0) != bias_a.itemsize())
      throw std::invalid_argument("bias must be a contiguous array of shape [N]");
    g.bias = bias_a.data();
  }
  if (!addend.is_none()) {
    addend_a = py::array::ensure(addend);
    const Matrix md = matrix_of(addend_a, "addend");
    if (md.rows != g.M || md.cols != g.N) throw std::invalid_argument("addend must have c's shape");
    g.addend = static_cast<const float*>(addend_a.data());
    g.ld_addend = md.ld;
  }
  g.A = a.data(), g.lda = ma.ld;
  g.B = b.data(), g.ldb = mb.ld;
  g.C = c.mutable_data(), g.ldc = mc.ld;
  py::gil_scoped_release release;
  gemm_mixed(g);
}

}  // namespace

void init_sgemm(py::module_& m) {
  m.def("gemm_mixed", &call_gemm_mixed, py::arg("a"), py::arg("b"), py::arg("c"), py::kw_only(),
        py::arg("transpose_a") = false, py::arg("transpose_b") = false, py::arg("alpha") = 1.0f,
        py::arg("bias") = py::none(), py::arg("addend") = py::none(),
        py::arg("activation") = "none", py::arg("round_product") = "none",
        "c = round(act(r(alpha * op(a) @ op(b) + bias + addend))) in place: a, b, c and bias "
        "float32, float16 or bfloat16 (widened while packing), addend float32, r the rounding "
        "to round_product ('f16'/'bf16') and back, round the rounding to c's dtype.");
  m.def("shared_pack_stats", []() {
    const SharedPackStats s = shared_pack_stats();
    py::dict d;
    d["packed"] = s.packed;
    d["reused"] = s.reused;
    return d;
  }, "On this thread: how many runs' GEMMs packed a shared B whole, and how many reused one.");
  m.def("gemm_mixed_native", &gemm_mixed_native,
        "Whether gemm_mixed converts while packing here (AVX2, FMA, F16C).");
  m.def("sgemm", &call_sgemm, py::arg("a"), py::arg("b"), py::arg("c"), py::kw_only(),
        py::arg("transpose_a") = false, py::arg("transpose_b") = false, py::arg("alpha") = 1.0f,
        py::arg("beta") = 0.0f, py::arg("bias") = py::none(), py::arg("addend") = py::none(),
        py::arg("activation") = "none", py::arg("kernel") = "lucid",
        "c = act(alpha * op(a) @ op(b) + beta * c + bias + addend) in place, on Lucid's kernel "
        "or (kernel='blas') the BLAS with the epilogue as separate passes.");
  m.def("sgemm_supported", &sgemm_supported, "Whether Lucid's sgemm runs here (AVX2 + FMA).");
  m.def("set_sgemm_mode", [](const std::string& mode) {
    if (mode != "auto" && mode != "lucid" && mode != "blas")
      throw std::invalid_argument("mode must be 'auto', 'lucid' or 'blas', got '" + mode + "'");
    set_sgemm_mode(mode == "auto" ? 0 : mode == "lucid" ? 1 : 2);
  }, py::arg("mode"), "Which kernel gemm() uses for float32: the shape rule, Lucid's, or the BLAS.");
  m.def("sgemm_mode", []() {
    const int mode = sgemm_mode();
    return std::string(mode == 1 ? "lucid" : mode == 2 ? "blas" : "auto");
  });
  m.def("set_sgemm_isa", [](const std::string& isa) {
    if (isa != "auto" && isa != "avx2" && isa != "avx512")
      throw std::invalid_argument("isa must be 'auto', 'avx2' or 'avx512', got '" + isa + "'");
    set_sgemm_isa(isa == "auto" ? 0 : isa == "avx2" ? 1 : 2);
  }, py::arg("isa"), "Lucid's GEMM tile: the CPU's best, AVX2 forced, or AVX-512 at every width.");
  m.def("sgemm_isa", []() {
    const int isa = sgemm_isa();
    return std::string(isa == 2 ? "avx512" : isa == 1 ? "avx2" : "none");
  }, "The micro-kernel Lucid's GEMM runs now: 'avx512', 'avx2' or 'none'.");
  m.def("sgemm_chosen", &sgemm_chosen, py::arg("transpose_a"), py::arg("transpose_b"), py::arg("m"),
        py::arg("n"), py::arg("k"), "Whether gemm() runs this float32 shape on Lucid's kernel.");
}

}  // namespace lucid
