#include "hugemem.h"

#include "status.h"

#include <stdint.h>
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
