/* The C API under LD_PRELOAD: contents, alignment, errno, sizes, rich interface.
 * Prints "api ok" and exits 0 on success; any failure prints what and exits 1. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "canopy.h"

__attribute__((weak)) void free_sized(void *p, size_t size);
__attribute__((weak)) void free_aligned_sized(void *p, size_t align, size_t size);

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "api: check failed at line %d: %s\n", __LINE__, #c); exit(1); } } while (0)

static void *volatile sink;

/* Successful calls leave errno as it was, including a thread's first
 * allocation (which gives it a heap) and the paths through the global heap. */
static void *errno_kept(void *marker) {
    int m = (int)(intptr_t)marker;
    errno = m;
    char *p = malloc(100);
    CHECK(p != NULL && errno == m);
    p = realloc(p, 5000);
    CHECK(p != NULL && errno == m);
    free(p);
    CHECK(errno == m);
    char *big = calloc(1, 8 << 20);
    CHECK(big != NULL && big[12345] == 0 && errno == m);
    big = realloc(big, 16 << 20);
    CHECK(big != NULL && errno == m);
    free(big);
    void *a = aligned_alloc(4096, 4096);
    CHECK(a != NULL && errno == m);
    free(a);
    CHECK(errno == m);
    return NULL;
}

int main(void) {
    /* The allocator in use must be Canopy. */
    CHECK(dlsym(RTLD_DEFAULT, "canopy_alloc_class") != NULL);
    CHECK(free_sized != NULL && free_aligned_sized != NULL);

    /* Every size from 0 to 300000 in steps, contents kept. */
    for (size_t n = 0; n < 300000; n = n < 64 ? n + 1 : n * 5 / 4) {
        unsigned char *p = malloc(n);
        CHECK(p != NULL);
        CHECK(((uintptr_t)p & 15) == 0);
        CHECK(malloc_usable_size(p) >= n);
        memset(p, (int)(n & 255), n);
        unsigned char *q = realloc(p, n * 2 + 1);
        CHECK(q != NULL);
        for (size_t i = 0; i < n; i++) CHECK(q[i] == (unsigned char)(n & 255));
        free(q);
    }
    /* calloc zeroes, also after reuse. */
    for (int r = 0; r < 3; r++) {
        for (size_t n = 1; n < (8u << 20); n *= 3) {
            unsigned char *p = malloc(n);
            memset(p, 0xEE, n);
            free(p);
            unsigned char *z = calloc(n, 1);
            CHECK(z != NULL);
            for (size_t i = 0; i < n; i += 7) CHECK(z[i] == 0);
            CHECK(z[n - 1] == 0);
            free(z);
        }
    }
    /* Errors the C way. */
    errno = 0;
    sink = malloc(SIZE_MAX);
    CHECK(sink == NULL && errno == ENOMEM);
    errno = 0;
    sink = calloc(SIZE_MAX / 2, 3);
    CHECK(sink == NULL && errno == ENOMEM);
    errno = 0;
    sink = reallocarray(NULL, SIZE_MAX / 2, 3);
    CHECK(sink == NULL && errno == ENOMEM);
    void *out = (void *)1;
    CHECK(posix_memalign(&out, 3, 10) == EINVAL && out == (void *)1);
    CHECK(posix_memalign(&out, 4, 10) == EINVAL);
    errno = 0;
    sink = aligned_alloc(24, 10);
    CHECK(sink == NULL && errno == EINVAL);
    /* Alignment. */
    for (size_t a = 8; a <= (4u << 20); a *= 2) {
        for (size_t n = 1; n < (3u << 20); n = n * 7 + 3) {
            void *p = NULL;
            CHECK(posix_memalign(&p, a < sizeof(void *) ? sizeof(void *) : a, n) == 0);
            CHECK(((uintptr_t)p % a) == 0);
            memset(p, 1, n);
            free(p);
            p = aligned_alloc(a, n);
            CHECK(p && ((uintptr_t)p % a) == 0);
            free_aligned_sized(p, a, n);
            p = memalign(a, n);
            CHECK(p && ((uintptr_t)p % a) == 0);
            free(p);
        }
    }
    void *v = valloc(100);
    CHECK(v && ((uintptr_t)v & 4095) == 0);
    free(v);
    v = pvalloc(5000);
    CHECK(v && ((uintptr_t)v & 4095) == 0 && malloc_usable_size(v) >= 8192);
    free(v);
    /* Sized free and the rich interface. */
    for (size_t n = 1; n < 100000; n = n * 3 + 1) {
        void *p = malloc(n);
        free_sized(p, n);
    }
    unsigned (*size_class)(size_t) = (unsigned (*)(size_t))dlsym(RTLD_DEFAULT, "canopy_size_class");
    size_t (*class_size)(unsigned) = (size_t (*)(unsigned))dlsym(RTLD_DEFAULT, "canopy_class_size");
    void *(*alloc_class)(unsigned) = (void *(*)(unsigned))dlsym(RTLD_DEFAULT, "canopy_alloc_class");
    void (*free_class)(void *, unsigned) = (void (*)(void *, unsigned))dlsym(RTLD_DEFAULT, "canopy_free_class");
    void *(*with_desc)(size_t, size_t, size_t, void **) = (void *(*)(size_t, size_t, size_t, void **))dlsym(RTLD_DEFAULT, "canopy_alloc_with_descriptor");
    size_t (*stats_json)(char *, size_t) = (size_t (*)(char *, size_t))dlsym(RTLD_DEFAULT, "canopy_stats_json");
    CHECK(size_class && class_size && alloc_class && free_class && with_desc && stats_json);
    /* The header's inline class computation agrees with the library's. */
    for (size_t n = 0; n <= CANOPY_CLASS_MAX_SIZE + 1000; n++) {
        CHECK(canopy_size_class_inline(n) == size_class(n));
    }
    CHECK(canopy_size_class_inline(CANOPY_CLASS_MAX_SIZE + 1) == CANOPY_CLASS_NONE);
    CHECK(size_class(CANOPY_CLASS_COUNT - 1) != CANOPY_CLASS_NONE && class_size(CANOPY_CLASS_COUNT) == 0);
    unsigned c = size_class(100);
    CHECK(class_size(c) >= 100);
    for (int i = 0; i < 1000; i++) {
        char *p = alloc_class(c);
        CHECK(p);
        memset(p, 3, 100);
        free_class(p, c);
    }
    errno = 0;
    CHECK(alloc_class(999) == NULL && errno == EINVAL);
    /* The unchecked free: null is ignored; a small block comes back on the
     * next allocation of its class (from the thread's list by default, as the
     * lowest free slot in check mode); medium blocks take the checked path. */
    void (*free_unchecked)(void *, unsigned) = (void (*)(void *, unsigned))dlsym(RTLD_DEFAULT, "canopy_free_class_unchecked");
    CHECK(free_unchecked != NULL);
    free_unchecked(NULL, c);
    for (int i = 0; i < 1000; i++) {
        char *p = alloc_class(c);
        CHECK(p);
        memset(p, 5, 100);
        free_unchecked(p, c);
        char *q = malloc(100);
        CHECK(q == p);
        free_unchecked(q, c);
    }
    unsigned cm = size_class(20000);
    for (int i = 0; i < 10; i++) {
        char *p = alloc_class(cm);
        CHECK(p && class_size(cm) >= 20000);
        memset(p, 6, 20000);
        free_unchecked(p, cm);
    }
    void *data = NULL;
    void *d = with_desc(48, 4096, 64, &data);
    CHECK(d && data && ((uintptr_t)data % 64) == 0 && (char *)data >= (char *)d + 48);
    memset(d, 1, 48);
    memset(data, 2, 4096);
    free(d);
    /* Alignments: a power of two up to 1 GiB (as aligned_alloc), EINVAL if not one. */
    d = with_desc(16, 100, 65536, &data);
    CHECK(d && ((uintptr_t)data % 65536) == 0 && (char *)data >= (char *)d + 16);
    memset(data, 4, 100);
    free(d);
    errno = 0;
    CHECK(with_desc(16, 100, 3, &data) == NULL && errno == EINVAL);
    errno = 0;
    CHECK(with_desc(16, 100, (size_t)1 << 31, &data) == NULL && errno == ENOMEM);
    char buf[4096];
    size_t need = stats_json(buf, sizeof buf);
    CHECK(need > 10 && buf[0] == '{' && strstr(buf, "\"allocations\":") != NULL);
    /* A single-threaded program runs the global heap without its lock. */
    const char *u = strstr(buf, "\"unlocked_global_entries\":");
    CHECK(u != NULL && atol(u + strlen("\"unlocked_global_entries\":")) > 0);
    errno_kept((void *)(intptr_t)1234);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, errno_kept, (void *)(intptr_t)4321) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    printf("api ok\n");
    return 0;
}
