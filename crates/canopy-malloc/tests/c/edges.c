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

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "";
    if (strcmp(what, "huge-alignment") == 0) {
        huge_alignment();
    } else {
        fprintf(stderr, "edges: unknown case \"%s\"\n", what);
        return 2;
    }
    printf("edges %s ok\n", what);
    return 0;
}
