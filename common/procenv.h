/* The process environment the libraries read once, when they load: set before main's work by
 * running the program again with it (same pid, same arguments), unless the operator chose.
 *
 *  - OMP_WAIT_POLICY=passive. libgomp's default spins idle team threads for milliseconds after
 *    every parallel region; on a shared machine, and in a kv-store where attend teams, builds
 *    and the background indexer run at once, the spinning threads take the cores the others
 *    need. An operator's OMP_WAIT_POLICY or GOMP_SPINCOUNT is kept.
 *  - OPENBLAS_CORETYPE, only where OpenBLAS does not know the CPU (Debian 12's 0.3.21 runs SSE3
 *    kernels on the H200 host's Xeon): the CPU's own features then name the kernels, SkylakeX
 *    with AVX-512, Haswell with AVX2.
 * Measurements: bench/results/defaults/README.md. */
#ifndef RA_PROCENV_H
#define RA_PROCENV_H

/* Call first thing in main(). Returns when nothing needed setting, or when exec failed (the
 * program then runs with the environment it has). */
void ra_procenv_apply_defaults(char **argv);

/* The OpenBLAS core to force, or NULL to leave OpenBLAS's choice: `current` is the core
 * OpenBLAS picked (openblas_get_corename()), has_avx512 / has_avx2 what the CPU offers. */
const char *ra_procenv_blas_core(const char *current, int has_avx512, int has_avx2);

#endif
