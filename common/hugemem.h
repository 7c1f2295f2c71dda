/* Transparent huge pages for large arrays read at random: a shard's keys and values, a graph's
 * rows. An index search touches a few thousand rows spread over gigabytes (a 128K-token
 * Llama-3-8B store holds ~8 GB); with 4 KiB pages nearly every such row is also a TLB miss whose
 * page walk reads page tables that themselves miss the caches (and, in a virtual machine, walks
 * the host's tables too). 2 MiB pages cut the page tables of 8 GB from 16 MiB to 32 KiB.
 *
 * Advice on a malloc'd block is not enough for arrays that grow: realloc moves a large block with
 * mremap to an address of another 2 MiB offset, and the kernel then maps the moved huge pages
 * with 4 KiB entries (on the H200 host, 128K tokens: 17 GB faulted huge during a prefill, 1.3 GB
 * still mapped huge). The ra_huge_* blocks start on a 2 MiB boundary and grow in place or move
 * to another boundary, so their pages stay huge. */
#ifndef RA_HUGEMEM_H
#define RA_HUGEMEM_H

#include <stddef.h>

/* Asks the kernel to back the 2 MiB-aligned part of [p, p + bytes) with huge pages as it is
 * first touched (madvise MADV_HUGEPAGE; pages already present are left to khugepaged). Advice
 * only: RA_OK, also for a range holding no aligned 2 MiB (nothing to do), or RA_EUNSUPPORTED
 * where the kernel has no transparent huge pages. */
int ra_mem_advise_huge(void *p, size_t bytes);

/* Blocks of at least RA_HUGE_MIN bytes are anonymous mappings starting on a 2 MiB boundary,
 * advised huge; smaller ones come from malloc (a huge page for a few rows would waste most of
 * it). The caller passes the block's size back to resize and free it. */
#define RA_HUGE_MIN ((size_t)2 << 20)

/* A block of `bytes` (uninitialized contents), or NULL when out of memory. */
void *ra_huge_alloc(size_t bytes);
/* Resizes p (a block of old_bytes from these functions, or NULL with old_bytes 0) to new_bytes
 * keeping the first min(old, new) bytes; NULL when out of memory, p then unchanged. */
void *ra_huge_realloc(void *p, size_t old_bytes, size_t new_bytes);
/* Frees p, a block of `bytes` (NULL: nothing). */
void ra_huge_free(void *p, size_t bytes);

#endif
