// One name for each BLAS routine whichever BLAS the build links.
#pragma once
#if defined(LUCID_BLAS_ACCELERATE)
#include <Accelerate/Accelerate.h>
#define LUCID_SGEMM cblas_sgemm
#define LUCID_DGEMM cblas_dgemm
#define LUCID_BLAS_NAME "Accelerate"
#else
#include <cblas.h>
#define LUCID_SGEMM scipy_cblas_sgemm
#define LUCID_DGEMM scipy_cblas_dgemm
#define LUCID_BLAS_SET_THREADS scipy_openblas_set_num_threads
#define LUCID_BLAS_GET_THREADS scipy_openblas_get_num_threads
#define LUCID_BLAS_NAME "scipy-openblas32"
#endif
