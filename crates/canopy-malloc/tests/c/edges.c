/* Edge cases of the C API and the region API, one per argument, linked
 * against libcanopy_malloc.  Prints "edges <case> ok" and exits 0 on
 * success; a failure prints what and exits 1. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "canopy.h"

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "edges: check failed at line %d: %s (errno %d, region error \"%s\")\n", __LINE__, #c, errno, canopy_region_error()); exit(1); } } while (0)

/* Alignments beyond the arena's own (1 GiB): null with ENOMEM, or a block
 * that really is aligned; never a misaligned block. */
static void huge_alignment(void) {
    for (int s = 20; s < 64; s++) {
        size_t a = (size_t)1 << s;
        errno = 0;
        void *p = aligned_alloc(a, 16);
        CHECK((p == NULL && errno == ENOMEM) || (p != NULL && (uintptr_t)p % a == 0));
        free(p);
        errno = 0;
        p = memalign(a, 100000);
        CHECK((p == NULL && errno == ENOMEM) || (p != NULL && (uintptr_t)p % a == 0));
        free(p);
        void *out = (void *)1;
        int r = posix_memalign(&out, a, 1 << 20);
        CHECK((r == ENOMEM && out == (void *)1) || (r == 0 && (uintptr_t)out % a == 0));
        if (r == 0) free(out);
    }
}

/* A region object grown to a size no region can hold: NULL with an errno,
 * the object untouched. */
static void region_realloc_huge(void) {
    canopy_rid_t r = canopy_ralloc(CANOPY_REGION_ROOT, 0);
    CHECK(r != 0);
    size_t sizes[] = {SIZE_MAX, SIZE_MAX - 100000, SIZE_MAX / 2, (size_t)1 << 60};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        unsigned char *p = canopy_region_alloc(100000, r);
        CHECK(p != NULL);
        memset(p, 0x3c, 100000);
        errno = 0;
        CHECK(canopy_region_realloc(p, sizes[i], 0) == NULL && errno != 0);
        CHECK(canopy_region_of(p) == r && canopy_region_of(p + 99999) == r);
        for (size_t j = 0; j < 100000; j += 997) CHECK(p[j] == 0x3c);
        CHECK(canopy_region_free(p) == 0);
    }
    CHECK(canopy_rfree(r) == 0);
}

/* A size no region can hold is memory that runs out, as for malloc: ENOMEM
 * (canopy.h keeps EINVAL for bad regions and pointers), whatever the size. */
static void region_too_large_is_enomem(void) {
    canopy_rid_t r = canopy_ralloc(CANOPY_REGION_ROOT, 0);
    CHECK(r != 0);
    size_t sizes[] = {(size_t)1 << 40, (size_t)1 << 50, SIZE_MAX / 2, SIZE_MAX};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        errno = 0;
        CHECK(canopy_region_alloc(sizes[i], r) == NULL && errno == ENOMEM);
        void *objs[2] = {NULL, NULL};
        errno = 0;
        CHECK(canopy_region_balloc(sizes[i], r, 2, objs) == -1 && errno == ENOMEM && objs[0] == NULL);
        void *p = canopy_region_alloc(100000, r);
        CHECK(p != NULL);
        errno = 0;
        CHECK(canopy_region_realloc(p, sizes[i], 0) == NULL && errno == ENOMEM);
        errno = 0;
        CHECK(canopy_region_realloc(NULL, sizes[i], r) == NULL && errno == ENOMEM);
        CHECK(canopy_region_free(p) == 0);
    }
    CHECK(canopy_rfree(r) == 0);
}

/* canopy_region_balloc of no objects still checks its region, whatever the
 * size (canopy.h: -1 and EINVAL for an unknown or freed region). */
static void region_balloc_none_checks_region(void) {
    canopy_rid_t dead = canopy_ralloc(CANOPY_REGION_ROOT, 0);
    CHECK(dead != 0 && canopy_rfree(dead) == 0);
    size_t sizes[] = {16, 5000, 1 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        errno = 0;
        CHECK(canopy_region_balloc(sizes[i], 987654321, 0, NULL) == -1 && errno == EINVAL);
        CHECK(strstr(canopy_region_error(), "does not exist") != NULL);
        errno = 0;
        CHECK(canopy_region_balloc(sizes[i], dead, 0, NULL) == -1 && errno == EINVAL);
        CHECK(strstr(canopy_region_error(), "has been freed") != NULL);
        CHECK(canopy_region_balloc(sizes[i], CANOPY_REGION_ROOT, 0, NULL) == 0);
    }
}

/* canopy_region_balloc of more objects than memory can list fails with -1
 * and ENOMEM, like calloc of an impossible count; it does not abort. */
static void region_balloc_huge_count(void) {
    canopy_rid_t r = canopy_ralloc(CANOPY_REGION_ROOT, 0);
    CHECK(r != 0);
    size_t counts[] = {SIZE_MAX, SIZE_MAX / 8, (size_t)1 << 40};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        void *objs[4] = {NULL, NULL, NULL, NULL};
        errno = 0;
        CHECK(canopy_region_balloc(16, r, counts[i], objs) == -1 && errno == ENOMEM && objs[0] == NULL);
    }
    size_t nruns = canopy_region_pack(r, NULL, 0);
    CHECK(nruns == 0);
    CHECK(canopy_rfree(r) == 0);
}

/* The program's first calls into the allocator are frees and size queries
 * of null, before anything was allocated (`sort` frees null in `setlocale`
 * before its first malloc): nothing happens, and allocation works after. */
static void *volatile null_ptr; /* not a constant: the compiler drops free(NULL) */

static void null_before_the_first_allocation(void) {
    free(null_ptr);
    free(null_ptr);
    CHECK(malloc_usable_size(null_ptr) == 0);
    void *p = realloc(null_ptr, 40);
    CHECK(p != NULL);
    memset(p, 7, 40);
    CHECK(malloc_usable_size(p) >= 40);
    free(p);
}

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "";
    if (strcmp(what, "null-first") == 0) {
        /* First, before anything else in the program allocates. */
        null_before_the_first_allocation();
    } else if (strcmp(what, "huge-alignment") == 0) {
        huge_alignment();
    } else if (strcmp(what, "region-realloc-huge") == 0) {
        region_realloc_huge();
    } else if (strcmp(what, "region-too-large") == 0) {
        region_too_large_is_enomem();
    } else if (strcmp(what, "region-balloc-none") == 0) {
        region_balloc_none_checks_region();
    } else if (strcmp(what, "region-balloc-huge-count") == 0) {
        region_balloc_huge_count();
    } else {
        fprintf(stderr, "edges: unknown case \"%s\"\n", what);
        return 2;
    }
    printf("edges %s ok\n", what);
    return 0;
}
