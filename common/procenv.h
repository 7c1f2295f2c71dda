/* The process environment the libraries read once, when they load: set before main's work by
 * running the program again with it (same pid, same arguments), unless the operator chose.
 *
 *  - OMP_WAIT_POLICY=passive. libgomp's default spins idle team threads for milliseconds after
 *    every parallel region. On a machine shared with other jobs (2 cores, load 6) spinning
 *    threads steal each other's time slices and every barrier waits for a descheduled thread:
 *    SmolLM2 at 2K context decoded 2.5 tok/s spinning vs 8.4 passive, prefill 58 vs 104 tok/s.
 *    In a kv-store, attend teams, index builds and the background indexer run at once, and the
 *    spinning took the cores the indexer needed: SmolLM2 roar decode, two stores and the CPU
 *    worker on 2 cores, 277 ms/step spinning, 124-129 with GOMP_SPINCOUNT=30000, 83-88 passive.
 *    The price on a 16-core host with nothing else running: a lone attend of one layer (32
 *    heads, 32K keys) full 14.0 against 12.8 ms, flat 4.39 against 3.67. An operator's
 *    OMP_WAIT_POLICY or GOMP_SPINCOUNT is kept.
 *  - OPENBLAS_CORETYPE, only where OpenBLAS does not know the CPU: Debian 12's OpenBLAS 0.3.21
 *    takes the H200 host's Xeon (model 207) for a "Prescott" and runs SSE3 kernels, 2.7x slower
 *    (an ivf build of 131K keys on 8 threads: 1.3 s against 0.45 with SkylakeX kernels). The
 *    CPU's own features then name the kernels: SkylakeX with AVX-512, Haswell with AVX2. */
#ifndef RA_PROCENV_H
#define RA_PROCENV_H

/* Call first thing in main(). Returns when nothing needed setting, or when exec failed (the
 * program then runs with the environment it has). */
void ra_procenv_apply_defaults(char **argv);

/* The OpenBLAS core to force, or NULL to leave OpenBLAS's choice: `current` is the core
 * OpenBLAS picked (openblas_get_corename()), has_avx512 / has_avx2 what the CPU offers. */
const char *ra_procenv_blas_core(const char *current, int has_avx512, int has_avx2);

#endif
