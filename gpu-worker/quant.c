#include "quant.h"

#include "half.h"
#include "status.h"

#include <string.h>

#define QK 32   /* values per legacy block */
#define QK_K 256 /* values per k-quant super-block */

typedef struct type_info {
  const char *name;
  size_t block_size;
  size_t block_bytes;
} type_info;

static type_info info_of(uint32_t type) {
  switch (type) {
    case RA_GGML_F32: return (type_info){"F32", 1, 4};
    case RA_GGML_F16: return (type_info){"F16", 1, 2};
    case RA_GGML_BF16: return (type_info){"BF16", 1, 2};
    case RA_GGML_Q4_0: return (type_info){"Q4_0", QK, 2 + QK / 2};
    case RA_GGML_Q4_1: return (type_info){"Q4_1", QK, 4 + QK / 2};
    case RA_GGML_Q5_0: return (type_info){"Q5_0", QK, 2 + 4 + QK / 2};
    case RA_GGML_Q5_1: return (type_info){"Q5_1", QK, 4 + 4 + QK / 2};
    case RA_GGML_Q8_0: return (type_info){"Q8_0", QK, 2 + QK};
    case RA_GGML_Q2_K: return (type_info){"Q2_K", QK_K, QK_K / 16 + QK_K / 4 + 4};
    case RA_GGML_Q3_K: return (type_info){"Q3_K", QK_K, QK_K / 8 + QK_K / 4 + 12 + 2};
    case RA_GGML_Q4_K: return (type_info){"Q4_K", QK_K, 4 + 12 + QK_K / 2};
    case RA_GGML_Q5_K: return (type_info){"Q5_K", QK_K, 4 + 12 + QK_K / 8 + QK_K / 2};
    case RA_GGML_Q6_K: return (type_info){"Q6_K", QK_K, QK_K / 2 + QK_K / 4 + QK_K / 16 + 2};
    default: return (type_info){"?", 0, 0};
  }
}

int ra_quant_supported(uint32_t type) { return info_of(type).block_size != 0; }
const char *ra_quant_name(uint32_t type) { return info_of(type).name; }
size_t ra_quant_block_size(uint32_t type) { return info_of(type).block_size; }
size_t ra_quant_block_bytes(uint32_t type) { return info_of(type).block_bytes; }

int ra_quant_row_bytes(uint32_t type, uint64_t n, size_t *out) {
  type_info ti = info_of(type);
  if (ti.block_size == 0 || n % ti.block_size != 0) return RA_EINVAL;
  uint64_t blocks = n / ti.block_size;
  if (blocks > SIZE_MAX / ti.block_bytes) return RA_EFORMAT;
  *out = (size_t)(blocks * ti.block_bytes);
  return RA_OK;
}

static inline float load_f16(const uint8_t *p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return ra_fp16_to_fp32(h);
}

/* Block layouts (bytes, in order):
 *   Q4_0: d f16 | qs[16]           x = (nibble - 8) * d; low nibbles are values 0..15, high 16..31
 *   Q4_1: d f16 | m f16 | qs[16]   x = nibble * d + m
 *   Q5_0: d f16 | qh u32 | qs[16]  fifth bit of value j is bit j of qh; x = (q5 - 16) * d
 *   Q5_1: d | m | qh | qs[16]      x = q5 * d + m
 *   Q8_0: d f16 | qs int8[32]      x = q * d */
static void dq_q4_0(const uint8_t *b, float *y) {
  float d = load_f16(b);
  const uint8_t *qs = b + 2;
  for (int j = 0; j < QK / 2; j++) {
    y[j] = (float)((qs[j] & 0x0f) - 8) * d;
    y[j + QK / 2] = (float)((qs[j] >> 4) - 8) * d;
  }
}

static void dq_q4_1(const uint8_t *b, float *y) {
  float d = load_f16(b), m = load_f16(b + 2);
  const uint8_t *qs = b + 4;
  for (int j = 0; j < QK / 2; j++) {
    y[j] = (float)(qs[j] & 0x0f) * d + m;
    y[j + QK / 2] = (float)(qs[j] >> 4) * d + m;
  }
}

static void dq_q5(const uint8_t *b, float *y, int has_min) {
  float d = load_f16(b), m = has_min ? load_f16(b + 2) : 0.0f;
  const uint8_t *p = b + (has_min ? 4 : 2);
  uint32_t qh;
  memcpy(&qh, p, 4);
  const uint8_t *qs = p + 4;
  int off = has_min ? 0 : 16;
  for (int j = 0; j < QK / 2; j++) {
    int lo = (qs[j] & 0x0f) | (int)(((qh >> j) & 1u) << 4);
    int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
    y[j] = (float)(lo - off) * d + m;
    y[j + QK / 2] = (float)(hi - off) * d + m;
  }
}

static void dq_q8_0(const uint8_t *b, float *y) {
  float d = load_f16(b);
  const int8_t *qs = (const int8_t *)(b + 2);
  for (int j = 0; j < QK; j++) y[j] = (float)qs[j] * d;
}

/* Q2_K: scales[16] | qs[64] | d f16 | dmin f16. Each 16-value group g has a 4-bit scale
 * (low nibble) and 4-bit min (high nibble); values are 2-bit, four per byte across 4 passes. */
static void dq_q2_k(const uint8_t *b, float *y) {
  const uint8_t *sc = b, *q = b + 16;
  float d = load_f16(b + 80), dmin = load_f16(b + 82);
  int is = 0;
  for (int half = 0; half < 2; half++) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int g = 0; g < 2; g++) {
        float dl = d * (float)(sc[is] & 0x0f), ml = dmin * (float)(sc[is] >> 4);
        is++;
        for (int l = 0; l < 16; l++) *y++ = dl * (float)((q[g * 16 + l] >> shift) & 3) - ml;
      }
    }
    q += 32;
  }
}

/* Q3_K: hmask[32] | qs[64] | scales[12] | d f16. Sixteen 6-bit signed scales (bias 32) are
 * packed as 4 low bits in the first 8 bytes and 2 high bits in the last 4; values are 2 low
 * bits from qs plus a high bit from hmask (a clear high bit subtracts 4). */
static void dq_q3_k(const uint8_t *b, float *y) {
  const uint8_t *hm = b, *q = b + 32, *s = b + 96;
  float d = load_f16(b + 108);
  int8_t scales[16];
  for (int i = 0; i < 16; i++) {
    int lo = i < 8 ? (s[i] & 0x0f) : (s[i - 8] >> 4);
    int hi = (s[8 + (i % 4)] >> (2 * (i / 4))) & 3;
    scales[i] = (int8_t)((lo | (hi << 4)) - 32);
  }
  int is = 0;
  uint8_t mbit = 1;
  for (int half = 0; half < 2; half++) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int g = 0; g < 2; g++) {
        float dl = d * (float)scales[is++];
        for (int l = 0; l < 16; l++) {
          int v = (q[g * 16 + l] >> shift) & 3;
          if (!(hm[g * 16 + l] & mbit)) v -= 4;
          *y++ = dl * (float)v;
        }
      }
      mbit = (uint8_t)(mbit << 1);
    }
    q += 32;
  }
}

/* The 6-bit scale and min of sub-block j (0..7) of Q4_K/Q5_K: the first four live in the low
 * 6 bits of bytes j and j+4; the last four take 4 bits from byte j+4 and 2 bits from the tops
 * of bytes j-4 and j. */
static void kscale_min(int j, const uint8_t *s, int *sc, int *mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

/* Q4_K: d f16 | dmin f16 | scales[12] | qs[128]; 8 sub-blocks of 32, x = d*sc*q - dmin*mn.
 * Q5_K adds qh[32] before qs: bit (2*pass) / (2*pass+1) of qh[l] is the fifth bit. */
static void dq_q45_k(const uint8_t *b, float *y, int five) {
  float d = load_f16(b), dmin = load_f16(b + 2);
  const uint8_t *s = b + 4;
  const uint8_t *qh = b + 16;
  const uint8_t *q = b + 16 + (five ? 32 : 0);
  for (int pass = 0; pass < 4; pass++) {
    int sc, mn;
    kscale_min(2 * pass, s, &sc, &mn);
    float d1 = d * (float)sc, m1 = dmin * (float)mn;
    kscale_min(2 * pass + 1, s, &sc, &mn);
    float d2 = d * (float)sc, m2 = dmin * (float)mn;
    for (int l = 0; l < 32; l++) {
      int v = q[l] & 0x0f;
      if (five && (qh[l] >> (2 * pass) & 1)) v += 16;
      y[l] = d1 * (float)v - m1;
    }
    for (int l = 0; l < 32; l++) {
      int v = q[l] >> 4;
      if (five && (qh[l] >> (2 * pass + 1) & 1)) v += 16;
      y[32 + l] = d2 * (float)v - m2;
    }
    y += 64;
    q += 32;
  }
}

/* Q6_K: ql[128] | qh[64] | scales int8[16] | d f16. Each 128-value half uses 64 ql bytes
 * (low nibbles, then high nibbles) and 32 qh bytes (2 bits per value); x = d*scale*(q6 - 32). */
static void dq_q6_k(const uint8_t *b, float *y) {
  const uint8_t *ql = b, *qh = b + 128;
  const int8_t *sc = (const int8_t *)(b + 192);
  float d = load_f16(b + 208);
  for (int half = 0; half < 2; half++) {
    for (int l = 0; l < 32; l++) {
      int is = l / 16;
      int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
      int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
      int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * (float)sc[is] * (float)q1;
      y[l + 32] = d * (float)sc[is + 2] * (float)q2;
      y[l + 64] = d * (float)sc[is + 4] * (float)q3;
      y[l + 96] = d * (float)sc[is + 6] * (float)q4;
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

void ra_quant_dequantize(uint32_t type, const void *src, float *dst, size_t n) {
  const uint8_t *b = src;
  type_info ti = info_of(type);
  if (type == RA_GGML_F32) {
    memcpy(dst, src, n * sizeof(float));
    return;
  }
  if (type == RA_GGML_F16 || type == RA_GGML_BF16) {
    /* The bulk converters want aligned uint16 input; copy through a small stack chunk. */
    uint16_t tmp[1024];
    for (size_t i = 0; i < n; i += 1024) {
      size_t c = n - i < 1024 ? n - i : 1024;
      memcpy(tmp, b + 2 * i, 2 * c);
      if (type == RA_GGML_F16)
        ra_fp16_to_fp32_n(tmp, dst + i, c);
      else
        ra_bf16_to_fp32_n(tmp, dst + i, c);
    }
    return;
  }
  for (size_t i = 0; i < n / ti.block_size; i++, b += ti.block_bytes, dst += ti.block_size) {
    switch (type) {
      case RA_GGML_Q4_0: dq_q4_0(b, dst); break;
      case RA_GGML_Q4_1: dq_q4_1(b, dst); break;
      case RA_GGML_Q5_0: dq_q5(b, dst, 0); break;
      case RA_GGML_Q5_1: dq_q5(b, dst, 1); break;
      case RA_GGML_Q8_0: dq_q8_0(b, dst); break;
      case RA_GGML_Q2_K: dq_q2_k(b, dst); break;
      case RA_GGML_Q3_K: dq_q3_k(b, dst); break;
      case RA_GGML_Q4_K: dq_q45_k(b, dst, 0); break;
      case RA_GGML_Q5_K: dq_q45_k(b, dst, 1); break;
      case RA_GGML_Q6_K: dq_q6_k(b, dst); break;
      default: return;
    }
  }
}
