/*
 * inprocess.c: allocators compared inside one process, in alternating bursts.
 *
 * Separate processes on a shared virtual machine measure the machine as much
 * as the allocator: the same program on the same library can take 35 ms in
 * one run and 90 ms in the next, mostly in how long the hypervisor takes to
 * wake a thread that waits at a barrier.  Here every allocator is loaded into
 * one process (dlopen, RTLD_LOCAL: each library's malloc and free are called
 * through their own addresses, and no library replaces the process's own
 * allocator), and the loop runs in short bursts on each in turn, the order
 * turned by one every burst.  A slow minute then falls on every allocator
 * alike, and the median burst of each is steady to a few per cent.
 *
 * Usage: inprocess LOOP BURSTS SCALE LIB...
 *   LIB      `glibc` (the C library's own malloc), `bound` (loops sac and
 *            sac2 only, see there), the path of a shared library exporting
 *            malloc and free, or `unchecked:PATH` (loops sac and sac2 only):
 *            Canopy's library at PATH, the temporaries allocated with
 *            canopy_alloc_class and freed with canopy_free_class_unchecked
 *            (the class computed once, with canopy_size_class).  A library with initial-exec
 *            TLS (jemalloc) needs room in the static TLS block: run with
 *            GLIBC_TUNABLES=glibc.rtld.optional_static_tls=65536.
 *   LOOP     one of
 *     same     free a 64-byte block and allocate one again, one block live:
 *              the fast paths back to back, each allocation reusing the block
 *              the free before it gave back.
 *     four     four live 64-byte blocks; each step frees one at random and
 *              allocates its replacement.
 *     random   as four, sizes 16..256 bytes at random (the small half of the
 *              `mixed` workload).
 *     prodcons two threads: one allocates blocks of 16..4096 bytes and passes
 *              them through a bounded queue (1024 slots, spinning waits) to
 *              the other, which reads and frees them: every free is of a block
 *              another thread allocated.  The burst is timed from the
 *              barrier that starts it to the one that ends it.
 *     sac      the SAC kernel of paper 000 at X = 25, one thread: each
 *              element of a vector allocates a temporary of 25 ints (100
 *              bytes), fills and sums it, frees it, and adds the sum into the
 *              next vector.  Run it with the library `bound` too: a
 *              "malloc" that returns the thread's one temporary and a "free"
 *              that does nothing, the compute-only bound.
 *     sac2     the same on two threads, each on half of the vector; each
 *              thread's own work is timed between the barriers and the
 *              burst's time is the sum over the threads.
 *     larson   two threads, each with a table of 1000 blocks of 16..1024
 *              bytes; in each round a thread works on the other's table, so
 *              half of the frees are of blocks another thread allocated (the
 *              Larson server simulation of `workloads`).  Each thread times
 *              only its own work between the barriers that start and end a
 *              round; the burst's time is the sum over the threads.
 *   BURSTS   bursts per library.
 *   SCALE    work per burst: 250 000 steps per unit (prodcons: 50 000 blocks
 *            passed; sac, sac2: 100 000 elements; larson: 5 rounds of 5000
 *            operations per thread).
 *
 * Output: one line per library,
 *   lib=I name=LIB loop=LOOP bursts=B ops=O median_ns=M min_ns=N q1_ns=Q q3_ns=R checksum=C
 * where M, N, Q and R are nanoseconds per operation (one free and one
 * allocation) over the bursts.  Each burst starts from the same random
 * seed, so every library does the same work and prints the same checksum;
 * a block handed out twice shows up as a different one.  Then a last line
 * `checksum=C libs=K` for the harness.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void *(*malloc_fn)(size_t);
typedef void (*free_fn)(void *);

enum { MAX_LIBS = 8, MAX_BURSTS = 1000, THREADS = 2, SLOTS = 1000 };

static int g_libs;
static malloc_fn g_malloc[MAX_LIBS];
static free_fn g_free[MAX_LIBS];
static double g_ns[MAX_LIBS][MAX_BURSTS];
static uint64_t g_sum[MAX_LIBS];

static void die(const char *what, const char *detail) {
    fprintf(stderr, "inprocess: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    exit(2);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline uint64_t next(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* A number below n without a division (which would cost more than a free). */
static inline uint64_t below(uint64_t *x, uint64_t n) {
    return ((next(x) >> 32) * n) >> 32;
}

static void *xmalloc(int lib, size_t n) {
    void *p = g_malloc[lib](n);
    if (p == NULL) die("out of memory", NULL);
    return p;
}

/* A block carries its step number in its first word and its size in its
 * last byte; the free reads both back into the checksum. */
static inline void *new_block(int lib, size_t n, uint64_t v) {
    unsigned char *p = xmalloc(lib, n);
    memcpy(p, &v, sizeof v);
    p[n - 1] = (unsigned char)n;
    return p;
}

static inline uint64_t free_block(int lib, void *b, size_t n) {
    unsigned char *p = b;
    uint64_t v;
    memcpy(&v, p, sizeof v);
    uint64_t c = v + p[n - 1];
    g_free[lib](p);
    return c;
}

/* ---- single-threaded loops ---------------------------------------------- */

static uint64_t loop_same(int lib, long steps) {
    uint64_t sum = 0;
    void *p = new_block(lib, 64, 0);
    for (long i = 1; i <= steps; i++) {
        sum += free_block(lib, p, 64);
        p = new_block(lib, 64, (uint64_t)i);
    }
    return sum + free_block(lib, p, 64);
}

static uint64_t loop_live(int lib, long steps, int random_sizes) {
    uint64_t x = 0x5eed5eedULL, sum = 0;
    void *live[4] = {0};
    size_t size[4] = {0};
    for (long i = 0; i < steps; i++) {
        uint64_t s = below(&x, 4);
        if (live[s] != NULL) sum += free_block(lib, live[s], size[s]);
        size[s] = random_sizes ? 16 + below(&x, 241) : 64;
        live[s] = new_block(lib, size[s], (uint64_t)i);
    }
    for (int s = 0; s < 4; s++)
        if (live[s] != NULL) sum += free_block(lib, live[s], size[s]);
    return sum;
}

/* ---- larson ------------------------------------------------------------- */

static pthread_barrier_t g_barrier;
static long g_rounds, g_ops, g_bursts;
static void **g_tables[MAX_LIBS][THREADS];
static unsigned short *g_sizes[MAX_LIBS][THREADS];
static double g_work[THREADS][MAX_LIBS][MAX_BURSTS];
static uint64_t g_tsum[THREADS][MAX_LIBS];

static void *larson_thread(void *arg) {
    long t = (long)arg;
    for (int lib = 0; lib < g_libs; lib++) {
        uint64_t x = 0x1a450000ULL + (uint64_t)t * 7919;
        g_tables[lib][t] = xmalloc(lib, sizeof(void *) * SLOTS);
        g_sizes[lib][t] = xmalloc(lib, sizeof(unsigned short) * SLOTS);
        for (int s = 0; s < SLOTS; s++) {
            size_t n = 16 + below(&x, 1009);
            g_sizes[lib][t][s] = (unsigned short)n;
            g_tables[lib][t][s] = new_block(lib, n, next(&x));
        }
    }
    for (long b = 0; b < g_bursts; b++) {
        for (int k = 0; k < g_libs; k++) {
            int lib = (int)((k + b) % g_libs);
            /* The same seed for every library: the same work. */
            uint64_t x = 0x7000ULL + (uint64_t)b * 31 + (uint64_t)t;
            uint64_t sum = 0;
            double work = 0;
            pthread_barrier_wait(&g_barrier);
            for (long r = 0; r < g_rounds; r++) {
                long owner = (t + r + 1) % THREADS;
                void **table = g_tables[lib][owner];
                unsigned short *sizes = g_sizes[lib][owner];
                double a = now();
                for (long o = 0; o < g_ops; o++) {
                    uint64_t s = below(&x, SLOTS);
                    sum += free_block(lib, table[s], sizes[s]);
                    size_t n = 16 + below(&x, 1009);
                    sizes[s] = (unsigned short)n;
                    table[s] = new_block(lib, n, (uint64_t)o);
                }
                work += now() - a;
                /* The next round works on another table: wait until every
                 * thread is done with this one. */
                pthread_barrier_wait(&g_barrier);
            }
            g_work[t][lib][b] = work;
            g_tsum[t][lib] += sum;
        }
    }
    return NULL;
}

static void larson(long scale) {
    g_rounds = 5 * scale;
    g_ops = 5000;
    if (pthread_barrier_init(&g_barrier, NULL, THREADS) != 0) die("pthread_barrier_init failed", NULL);
    pthread_t th[THREADS];
    for (long t = 0; t < THREADS; t++)
        if (pthread_create(&th[t], NULL, larson_thread, (void *)t) != 0) die("pthread_create failed", NULL);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    double ops = (double)THREADS * (double)g_rounds * (double)g_ops;
    for (int lib = 0; lib < g_libs; lib++) {
        for (long b = 0; b < g_bursts; b++) {
            double w = 0;
            for (int t = 0; t < THREADS; t++) w += g_work[t][lib][b];
            g_ns[lib][b] = w * 1e9 / ops;
        }
        for (int t = 0; t < THREADS; t++) {
            g_sum[lib] += g_tsum[t][lib];
            /* The tables outlive the bursts: free them on their library. */
            for (int s = 0; s < SLOTS; s++) g_sum[lib] += free_block(lib, g_tables[lib][t][s], g_sizes[lib][t][s]);
            g_free[lib](g_tables[lib][t]);
            g_free[lib](g_sizes[lib][t]);
        }
    }
}

/* ---- prodcons ----------------------------------------------------------- */

enum { QUEUE = 1024 };

typedef struct {
    void *p;
    size_t n;
} item_t;

static item_t g_ring[QUEUE];
/* Producer and consumer counters on separate lines. */
static _Alignas(128) _Atomic uint64_t g_tail;
static _Alignas(128) _Atomic uint64_t g_head;
static long g_items;

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *prodcons_thread(void *arg) {
    long t = (long)arg;
    for (long b = 0; b < g_bursts; b++) {
        for (int k = 0; k < g_libs; k++) {
            int lib = (int)((k + b) % g_libs);
            pthread_barrier_wait(&g_barrier);
            double a = now();
            if (t == 0) {
                uint64_t x = 0x9c00ULL + (uint64_t)b * 31;
                for (long i = 0; i < g_items; i++) {
                    size_t n = 16 + below(&x, 4081);
                    void *p = new_block(lib, n, (uint64_t)i);
                    uint64_t tail = atomic_load_explicit(&g_tail, memory_order_relaxed);
                    /* Acquire: the consumer is done with the slot it freed. */
                    while (tail - atomic_load_explicit(&g_head, memory_order_acquire) == QUEUE) relax();
                    g_ring[tail % QUEUE] = (item_t){p, n};
                    /* Release: publishes the slot to the consumer. */
                    atomic_store_explicit(&g_tail, tail + 1, memory_order_release);
                }
            } else {
                uint64_t sum = 0;
                for (long i = 0; i < g_items; i++) {
                    uint64_t head = atomic_load_explicit(&g_head, memory_order_relaxed);
                    /* Acquire: pairs with the producer's release of the slot. */
                    while (atomic_load_explicit(&g_tail, memory_order_acquire) == head) relax();
                    item_t it = g_ring[head % QUEUE];
                    atomic_store_explicit(&g_head, head + 1, memory_order_release);
                    sum += free_block(lib, it.p, it.n);
                }
                g_tsum[1][lib] += sum;
            }
            pthread_barrier_wait(&g_barrier);
            if (t == 0) g_work[0][lib][b] = now() - a;
        }
    }
    return NULL;
}

static void prodcons(long scale) {
    g_items = 50000L * scale;
    if (pthread_barrier_init(&g_barrier, NULL, THREADS) != 0) die("pthread_barrier_init failed", NULL);
    pthread_t th[THREADS];
    for (long t = 0; t < THREADS; t++)
        if (pthread_create(&th[t], NULL, prodcons_thread, (void *)t) != 0) die("pthread_create failed", NULL);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    for (int lib = 0; lib < g_libs; lib++) {
        for (long b = 0; b < g_bursts; b++) g_ns[lib][b] = g_work[0][lib][b] * 1e9 / (double)g_items;
        g_sum[lib] += g_tsum[1][lib];
    }
}

/* ---- sac ---------------------------------------------------------------- */

enum { SAC_X = 25 };

/* The compute-only bound: one temporary per thread, never freed. */
static __thread int g_own[SAC_X];
static int g_is_bound[MAX_LIBS];
/* `unchecked:` libraries: Canopy's rich interface for the temporaries. */
static int g_is_rich[MAX_LIBS];
static void *(*g_alloc_class[MAX_LIBS])(unsigned);
static void (*g_free_unchecked[MAX_LIBS])(void *, unsigned);
static unsigned g_class[MAX_LIBS];
static void *bound_malloc(size_t n) { return n <= sizeof g_own ? (void *)g_own : NULL; }
static void bound_free(void *p) { (void)p; }

static uint64_t *g_va, *g_vb;
static long g_len;

static inline void escape(void *p) {
    __asm__ volatile("" : : "r"(p) : "memory");
}

/* Fill the temporary with idx + i and sum it; not inlined, so every library
 * and the bound run the same code for it. */
static __attribute__((noinline)) uint64_t fill_and_sum(int *t, long idx) {
    for (long i = 0; i < SAC_X; i++) t[i] = (int)(idx + i);
    escape(t);
    uint64_t s = 0;
    for (long i = 0; i < SAC_X; i++) s += (uint64_t)(uint32_t)t[i];
    return s;
}

static void sac_range(int lib, long lo, long hi) {
    const uint64_t *a = g_va;
    uint64_t *b = g_vb;
    if (g_is_rich[lib]) {
        void *(*alloc_class)(unsigned) = g_alloc_class[lib];
        void (*free_unchecked)(void *, unsigned) = g_free_unchecked[lib];
        unsigned cls = g_class[lib];
        for (long idx = lo; idx < hi; idx++) {
            int *t = alloc_class(cls);
            if (t == NULL) die("out of memory", NULL);
            escape(t);
            b[idx] = a[idx] + fill_and_sum(t, idx);
            free_unchecked(t, cls);
        }
        return;
    }
    for (long idx = lo; idx < hi; idx++) {
        int *t = xmalloc(lib, SAC_X * sizeof(int));
        escape(t);
        b[idx] = a[idx] + fill_and_sum(t, idx);
        g_free[lib](t);
    }
}

static int g_sac_threads;

static void *sac_thread(void *arg) {
    long t = (long)arg;
    long chunk = (g_len + g_sac_threads - 1) / g_sac_threads;
    long lo = t * chunk, hi = lo + chunk < g_len ? lo + chunk : g_len;
    for (long b = 0; b < g_bursts; b++) {
        for (int k = 0; k < g_libs; k++) {
            int lib = (int)((k + b) % g_libs);
            pthread_barrier_wait(&g_barrier);
            double a = now();
            sac_range(lib, lo, hi);
            g_work[t][lib][b] = now() - a;
            pthread_barrier_wait(&g_barrier);
            if (t == 0) {
                /* What this burst added (A stays zero, so every burst does the same work). */
                uint64_t s = 0;
                for (long i = 0; i < g_len; i++) s += g_vb[i] - g_va[i];
                g_sum[lib] += s;
            }
            pthread_barrier_wait(&g_barrier);
        }
    }
    return NULL;
}

static void sac(long scale, int threads) {
    g_len = 100000L * scale;
    g_sac_threads = threads;
    /* The vectors come from the process's own allocator, once: only the
     * temporaries go through the library under test. */
    g_va = calloc((size_t)g_len, sizeof(uint64_t));
    g_vb = calloc((size_t)g_len, sizeof(uint64_t));
    if (g_va == NULL || g_vb == NULL) die("out of memory (vectors)", NULL);
    if (pthread_barrier_init(&g_barrier, NULL, (unsigned)threads) != 0) die("pthread_barrier_init failed", NULL);
    pthread_t th[THREADS];
    for (long t = 0; t < threads; t++)
        if (pthread_create(&th[t], NULL, sac_thread, (void *)t) != 0) die("pthread_create failed", NULL);
    for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
    for (int lib = 0; lib < g_libs; lib++)
        for (long b = 0; b < g_bursts; b++) {
            double w = 0;
            for (int t = 0; t < threads; t++) w += g_work[t][lib][b];
            g_ns[lib][b] = w * 1e9 / (double)g_len;
        }
    free(g_va);
    free(g_vb);
}

/* ---- driver ------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double d = *(const double *)a - *(const double *)b;
    return d < 0 ? -1 : d > 0;
}

static void load(int i, const char *name) {
    void *h;
    if (strcmp(name, "bound") == 0) {
        g_malloc[i] = bound_malloc;
        g_free[i] = bound_free;
        g_is_bound[i] = 1;
        return;
    }
    int rich = strncmp(name, "unchecked:", 10) == 0;
    if (rich) name += 10;
    if (strcmp(name, "glibc") == 0) {
        h = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    } else {
        h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    }
    if (h == NULL) die("cannot load", dlerror());
    g_malloc[i] = (malloc_fn)dlsym(h, "malloc");
    g_free[i] = (free_fn)dlsym(h, "free");
    if (g_malloc[i] == NULL || g_free[i] == NULL) die("no malloc or free in", name);
    if (rich) {
        unsigned (*size_class)(size_t) = (unsigned (*)(size_t))dlsym(h, "canopy_size_class");
        g_alloc_class[i] = (void *(*)(unsigned))dlsym(h, "canopy_alloc_class");
        g_free_unchecked[i] = (void (*)(void *, unsigned))dlsym(h, "canopy_free_class_unchecked");
        if (size_class == NULL || g_alloc_class[i] == NULL || g_free_unchecked[i] == NULL)
            die("no canopy_size_class, canopy_alloc_class or canopy_free_class_unchecked in", name);
        g_class[i] = size_class(SAC_X * sizeof(int));
        g_is_rich[i] = 1;
    }
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: inprocess same|four|random|prodcons|sac|sac2|larson BURSTS SCALE LIB...\n");
        return 2;
    }
    const char *loop = argv[1];
    long bursts = atol(argv[2]), scale = atol(argv[3]);
    if (bursts < 1 || bursts > MAX_BURSTS) die("BURSTS must be 1..1000", argv[2]);
    if (scale < 1 || scale > 1000) die("SCALE must be 1..1000", argv[3]);
    g_libs = argc - 4;
    if (g_libs > MAX_LIBS) die("too many libraries (at most 8)", NULL);
    for (int i = 0; i < g_libs; i++) load(i, argv[4 + i]);
    for (int i = 0; i < g_libs; i++)
        if ((g_is_bound[i] || g_is_rich[i]) && strcmp(loop, "sac") != 0 && strcmp(loop, "sac2") != 0)
            die("the libraries `bound` and `unchecked:` are for the loops sac and sac2 only", loop);
    g_bursts = bursts;

    long steps = 250000L * scale;
    double ops = (double)steps;
    if (strcmp(loop, "larson") == 0) {
        larson(scale);
        ops = (double)THREADS * (double)g_rounds * (double)g_ops;
    } else if (strcmp(loop, "prodcons") == 0) {
        prodcons(scale);
        ops = (double)g_items;
    } else if (strcmp(loop, "sac") == 0 || strcmp(loop, "sac2") == 0) {
        sac(scale, loop[3] == '2' ? 2 : 1);
        ops = (double)g_len;
    } else {
        int which = strcmp(loop, "same") == 0 ? 0 : strcmp(loop, "four") == 0 ? 1 : strcmp(loop, "random") == 0 ? 2 : -1;
        if (which < 0) die("unknown loop (expected same, four, random, prodcons, sac, sac2 or larson)", loop);
        for (long b = 0; b < bursts; b++) {
            for (int k = 0; k < g_libs; k++) {
                int lib = (int)((k + b) % g_libs);
                double a = now();
                uint64_t s = which == 0 ? loop_same(lib, steps) : loop_live(lib, steps, which == 2);
                g_ns[lib][b] = (now() - a) * 1e9 / ops;
                g_sum[lib] += s;
            }
        }
    }
    for (int lib = 0; lib < g_libs; lib++) {
        qsort(g_ns[lib], (size_t)bursts, sizeof(double), cmp_double);
        printf("lib=%d name=%s loop=%s bursts=%ld ops=%.0f median_ns=%.3f min_ns=%.3f q1_ns=%.3f q3_ns=%.3f checksum=%llu\n",
               lib, argv[4 + lib], loop, bursts, ops, g_ns[lib][bursts / 2], g_ns[lib][0], g_ns[lib][bursts / 4],
               g_ns[lib][(3 * bursts) / 4], (unsigned long long)g_sum[lib]);
    }
    printf("checksum=%llu libs=%d\n", (unsigned long long)g_sum[0], g_libs);
    return 0;
}
