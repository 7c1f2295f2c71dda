/* Clocks, read in one place: the monotonic wall clock for timings and deadlines, and CPU time
 * (a thread's or the process's) for costs on a shared machine, where wall time also counts the
 * time the thread waited for a core. */
#ifndef RA_CLOCK_H
#define RA_CLOCK_H

#include <stdint.h>

uint64_t ra_clock_now_us(void); /* monotonic */
uint64_t ra_clock_now_ns(void); /* monotonic, for spans of a few microseconds */
double ra_clock_now_s(void);    /* monotonic */
uint64_t ra_clock_thread_cpu_us(void);
double ra_clock_thread_cpu_s(void);
double ra_clock_process_cpu_s(void); /* every thread's */

#endif
