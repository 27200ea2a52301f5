/*
 * canopy.h — Canopy's C interface.
 *
 * Link with -lcanopy_malloc (or LD_PRELOAD=libcanopy_malloc.so) and the
 * standard allocation functions (malloc, free, calloc, realloc, ...) are
 * Canopy's.  This header adds the rich interface of the SAC private heap
 * manager: a size class computed once (at compile time when the size is a
 * constant), allocation and free by class, sized free, and a descriptor
 * allocated together with its data.
 *
 * Errors follow C: allocation returns NULL and sets errno to ENOMEM.
 * Freeing a pointer Canopy did not allocate, or freeing twice, is reported
 * and aborts in check mode (CANOPY_CHECK=1); in the default mode Canopy
 * refuses such a free where it can detect it and never hands the memory out
 * twice for the cases it detects (see README "Errors").
 */
#ifndef CANOPY_H
#define CANOPY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A size class: an index into Canopy's table of block sizes. */
typedef uint32_t canopy_class_t;

/* Returned by canopy_size_class for sizes above CANOPY_CLASS_MAX_SIZE. */
#define CANOPY_CLASS_NONE ((canopy_class_t)0xffffffffu)

/* Sizes up to this many bytes have a class (larger ones use malloc). */
#define CANOPY_CLASS_MAX_SIZE ((size_t)256 * 1024)

/* Number of classes. */
#define CANOPY_CLASS_COUNT 52u

/*
 * The class of a request of `size` bytes.  Pure arithmetic: with a constant
 * argument the compiler folds it, which is the compile-time arena selection
 * of the SAC heap manager.  Classes 0..7 are 16..128 bytes in steps of 16;
 * above that each power of two is split into four classes.
 * Must agree with canopy_alloc::SizeClass::of (checked by the test suite).
 */
static inline canopy_class_t canopy_size_class_inline(size_t size) {
    if (size <= 128) {
        return size == 0 ? 0u : (canopy_class_t)((size - 1) >> 4);
    }
    if (size > CANOPY_CLASS_MAX_SIZE) {
        return CANOPY_CLASS_NONE;
    }
    size_t m = size - 1;
    unsigned k = 63u - (unsigned)__builtin_clzll((unsigned long long)m);
    return (canopy_class_t)(8u + (k - 7u) * 4u + (unsigned)((m - ((size_t)1 << k)) >> (k - 2u)));
}

/* The same, computed by the library. */
canopy_class_t canopy_size_class(size_t size);

/* Block size of a class (the usable size of its blocks); 0 for an invalid class. */
size_t canopy_class_size(canopy_class_t cls);

/* Allocate one block of class `cls`.  NULL + EINVAL for an invalid class, NULL + ENOMEM when out of memory. */
void *canopy_alloc_class(canopy_class_t cls);

/* Free a block allocated with class `cls` (or with malloc of a size in that class). */
void canopy_free_class(void *p, canopy_class_t cls);

/* Free a block of class `cls` WITHOUT checking its pointer or class, for callers that know the block is live,
 * came from canopy_alloc_class(cls) or malloc of a size in class `cls` (not from realloc,
 * an aligned allocation or canopy_alloc_with_descriptor, whose class may be another: a wrong
 * class hands the block out for larger requests) and is freed exactly once, such as a runtime
 * freeing by its own reference counts.  A small block goes onto the calling thread's list
 * for the class (CANOPY_KEEP_KB of blocks per class), and its next canopy_alloc_class or
 * malloc of the class takes it back: no metadata is read.  Until then the block is marked in
 * flight, so a second free of it, through canopy_free_class_unchecked, free or
 * canopy_free_class, is still refused (the block's tag word is read first).  A full list, a
 * medium or large class, CANOPY_CHECK=1 and debug builds take the checked canopy_free_class
 * path.  The list goes home when the thread exits or calls canopy_collect. */
void canopy_free_class_unchecked(void *p, canopy_class_t cls);

/* Free a block whose requested size is known. */
void canopy_free_sized(void *p, size_t size);

/*
 * Allocate a descriptor of `desc_size` bytes and its data of `data_size`
 * bytes aligned to `data_align` (a power of two: EINVAL otherwise; up to
 * 1 GiB, ENOMEM above, as for aligned_alloc) in one block.  Returns the
 * descriptor and stores the data pointer in *data.  One call to free (or
 * canopy_free_with_descriptor) on the descriptor releases both.
 */
void *canopy_alloc_with_descriptor(size_t desc_size, size_t data_size, size_t data_align, void **data);

/* Free a block returned by canopy_alloc_with_descriptor. */
void canopy_free_with_descriptor(void *desc);

/*
 * Statistics as a JSON object written to buf (at most len bytes, always
 * NUL-terminated when len > 0).  Returns the length the full text needs,
 * excluding the NUL, like snprintf.
 */
size_t canopy_stats_json(char *buf, size_t len);

/* Print the statistics table to standard error. */
void canopy_stats_print(void);

/* Give free memory back to the operating system now; returns bytes returned. */
size_t canopy_collect(void);

/*
 * Regions (the Myrmics region API, paper 002 Fig. 1).
 *
 * A region is a pool of objects freed together.  Regions form a tree under
 * the root, which always exists.  Freeing a region frees its objects and all
 * its descendant regions, in time proportional to their slabs, not their
 * objects.  Each region is a slab pool of its own (slots of 16, 32 and 48
 * bytes below 64 and of 64-byte multiples from there, 4 KiB slabs, 1 MiB
 * pages; CANOPY_REGION_* variables change them), and its
 * metadata lives apart from its memory, so canopy_region_pack describes a
 * region tree as a few (address, length) runs.
 *
 * All calls are thread-safe (one process-wide region allocator behind a
 * lock).  Region memory is not malloc memory: free() of a region object is
 * refused (and aborts in check mode); use canopy_region_free.
 *
 * Errors: the call returns 0 / NULL / -1 / (size_t)-1, sets errno (EINVAL
 * for an unknown or freed region, a pointer no region owns, a double free,
 * an interior pointer; ENOMEM when memory runs out) and nothing changes.
 * canopy_region_error() gives the message (valid until the calling thread's
 * next failing region call).
 */

/* A region id: unique, non-zero, never reused while the region lives (nor
 * after: a stale id is reported as a freed region). */
typedef uint64_t canopy_rid_t;

/* The root region. */
#define CANOPY_REGION_ROOT ((canopy_rid_t)1)

/* One run of packed region memory. */
typedef struct canopy_run {
    uintptr_t addr;
    size_t len;
} canopy_run_t;

/* Create a region under `parent`; the level hint is recorded.  0 on error. */
canopy_rid_t canopy_ralloc(canopy_rid_t parent, int level_hint);

/* Free a region, its objects and its descendants.  0, or -1 on error
 * (the root cannot be freed). */
int canopy_rfree(canopy_rid_t region);

/* Allocate `size` bytes in `region`: aligned to the largest power of two
 * dividing the slot size (16 bytes at least, 64 for objects of 64 bytes and
 * more); objects larger than a slab are slab aligned.  NULL on error. */
void *canopy_region_alloc(size_t size, canopy_rid_t region);

/* Free one region object.  NULL is ignored.  0, or -1 on error. */
int canopy_region_free(void *p);

/* Resize `p` and/or move it to `region` (0: keep its region; p NULL:
 * allocate in `region`).  NULL on error, and then `p` is untouched. */
void *canopy_region_realloc(void *p, size_t size, canopy_rid_t region);

/* Allocate `n` objects of `size` bytes in `region` into objects[0..n).
 * 0, or -1 with none allocated. */
int canopy_region_balloc(size_t size, canopy_rid_t region, size_t n, void **objects);

/* The region whose memory holds `p`; 0 if none. */
canopy_rid_t canopy_region_of(const void *p);

/* The memory of `region` and its descendants as runs in address order,
 * adjacent slabs coalesced.  Writes at most `cap` runs (runs may be NULL
 * when cap is 0) and returns how many there are, or (size_t)-1 on error. */
size_t canopy_region_pack(canopy_rid_t region, canopy_run_t *runs, size_t cap);

/* The message of the calling thread's last failed region call ("" if none). */
const char *canopy_region_error(void);

/*
 * Sessions: many allocations in one region by one thread, without the lock
 * and the region check on every call.
 *
 *   canopy_session_t s = canopy_region_begin(r);
 *   for (i = 0; i < n; i++) nodes[i] = canopy_session_alloc(s, sizeof *nodes[i]);
 *   canopy_region_end(s);
 *
 * canopy_region_begin takes the region lock and checks the region once; until
 * canopy_region_end, canopy_session_alloc allocates in it (as
 * canopy_region_alloc does, aligned the same way) and canopy_session_free
 * frees any region object, neither taking the lock.  Meanwhile other threads'
 * region calls (and their fork()) wait, so keep sessions short.  A session
 * belongs to the thread that began it: a call with its handle from another
 * thread, or after the end, fails with EINVAL; so does any other region call
 * on that thread while its session is open (it would wait for its own lock).
 * A thread that ends with its session open ends it (with a message on
 * stderr), through a pthread key destructor: also a session begun while the
 * thread ends, in a thread_local or key destructor.  exit() runs no key
 * destructors: the caller's session stays open while the process ends.
 * fork() inside a session keeps it open in parent and child.
 */

/* A session handle: non-zero, never reused. */
typedef uint64_t canopy_session_t;

/* Begin a session in `region`.  0 on error (unknown or freed region, this
 * thread already has a session open, or no pthread key is left for the hook
 * that ends it with the thread). */
canopy_session_t canopy_region_begin(canopy_rid_t region);

/* Allocate `size` bytes in the session's region.  NULL on error. */
void *canopy_session_alloc(canopy_session_t s, size_t size);

/* Free one region object (of any region) within the session.  NULL is
 * ignored.  0, or -1 on error. */
int canopy_session_free(canopy_session_t s, void *p);

/* End the session and release the lock.  0, or -1 on error. */
int canopy_region_end(canopy_session_t s);

#ifdef __cplusplus
}
#endif

#endif /* CANOPY_H */
