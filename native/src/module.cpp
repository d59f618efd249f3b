// The pybind11 entry point: each area of the native library adds itself through an init_ function.
#include <pybind11/pybind11.h>

#include "lucid/blas.h"

namespace py = pybind11;

namespace lucid {
void init_runtime(py::module_& m);
void init_sgemm(py::module_& m);  // bind_sgemm.cpp
}
#if defined(__APPLE__) && defined(LUCID_WITH_MPSGRAPH)
namespace lucid::mpsgraph {
void init_mpsgraph(py::module_& m);  // native/mpsgraph: the MPSGraph backend, macOS only
}
#endif

#ifndef LUCID_VERSION
#define LUCID_VERSION "0.0.0"
#endif

static py::dict build_info() {
  py::dict info;
  info["version"] = LUCID_VERSION;
  info["blas"] = LUCID_BLAS_NAME;
  info["compiler"] = __VERSION__;
  info["cxx_standard"] = static_cast<long>(__cplusplus);
  return info;
}

PYBIND11_MODULE(_native, m) {
  m.doc() = "Lucid's native library: program model, CPU runtime and executable cache.";
  m.attr("__version__") = LUCID_VERSION;
  m.def("build_info", &build_info, "Versions and BLAS the native module was built with.");
  m.def("blas_sdot_check", []() {
    // Proves at import-test time that the BLAS symbols resolve (a wrong prefix fails here).
    float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, c[1] = {0};
    LUCID_SGEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, 1, 4, 1.0f, a, 4, b, 1, 0.0f, c, 1);
    return c[0];
  });
  lucid::init_runtime(m);
  lucid::init_sgemm(m);
#if defined(__APPLE__) && defined(LUCID_WITH_MPSGRAPH)
  lucid::mpsgraph::init_mpsgraph(m);
#endif
}
