// One name for sgemm whichever BLAS the build links.
#pragma once
#if defined(LUCID_BLAS_ACCELERATE)
#include <Accelerate/Accelerate.h>
#define LUCID_SGEMM cblas_sgemm
#define LUCID_BLAS_NAME "Accelerate"
#else
#include <cblas.h>
#define LUCID_SGEMM scipy_cblas_sgemm
#define LUCID_BLAS_NAME "scipy-openblas32"
#endif
