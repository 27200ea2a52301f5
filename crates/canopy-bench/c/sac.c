/*
 * sac.c — the with-loop microbenchmark of Grelck & Scholz (paper 000, Fig. 1).
 *
 *   A = mkarray([N/X], 0);
 *   for (i = 0; i < ITERS; i++)
 *     A = with { (. <= [idx] <= .) : A[idx] + sum(mkarray([X], ...)); } : modarray(A);
 *   return sum(A);
 *
 * Every element of A allocates a temporary int vector of length X, fills it,
 * sums it and frees it; the number of additions (N * ITERS) does not depend on
 * X, so a smaller X means more allocations for the same arithmetic.  As in SAC,
 * modarray builds a new A each iteration and the old one is freed.
 *
 * The element loop is split into T static chunks, one per thread; thread 0 is
 * the main thread (so T = 1 creates no thread at all, like a SAC program in a
 * single-threaded superstep).  Two barriers per iteration separate the
 * allocation of the new A, the data-parallel section and the release of the
 * old A.
 *
 * Usage: sac MODE X N ITERS THREADS
 *   MODE malloc  malloc/free per element
 *        rich    canopy_alloc_class/canopy_free_class per element, the class
 *                computed once with canopy_size_class (run under canopy only;
 *                the symbols are looked up with dlsym so this file links
 *                without canopy)
 *        unchecked  as rich, freeing with canopy_free_class_unchecked (the
 *                caller vouches for every block: no checks)
 *        bound   compute only: each thread allocates its temporary once
 *
 * Output (one line):
 *   checksum=C seconds=S pairs=P mode=M x=X n=N iters=I threads=T peak_kib=K
 * The checksum is the wrapping 64-bit sum of A and is the same for every mode
 * and every allocator; `seconds` times the iterations only (CLOCK_MONOTONIC);
 * peak_kib is the program's peak resident set size (VmHWM).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef uint32_t canopy_class_t;
#define CANOPY_CLASS_NONE ((canopy_class_t)0xffffffffu)

enum mode { MODE_MALLOC, MODE_RICH, MODE_BOUND };

static canopy_class_t (*p_size_class)(size_t);
static void *(*p_alloc_class)(canopy_class_t);
static void (*p_free_class)(void *, canopy_class_t);

static enum mode g_mode;
static long g_x;          /* length of the temporary vector */
static long g_len;        /* length of A: N / X */
static int g_iters;
static int g_threads;
static canopy_class_t g_class;

static uint64_t *g_a;     /* current A */
static uint64_t *g_b;     /* A being built by this iteration */
static pthread_barrier_t g_barrier;
static double g_seconds;

/* Make the compiler believe `p` and the memory behind it are used, so a
 * malloc/free pair (or the fill of the temporary) cannot be optimised away. */
static inline void escape(void *p) {
    __asm__ volatile("" : : "r"(p) : "memory");
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Peak resident set size of this program in KiB (VmHWM).  The harness also
 * gets ru_maxrss from wait4, but Linux carries a process's maximum RSS across
 * exec, so that figure includes the harness's own size at fork time. */
static long peak_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (f == NULL) return -1;
    char line[256];
    long v = -1;
    while (fgets(line, sizeof line, f) != NULL) {
        if (sscanf(line, "VmHWM: %ld kB", &v) == 1) break;
    }
    fclose(f);
    return v;
}

static void die(const char *what) {
    fprintf(stderr, "sac: %s\n", what);
    exit(2);
}

/* The sum of the temporary after filling it with t[i] = idx + i.  Not
 * inlined, so every mode (and the bound) runs the same code for it. */
static __attribute__((noinline)) uint64_t fill_and_sum(int *t, long idx) {
    for (long i = 0; i < g_x; i++) {
        t[i] = (int)(idx + i);
    }
    escape(t);
    uint64_t s = 0;
    for (long i = 0; i < g_x; i++) {
        s += (uint64_t)(uint32_t)t[i];
    }
    return s;
}

static void *worker(void *arg) {
    long tid = (long)arg;
    long chunk = (g_len + g_threads - 1) / g_threads;
    long lo = tid * chunk;
    long hi = lo + chunk < g_len ? lo + chunk : g_len;
    size_t bytes = (size_t)g_x * sizeof(int);
    int *own = NULL;

    if (g_mode == MODE_BOUND) {
        own = malloc(bytes);
        if (own == NULL) die("out of memory (bound temporary)");
    }

    pthread_barrier_wait(&g_barrier);
    double t0 = now();
    for (int it = 0; it < g_iters; it++) {
        if (tid == 0) {
            g_b = malloc((size_t)g_len * sizeof(uint64_t));
            if (g_b == NULL) die("out of memory (A)");
        }
        pthread_barrier_wait(&g_barrier);
        uint64_t *a = g_a, *b = g_b;
        for (long idx = lo; idx < hi; idx++) {
            int *t;
            switch (g_mode) {
            case MODE_MALLOC:
                t = malloc(bytes);
                if (t == NULL) die("out of memory (temporary)");
                escape(t);
                b[idx] = a[idx] + fill_and_sum(t, idx);
                free(t);
                break;
            case MODE_RICH:
                t = p_alloc_class(g_class);
                if (t == NULL) die("out of memory (temporary, rich)");
                escape(t);
                b[idx] = a[idx] + fill_and_sum(t, idx);
                p_free_class(t, g_class);
                break;
            default:
                b[idx] = a[idx] + fill_and_sum(own, idx);
                break;
            }
        }
        pthread_barrier_wait(&g_barrier);
        if (tid == 0) {
            free(g_a);
            g_a = g_b;
        }
    }
    pthread_barrier_wait(&g_barrier);
    if (tid == 0) g_seconds = now() - t0;
    free(own);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: sac malloc|rich|unchecked|bound X N ITERS THREADS\n");
        return 2;
    }
    const char *free_name = "canopy_free_class";
    if (strcmp(argv[1], "malloc") == 0) g_mode = MODE_MALLOC;
    else if (strcmp(argv[1], "rich") == 0) g_mode = MODE_RICH;
    else if (strcmp(argv[1], "unchecked") == 0) {
        g_mode = MODE_RICH;
        free_name = "canopy_free_class_unchecked";
    }
    else if (strcmp(argv[1], "bound") == 0) g_mode = MODE_BOUND;
    else die("unknown mode (expected malloc, rich, unchecked or bound)");
    g_x = atol(argv[2]);
    long n = atol(argv[3]);
    g_iters = atoi(argv[4]);
    g_threads = atoi(argv[5]);
    if (g_x < 1 || n < g_x || g_iters < 1 || g_threads < 1) die("bad arguments");
    g_len = n / g_x;

    if (g_mode == MODE_RICH) {
        p_size_class = (canopy_class_t(*)(size_t))dlsym(RTLD_DEFAULT, "canopy_size_class");
        p_alloc_class = (void *(*)(canopy_class_t))dlsym(RTLD_DEFAULT, "canopy_alloc_class");
        p_free_class = (void (*)(void *, canopy_class_t))dlsym(RTLD_DEFAULT, free_name);
        if (!p_size_class || !p_alloc_class || !p_free_class) {
            fprintf(stderr, "sac: mode %s needs canopy's rich interface (canopy_size_class, canopy_alloc_class, %s)\n",
                    argv[1], free_name);
            die("run with LD_PRELOAD=libcanopy_malloc.so");
        }
        g_class = p_size_class((size_t)g_x * sizeof(int));
        if (g_class == CANOPY_CLASS_NONE) die("temporary too large for a size class");
    }

    g_a = calloc((size_t)g_len, sizeof(uint64_t));
    if (g_a == NULL) die("out of memory (A)");
    if (pthread_barrier_init(&g_barrier, NULL, (unsigned)g_threads) != 0) die("pthread_barrier_init");

    pthread_t *ths = calloc((size_t)g_threads, sizeof(pthread_t));
    if (ths == NULL) die("out of memory (threads)");
    for (long t = 1; t < g_threads; t++) {
        int rc = pthread_create(&ths[t], NULL, worker, (void *)t);
        if (rc != 0) {
            errno = rc;
            perror("sac: pthread_create");
            return 2;
        }
    }
    worker((void *)0);
    for (long t = 1; t < g_threads; t++) pthread_join(ths[t], NULL);

    uint64_t checksum = 0;
    for (long i = 0; i < g_len; i++) checksum += g_a[i];
    printf("checksum=%llu seconds=%.6f pairs=%llu mode=%s x=%ld n=%ld iters=%d threads=%d peak_kib=%ld\n",
           (unsigned long long)checksum, g_seconds,
           (unsigned long long)g_len * (unsigned long long)g_iters, argv[1], g_x, n, g_iters,
           g_threads, peak_kib());
    free(g_a);
    free(ths);
    pthread_barrier_destroy(&g_barrier);
    return 0;
}
