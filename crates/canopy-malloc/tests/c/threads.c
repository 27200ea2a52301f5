/* Multithreaded stress under LD_PRELOAD: threads allocate, hand blocks to other
 * threads through a shared exchange, check every byte, and free whatever they
 * receive (so most frees are remote).  Deterministic per thread.
 * Usage: threads [threads] [rounds].  Not a benchmark. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS 4096
static struct { pthread_mutex_t m; unsigned char *p; size_t n; unsigned seed; } ex[SLOTS];
static int rounds = 20000;
static volatile int failed = 0;

static unsigned xs(unsigned *s) { *s ^= *s << 13; *s ^= *s >> 17; *s ^= *s << 5; return *s; }

static void fill(unsigned char *p, size_t n, unsigned seed) { for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(seed + i); }
static int ok(unsigned char *p, size_t n, unsigned seed) { for (size_t i = 0; i < n; i++) if (p[i] != (unsigned char)(seed + i)) return 0; return 1; }

static size_t pick(unsigned *s) {
    unsigned r = xs(s) % 100;
    if (r < 80) return xs(s) % 512;
    if (r < 97) return 512 + xs(s) % 16000;
    if (r < 99) return 16000 + xs(s) % 250000;
    return 300000 + xs(s) % 3000000;
}

static void *worker(void *arg) {
    unsigned s = (unsigned)(uintptr_t)arg * 2654435761u + 1;
    for (int r = 0; r < rounds; r++) {
        size_t n = pick(&s);
        unsigned char *p = (xs(&s) & 7) == 0 ? calloc(1, n) : malloc(n);
        if (!p) { failed = 1; return NULL; }
        unsigned seed = xs(&s);
        fill(p, n, seed);
        if ((xs(&s) & 15) == 0) {
            size_t m = pick(&s) + 1;
            unsigned char *q = realloc(p, m);
            if (!q) { failed = 1; return NULL; }
            if (!ok(q, n < m ? n : m, seed)) { fprintf(stderr, "realloc lost data\n"); failed = 1; }
            p = q; n = m; fill(p, n, seed);
        }
        unsigned k = xs(&s) % SLOTS;
        pthread_mutex_lock(&ex[k].m);
        unsigned char *old = ex[k].p; size_t on = ex[k].n; unsigned os = ex[k].seed;
        ex[k].p = p; ex[k].n = n; ex[k].seed = seed;
        pthread_mutex_unlock(&ex[k].m);
        if (old) {
            if (!ok(old, on, os)) { fprintf(stderr, "block corrupted in transit\n"); failed = 1; }
            free(old);
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    int nt = argc > 1 ? atoi(argv[1]) : 4;
    if (argc > 2) rounds = atoi(argv[2]);
    for (int i = 0; i < SLOTS; i++) pthread_mutex_init(&ex[i].m, NULL);
    pthread_t t[64];
    for (int i = 0; i < nt; i++) pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < nt; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < SLOTS; i++) {
        if (ex[i].p && !ok(ex[i].p, ex[i].n, ex[i].seed)) { fprintf(stderr, "final check failed\n"); failed = 1; }
        free(ex[i].p);
    }
    if (failed) return 1;
    printf("threads ok\n");
    return 0;
}
