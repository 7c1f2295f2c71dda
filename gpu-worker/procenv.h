/* Process environment for the CPU backend's thread pool.
 *
 * libgomp reads OMP_WAIT_POLICY once, when it is loaded, and by default spins at barriers. On a
 * machine shared with other jobs (2 cores, load 6 while measuring) spinning threads steal each
 * other's time slices and every barrier waits for a descheduled thread: measured on SmolLM2 at
 * 2K context, decode ran 2.5 tok/s spinning vs 8.4 tok/s passive, prefill 58 vs 104 tok/s. */
#ifndef RA_PROCENV_H
#define RA_PROCENV_H

/* When OMP_WAIT_POLICY is unset, sets it to "passive" and re-executes the program with the same
 * arguments (so libgomp starts with it); returns only when nothing needed doing or exec failed.
 * Call first thing in main(). An explicit OMP_WAIT_POLICY=active is respected. */
void ra_procenv_prefer_passive_omp(char **argv);

#endif
