/* Transparent huge pages for large arrays read at random: a shard's keys and values, a graph's
 * rows. An index search touches a few thousand rows spread over gigabytes (a 128K-token
 * Llama-3-8B store holds ~8 GB); with 4 KiB pages nearly every such row is also a TLB miss whose
 * page walk reads page tables that themselves miss the caches. 2 MiB pages cut the page tables
 * of 8 GB from 16 MiB to 32 KiB. */
#ifndef RA_HUGEMEM_H
#define RA_HUGEMEM_H

#include <stddef.h>

/* Asks the kernel to back the 2 MiB-aligned part of [p, p + bytes) with huge pages as it is
 * first touched (madvise MADV_HUGEPAGE; pages already present are left to khugepaged). Advice
 * only: RA_OK, also for a range holding no aligned 2 MiB (nothing to do), or RA_EUNSUPPORTED
 * where the kernel has no transparent huge pages. */
int ra_mem_advise_huge(void *p, size_t bytes);

#endif
