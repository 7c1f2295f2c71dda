#include "pb_arena.h"

#include <stdint.h>
#include <stdlib.h>

/* room for the message's structs and repeated-field arrays beside its bytes */
#define PB_ARENA_SLACK 65536
#define PB_ARENA_ALIGN 64

static int in_block(const pb_arena *a, const void *p) {
  const unsigned char *c = p;
  return a->block && c >= a->block && c < a->block + a->cap;
}

static void *arena_alloc(void *data, size_t n) {
  pb_arena *a = data;
  size_t at = (a->used + PB_ARENA_ALIGN - 1) & ~(size_t)(PB_ARENA_ALIGN - 1);
  if (a->block && at <= a->cap && n <= a->cap - at) {
    a->used = at + n;
    return a->block + at;
  }
  return malloc(n ? n : 1);
}

static void arena_free(void *data, void *p) {
  if (p && !in_block(data, p)) free(p);
}

void pb_arena_reset(pb_arena *a, size_t len) {
  a->used = 0;
  a->alloc = (ProtobufCAllocator){.alloc = arena_alloc, .free = arena_free, .allocator_data = a};
  if (len > SIZE_MAX - PB_ARENA_SLACK) return;
  size_t want = len + PB_ARENA_SLACK;
  if (want <= a->cap) return;
  void *p = NULL;
  if (posix_memalign(&p, PB_ARENA_ALIGN, want) != 0) return;
  free(a->block);
  a->block = p;
  a->cap = want;
}

ProtobufCAllocator *pb_arena_allocator(pb_arena *a) { return &a->alloc; }

void pb_arena_free(pb_arena *a) {
  free(a->block);
  *a = (pb_arena){0};
}
