/* What the CPU can do, checked once at run time so one binary runs on any x86-64. */
#ifndef RA_CPU_H
#define RA_CPU_H

/* 1 when AVX2, FMA and F16C are all usable (the kernels in vec.c and half.c need all three). */
int ra_cpu_has_avx2(void);

/* 1 when AVX-512 F, BW, DQ, VL and VNNI are usable (and with them ra_cpu_has_avx2's set): Ice
 * Lake, Cascade Lake and Zen 4 onwards; VNNI is what the int8 Q K^T (vec_i8.c) needs. */
int ra_cpu_has_avx512(void);

#endif
