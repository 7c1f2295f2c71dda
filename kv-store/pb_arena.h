/* A protobuf-c allocator over one reusable block: a request's unpacked fields (a PutKv chunk's
 * 2 MiB key and value copies) land in memory the stream already owns instead of a fresh malloc
 * per message, which glibc served from newly faulted, zeroed pages (a third of a store's PutKv
 * time: bench/results/kvstore-ingest/).
 *
 *   pb_arena a = {0};
 *   pb_arena_reset(&a, len);                       before each unpack of a len-byte message
 *   M *m = m__unpack(pb_arena_allocator(&a), len, data);
 *   m__free_unpacked(m, pb_arena_allocator(&a));   (frees nothing of the block)
 *   pb_arena_free(&a);                             at the stream's end */
#ifndef KVS_PB_ARENA_H
#define KVS_PB_ARENA_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>

typedef struct pb_arena {
  unsigned char *block;
  size_t cap, used;
  ProtobufCAllocator alloc; /* set by pb_arena_reset */
} pb_arena;

/* Empties the arena and makes room for the unpack of a len-byte message (its fields take at
 * most len bytes plus the structs); on no memory the block stays as it was and allocations the
 * block cannot hold fall back to malloc. */
void pb_arena_reset(pb_arena *a, size_t len);
ProtobufCAllocator *pb_arena_allocator(pb_arena *a);
void pb_arena_free(pb_arena *a);

#endif
