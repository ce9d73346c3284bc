/* OpenMP when the build has it, single-threaded stand-ins when it does not. */
#ifndef GGUFLM_OMP_COMPAT_H
#define GGUFLM_OMP_COMPAT_H

#ifdef _OPENMP
#include <omp.h>
#define GGUFLM_HAVE_OPENMP 1
#else
#define GGUFLM_HAVE_OPENMP 0
static inline int omp_get_thread_num(void) { return 0; }
static inline int omp_get_num_threads(void) { return 1; }
static inline int omp_get_max_threads(void) { return 1; }
static inline int omp_get_num_procs(void) { return 1; }
#endif

#endif
