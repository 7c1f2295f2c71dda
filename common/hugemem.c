#include "hugemem.h"

#include "status.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define HUGE_PAGE ((uintptr_t)2 << 20)

int ra_mem_advise_huge(void *p, size_t bytes) {
  uintptr_t lo = ((uintptr_t)p + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
  uintptr_t hi = ((uintptr_t)p + bytes) & ~(HUGE_PAGE - 1);
  if (!p || hi <= lo) return RA_OK;
#ifdef MADV_HUGEPAGE
  return madvise((void *)lo, hi - lo, MADV_HUGEPAGE) == 0 ? RA_OK : RA_EUNSUPPORTED;
#else
  return RA_EUNSUPPORTED;
#endif
}

static int is_huge(size_t bytes) { return bytes >= RA_HUGE_MIN; }

/* More than this cannot be rounded up to whole huge pages and mapped with one page of slack. */
#define HUGE_MAX ((size_t)SIZE_MAX - 2 * HUGE_PAGE)

/* The mapping's length: whole huge pages (bytes <= HUGE_MAX). */
static size_t map_len(size_t bytes) { return (bytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1); }

/* len bytes (a multiple of HUGE_PAGE, <= HUGE_MAX) of address space on a HUGE_PAGE boundary,
 * mapped with `prot`; MAP_FAILED on failure. Maps a huge page more than asked and trims both
 * ends. */
static void *map_aligned(size_t len, int prot) {
  char *raw = mmap(NULL, len + HUGE_PAGE, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return MAP_FAILED;
  char *p = (char *)(((uintptr_t)raw + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1));
  if (p > raw) munmap(raw, (size_t)(p - raw));
  size_t tail = (size_t)(raw + len + HUGE_PAGE - (p + len));
  if (tail) munmap(p + len, tail);
  return p;
}

void *ra_huge_alloc(size_t bytes) {
  if (!is_huge(bytes)) return malloc(bytes ? bytes : 1);
  if (bytes > HUGE_MAX) return NULL;
  const size_t len = map_len(bytes);
  void *p = map_aligned(len, PROT_READ | PROT_WRITE);
  if (p == MAP_FAILED) return NULL;
  (void)ra_mem_advise_huge(p, len);
  return p;
}

void ra_huge_free(void *p, size_t bytes) {
  if (!p) return;
  if (is_huge(bytes))
    munmap(p, map_len(bytes));
  else
    free(p);
}

void *ra_huge_realloc(void *p, size_t old_bytes, size_t new_bytes) {
  if (!p) return ra_huge_alloc(new_bytes);
  if (new_bytes > HUGE_MAX) return NULL;
  if (!is_huge(old_bytes) && !is_huge(new_bytes)) return realloc(p, new_bytes ? new_bytes : 1);
  if (is_huge(old_bytes) != is_huge(new_bytes)) {
    /* Crossing the threshold: another kind of block, so a copy (of less than RA_HUGE_MIN on
     * the way up). */
    void *q = ra_huge_alloc(new_bytes);
    if (!q) return NULL;
    memcpy(q, p, old_bytes < new_bytes ? old_bytes : new_bytes);
    ra_huge_free(p, old_bytes);
    return q;
  }
  const size_t old_len = map_len(old_bytes), new_len = map_len(new_bytes);
  if (old_len == new_len) return p;
  /* In place when the address space after the block is free (and always when shrinking). */
  void *q = mremap(p, old_len, new_len, 0);
  if (q == MAP_FAILED) {
    /* Elsewhere, onto a reserved 2 MiB boundary: the kernel moves the page tables, huge entries
     * whole, without copying. */
    void *at = map_aligned(new_len, PROT_NONE);
    if (at == MAP_FAILED) return NULL;
    q = mremap(p, old_len, new_len, MREMAP_MAYMOVE | MREMAP_FIXED, at);
    if (q == MAP_FAILED) {
      munmap(at, new_len);
      return NULL;
    }
  }
  (void)ra_mem_advise_huge(q, new_len);
  return q;
}
