/* Internal to the CUDA backend: the tensor-core tile operation of the mma.sync kernels
 * (prefill attention, the matmul of a few rows of x), one m16n8k16 tile with fp32 accumulation. */
#ifndef RA_CUDA_MMA_CUH
#define RA_CUDA_MMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

/* The operand type's two primitives: a pair of floats rounded into one 32-bit register, and
 * C += A B on one m16n8k16 tile (A 4, B 2 registers of packed pairs; C 4 floats). */
#define RA_MMA_16816(T)                                                                                        \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." T "." T ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, " \
               "{%0,%1,%2,%3};\n"                                                                             \
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                               \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
template <typename MT> struct ra_mma_traits {
  static __device__ __forceinline__ uint32_t pack(float x, float y) {
    if constexpr (std::is_same<MT, __half>::value) {
      __half2 h = __floats2half2_rn(x, y);
      return *(uint32_t *)&h;
    } else {
      __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
      return *(uint32_t *)&h;
    }
  }
  static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    if constexpr (std::is_same<MT, __half>::value)
      RA_MMA_16816("f16");
    else
      RA_MMA_16816("bf16");
  }
  /* two n8 tiles: c0 += A B0, c1 += A B1 with b = an ldmatrix x4 of B0 (b[0..1]), B1 (b[2..3]) */
  static __device__ __forceinline__ void mma_n16(float c0[4], float c1[4], const uint32_t a[4], const uint32_t b[4]) {
    mma(c0, a, b[0], b[1]);
    mma(c1, a, b[2], b[3]);
  }
};
#undef RA_MMA_16816

#endif
