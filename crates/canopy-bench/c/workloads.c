/*
 * workloads.c — general allocation workloads for comparing allocators.
 *
 * Usage: workloads NAME THREADS SCALE [SEED]
 *
 *   larson         a server simulation after Larson & Krishnan: each thread owns
 *                  a table of slots and repeatedly frees a random slot and puts a
 *                  new block of 16..1024 bytes in it; after every round the tables
 *                  move on to the next thread, so most frees are remote.
 *   prodcons       producer/consumer: in each of max(1, THREADS/2) pairs one thread
 *                  allocates blocks of mixed sizes and passes them through a
 *                  bounded queue to the other, which frees them (a waiting
 *                  thread spins a while before it yields the core).
 *   cache-scratch  allocator-induced false sharing, passive: the main thread
 *                  allocates one small object per thread; each thread frees its
 *                  object, then allocates small objects and writes them hard.
 *   cache-thrash   allocator-induced false sharing, active: each thread allocates
 *                  its own small objects and writes them hard.
 *   sizewalk       one thread keeps a bounded pool of live blocks whose sizes are
 *                  log-uniform in 8 B .. 4 MiB, frees and reallocs at random and
 *                  touches every byte it allocates (for peak RSS).
 *   churn          thousands of short-lived threads, THREADS alive at a time, each
 *                  allocating a few hundred blocks and freeing most of them; the
 *                  parent frees the rest after the join.
 *   mixed          one thread allocates and frees small blocks (16..256 bytes,
 *                  a few live at a time) while THREADS-1 others allocate and
 *                  free large ones (64..544 KiB, first and last byte written):
 *                  a server that mixes buffers with small objects.  Large
 *                  blocks go through an allocator's shared structures, small
 *                  ones should not notice.  With one thread, it does both parts
 *                  one after the other.
 *   phases         each thread builds a heap of 64 blocks of 1 MiB (one byte
 *                  written per 4 KiB page) and frees it, then allocates and
 *                  frees 256..544 KiB blocks (first and last byte written):
 *                  large requests cut from a long run of free memory.  Then
 *                  it allocates 2000 blocks of 9..45 KB, frees every other
 *                  one, and allocates and frees blocks of 8..208 KiB: requests
 *                  in a heap whose free blocks cannot merge.
 *
 * All randomness comes from seeded xorshift generators, one per thread, and no
 * decision depends on timing, so every allocator does exactly the same work.
 * Blocks carry a value written by the allocating thread and read back by the
 * freeing one; the checksum adds these up, so it is the same for every
 * allocator and a block handed out twice shows up as a wrong checksum.
 *
 * Output (one line):
 *   workload=NAME checksum=C seconds=S ops=O threads=T scale=K peak_kib=P
 * where peak_kib is the program's peak resident set size (VmHWM).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int g_threads;
static long g_scale;
static uint64_t g_seed = 0x5ac0c0ffeeULL;
static pthread_barrier_t g_barrier;
static _Atomic uint64_t g_checksum;
static _Atomic uint64_t g_ops;

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
    fprintf(stderr, "workloads: %s\n", what);
    exit(2);
}

static void *xmalloc(size_t n) {
    void *p = malloc(n);
    if (p == NULL) die("out of memory");
    return p;
}

/* ---- deterministic randomness ------------------------------------------ */

typedef struct { uint64_t s; } rng_t;

static uint64_t splitmix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static rng_t rng_for(uint64_t stream) {
    rng_t r = { splitmix(g_seed ^ splitmix(stream)) | 1 };
    return r;
}

/* xorshift64* */
static inline uint64_t next(rng_t *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545f4914f6cdd1dULL;
}

static inline uint64_t below(rng_t *r, uint64_t n) {
    return (next(r) >> 11) % n;
}

/* ---- tagged blocks ------------------------------------------------------ */
/* A block of at least 16 bytes holds [value:8][size:4] and its last byte is
 * the low byte of the value. */

static void *tagged_new(size_t size, uint64_t value) {
    unsigned char *p = xmalloc(size);
    memcpy(p, &value, 8);
    uint32_t s = (uint32_t)size;
    memcpy(p + 8, &s, 4);
    p[size - 1] = (unsigned char)value;
    return p;
}

/* Read a tagged block back (its contribution to the checksum) and free it. */
static uint64_t tagged_free(void *block) {
    unsigned char *p = block;
    uint64_t value;
    uint32_t size;
    memcpy(&value, p, 8);
    memcpy(&size, p + 8, 4);
    uint64_t c = value + size + p[size - 1];
    free(p);
    return c;
}

typedef void *(*thread_fn)(void *);

static void run_threads(int n, thread_fn fn) {
    pthread_t *ths = xmalloc(sizeof(pthread_t) * (size_t)n);
    for (long t = 0; t < n; t++) {
        if (pthread_create(&ths[t], NULL, fn, (void *)t) != 0) die("pthread_create");
    }
    for (long t = 0; t < n; t++) pthread_join(ths[t], NULL);
    free(ths);
}

/* ---- larson ------------------------------------------------------------- */

enum { LARSON_SLOTS = 1000, LARSON_OPS = 5000 };
static void ***g_tables;
static long g_rounds;

static void *larson_thread(void *arg) {
    long tid = (long)arg;
    rng_t r = rng_for(0x1a000 + (uint64_t)tid);
    uint64_t sum = 0, ops = 0;
    void **mine = g_tables[tid];
    for (long s = 0; s < LARSON_SLOTS; s++) {
        mine[s] = tagged_new(16 + below(&r, 1009), next(&r));
    }
    pthread_barrier_wait(&g_barrier);
    for (long round = 0; round < g_rounds; round++) {
        void **table = g_tables[(tid + round) % g_threads];
        for (long k = 0; k < LARSON_OPS; k++) {
            long s = (long)below(&r, LARSON_SLOTS);
            sum += tagged_free(table[s]);
            table[s] = tagged_new(16 + below(&r, 1009), next(&r));
        }
        ops += LARSON_OPS;
        pthread_barrier_wait(&g_barrier);
    }
    for (long s = 0; s < LARSON_SLOTS; s++) sum += tagged_free(mine[s]);
    atomic_fetch_add(&g_checksum, sum);
    atomic_fetch_add(&g_ops, ops);
    return NULL;
}

static void larson(void) {
    g_rounds = 20 * g_scale;
    g_tables = xmalloc(sizeof(void **) * (size_t)g_threads);
    for (int t = 0; t < g_threads; t++) g_tables[t] = xmalloc(sizeof(void *) * LARSON_SLOTS);
    if (pthread_barrier_init(&g_barrier, NULL, (unsigned)g_threads) != 0) die("barrier");
    run_threads(g_threads, larson_thread);
    for (int t = 0; t < g_threads; t++) free(g_tables[t]);
    free(g_tables);
    pthread_barrier_destroy(&g_barrier);
}

/* ---- producer/consumer -------------------------------------------------- */

enum { QUEUE_CAP = 1024 };

typedef struct {
    _Alignas(64) _Atomic uint64_t head; /* written by the consumer */
    _Alignas(64) _Atomic uint64_t tail; /* written by the producer */
    _Alignas(64) void *slots[QUEUE_CAP];
} queue_t;

static queue_t *g_queues;
static long g_items;

static size_t mixed_size(rng_t *r) {
    uint64_t k = below(r, 100);
    if (k < 70) return 16 + below(r, 241);       /* small: 16..256 */
    if (k < 95) return 256 + below(r, 3841);     /* medium: 256..4096 */
    return 4096 + below(r, 61441);               /* large: 4 KiB..64 KiB */
}

/* Waiting on the queue: spin with a pause first, as real queues do (the
 * other thread usually runs on the other core and answers within a few
 * hundred cycles), and yield the core only after a long wait.  Yielding at
 * once made the workload bimodal for every allocator: depending on how the
 * scheduler placed the two threads, a run took either about 0.15 s or 0.55 s. */
enum { SPINS_BEFORE_YIELD = 4096 };

static inline void backoff(unsigned *spins) {
    if (*spins < SPINS_BEFORE_YIELD) {
        (*spins)++;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    } else {
        sched_yield();
    }
}

static void *prodcons_thread(void *arg) {
    long tid = (long)arg;
    queue_t *q = &g_queues[tid / 2];
    uint64_t sum = 0;
    if (tid % 2 == 0) {
        rng_t r = rng_for(0x9c000 + (uint64_t)tid);
        for (long i = 0; i < g_items; i++) {
            void *b = tagged_new(mixed_size(&r), next(&r));
            uint64_t t = atomic_load_explicit(&q->tail, memory_order_relaxed);
            /* Acquire: pairs with the consumer's Release store of head. */
            unsigned spins = 0;
            while (t - atomic_load_explicit(&q->head, memory_order_acquire) == QUEUE_CAP) backoff(&spins);
            q->slots[t % QUEUE_CAP] = b;
            /* Release: publishes the slot to the consumer's Acquire load of tail. */
            atomic_store_explicit(&q->tail, t + 1, memory_order_release);
        }
    } else {
        for (long i = 0; i < g_items; i++) {
            uint64_t h = atomic_load_explicit(&q->head, memory_order_relaxed);
            unsigned spins = 0;
            while (atomic_load_explicit(&q->tail, memory_order_acquire) == h) backoff(&spins);
            void *b = q->slots[h % QUEUE_CAP];
            atomic_store_explicit(&q->head, h + 1, memory_order_release);
            sum += tagged_free(b);
        }
        atomic_fetch_add(&g_ops, (uint64_t)g_items);
    }
    atomic_fetch_add(&g_checksum, sum);
    return NULL;
}

static void prodcons(void) {
    int pairs = g_threads / 2 > 1 ? g_threads / 2 : 1;
    g_items = 200000 * g_scale;
    g_queues = aligned_alloc(64, sizeof(queue_t) * (size_t)pairs);
    if (g_queues == NULL) die("out of memory");
    memset(g_queues, 0, sizeof(queue_t) * (size_t)pairs);
    run_threads(2 * pairs, prodcons_thread);
    free(g_queues);
}

/* ---- false sharing ------------------------------------------------------ */

enum { CACHE_OBJ = 8, CACHE_REPS = 500 };
static volatile unsigned char **g_given;
static long g_cache_iters;

static uint64_t write_hard(volatile unsigned char *p) {
    for (int rep = 0; rep < CACHE_REPS; rep++) {
        for (int k = 0; k < CACHE_OBJ; k++) p[k] = (unsigned char)(p[k] + k + 1);
    }
    uint64_t s = 0;
    for (int k = 0; k < CACHE_OBJ; k++) s += p[k];
    return s;
}

static void *cache_thread(void *arg) {
    long tid = (long)arg;
    uint64_t sum = 0;
    if (g_given != NULL) free((void *)g_given[tid]);
    for (long i = 0; i < g_cache_iters; i++) {
        volatile unsigned char *p = xmalloc(CACHE_OBJ);
        escape((void *)p);
        for (int k = 0; k < CACHE_OBJ; k++) p[k] = 0;
        sum += write_hard(p);
        free((void *)p);
    }
    atomic_fetch_add(&g_checksum, sum);
    atomic_fetch_add(&g_ops, (uint64_t)g_cache_iters);
    return NULL;
}

static void cache(int scratch) {
    g_cache_iters = 2000 * g_scale;
    if (scratch) {
        g_given = xmalloc(sizeof(void *) * (size_t)g_threads);
        for (int t = 0; t < g_threads; t++) g_given[t] = xmalloc(CACHE_OBJ);
    }
    run_threads(g_threads, cache_thread);
    free((void *)g_given);
}

/* ---- random size walk --------------------------------------------------- */

enum { WALK_POOL = 64 };

/* Log-uniform in [8, 4 MiB): a power of two 2^3..2^21, then uniform inside. */
static size_t walk_size(rng_t *r) {
    unsigned e = 3 + (unsigned)below(r, 19);
    return ((size_t)1 << e) + (size_t)below(r, (uint64_t)1 << e);
}

typedef struct { unsigned char *p; size_t size; unsigned char pattern; } walk_slot;

static uint64_t walk_release(walk_slot *w) {
    uint64_t c = w->size + w->p[0] + w->p[w->size / 2] + w->p[w->size - 1];
    if (w->p[0] != w->pattern || w->p[w->size - 1] != w->pattern) die("sizewalk: block corrupted");
    free(w->p);
    w->p = NULL;
    return c;
}

static void sizewalk(void) {
    rng_t r = rng_for(0x5e000);
    walk_slot pool[WALK_POOL];
    memset(pool, 0, sizeof pool);
    long steps = 1500 * g_scale;
    uint64_t sum = 0;
    for (long i = 0; i < steps; i++) {
        walk_slot *w = &pool[below(&r, WALK_POOL)];
        uint64_t action = w->p == NULL ? 2 : below(&r, 3);
        if (action == 0) {
            sum += walk_release(w);
        } else if (action == 1) {
            size_t ns = walk_size(&r);
            unsigned char *np = realloc(w->p, ns);
            if (np == NULL) die("out of memory (realloc)");
            size_t keep = ns < w->size ? ns : w->size;
            if (np[0] != w->pattern || np[keep - 1] != w->pattern) die("sizewalk: realloc lost data");
            if (ns > w->size) memset(np + w->size, w->pattern, ns - w->size);
            w->p = np;
            w->size = ns;
        } else {
            if (w->p != NULL) sum += walk_release(w);
            w->size = walk_size(&r);
            w->pattern = (unsigned char)(1 + below(&r, 255));
            w->p = xmalloc(w->size);
            memset(w->p, w->pattern, w->size);
        }
    }
    for (int s = 0; s < WALK_POOL; s++) {
        if (pool[s].p != NULL) sum += walk_release(&pool[s]);
    }
    atomic_fetch_add(&g_checksum, sum);
    atomic_fetch_add(&g_ops, (uint64_t)steps);
}

/* ---- thread churn ------------------------------------------------------- */

enum { CHURN_BLOCKS = 256 };
static long g_wave;

typedef struct { void **left; long count; } churn_result;
static churn_result *g_results;

static void *churn_thread(void *arg) {
    long slot = (long)arg;
    long id = g_wave * g_threads + slot;
    rng_t r = rng_for(0xc4000 + (uint64_t)id);
    void *blocks[CHURN_BLOCKS];
    uint64_t sum = 0;
    for (int i = 0; i < CHURN_BLOCKS; i++) blocks[i] = tagged_new(16 + below(&r, 497), next(&r));
    /* Free three quarters here, hand one quarter to the parent. */
    void **left = xmalloc(sizeof(void *) * (CHURN_BLOCKS / 4));
    long n = 0;
    for (int i = 0; i < CHURN_BLOCKS; i++) {
        if (i % 4 == 3) left[n++] = blocks[i];
        else sum += tagged_free(blocks[i]);
    }
    g_results[slot].left = left;
    g_results[slot].count = n;
    atomic_fetch_add(&g_checksum, sum);
    return NULL;
}

static void churn(void) {
    long total = 1000 * g_scale;
    long waves = (total + g_threads - 1) / g_threads;
    g_results = xmalloc(sizeof(churn_result) * (size_t)g_threads);
    uint64_t sum = 0;
    for (g_wave = 0; g_wave < waves; g_wave++) {
        run_threads(g_threads, churn_thread);
        for (int t = 0; t < g_threads; t++) {
            for (long i = 0; i < g_results[t].count; i++) sum += tagged_free(g_results[t].left[i]);
            free(g_results[t].left);
        }
    }
    free(g_results);
    atomic_fetch_add(&g_checksum, sum);
    atomic_fetch_add(&g_ops, (uint64_t)(waves * g_threads));
}

/* ---- mixed sizes -------------------------------------------------------- */

enum { MIXED_LIVE = 4 };

static void *mixed_small(void *arg) {
    (void)arg;
    rng_t r = rng_for(0x313000);
    void *live[MIXED_LIVE] = {0};
    uint64_t sum = 0;
    long pairs = 1000000L * g_scale;
    for (long i = 0; i < pairs; i++) {
        long s = (long)below(&r, MIXED_LIVE);
        if (live[s] != NULL) sum += tagged_free(live[s]);
        live[s] = tagged_new(16 + below(&r, 241), next(&r));
    }
    for (long s = 0; s < MIXED_LIVE; s++)
        if (live[s] != NULL) sum += tagged_free(live[s]);
    atomic_fetch_add(&g_checksum, sum);
    atomic_fetch_add(&g_ops, (uint64_t)pairs);
    return NULL;
}

/* One block of `size` bytes: allocated, its first and last byte written from
 * the generator and read back, freed.  Returns what was read. */
static uint64_t touch_and_free(rng_t *r, size_t size) {
    unsigned char *p = xmalloc(size);
    uint64_t v = next(r);
    p[0] = (unsigned char)v;
    p[size - 1] = (unsigned char)(v >> 8);
    escape(p);
    uint64_t got = (uint64_t)p[0] + p[size - 1];
    free(p);
    return got;
}

static void *mixed_large(void *arg) {
    long tid = (long)arg;
    rng_t r = rng_for(0x314000 + (uint64_t)tid);
    int others = g_threads > 1 ? g_threads - 1 : 1;
    long ops = 50000L * g_scale / others;
    uint64_t sum = 0;
    for (long i = 0; i < ops; i++) {
        size_t size = (size_t)(64 + 32 * below(&r, 16)) << 10;
        sum += touch_and_free(&r, size);
    }
    atomic_fetch_add(&g_checksum, sum);
    atomic_fetch_add(&g_ops, (uint64_t)ops);
    return NULL;
}

static void *mixed_thread(void *arg) {
    return (long)arg == 0 ? mixed_small(arg) : mixed_large(arg);
}

static void mixed(void) {
    if (g_threads == 1) {
        mixed_small((void *)0);
        mixed_large((void *)1);
        return;
    }
    run_threads(g_threads, mixed_thread);
}

/* ---- phases ------------------------------------------------------------- */

enum { PHASE_BLOCKS = 64, PHASE_BLOCK = 1 << 20, PHASE_MID = 2000 };

static void *phases_thread(void *arg) {
    long tid = (long)arg;
    rng_t r = rng_for(0x315000 + (uint64_t)tid);
    uint64_t sum = 0;
    /* Phase 1: a heap of large blocks, touched page by page, then freed. */
    unsigned char *big[PHASE_BLOCKS];
    for (int i = 0; i < PHASE_BLOCKS; i++) {
        big[i] = xmalloc(PHASE_BLOCK);
        for (size_t k = 0; k < PHASE_BLOCK; k += 4096) big[i][k] = (unsigned char)(i + k);
    }
    for (int i = 0; i < PHASE_BLOCKS; i++) {
        sum += big[i][PHASE_BLOCK - 4096];
        free(big[i]);
    }
    /* Phase 2: blocks of 256..544 KiB, one at a time. */
    long ops = 25000L * g_scale;
    for (long i = 0; i < ops; i++) {
        size_t size = (size_t)(256 + 32 * below(&r, 10)) << 10;
        sum += touch_and_free(&r, size);
    }
    /* Phase 3: a heap of 9..45 KB blocks with every other one freed. */
    unsigned char **mid = xmalloc(sizeof(unsigned char *) * PHASE_MID);
    for (int i = 0; i < PHASE_MID; i++) {
        size_t n = 9000 + 3000 * (size_t)(i % 13);
        mid[i] = xmalloc(n);
        mid[i][0] = (unsigned char)i;
    }
    for (int i = 0; i < PHASE_MID; i += 2) {
        sum += mid[i][0];
        free(mid[i]);
    }
    /* Phase 4: blocks of 8..208 KiB, one at a time, beside it. */
    for (long i = 0; i < ops; i++) {
        size_t size = 8192 + (size_t)below(&r, 200 << 10);
        sum += touch_and_free(&r, size);
    }
    for (int i = 1; i < PHASE_MID; i += 2) {
        sum += mid[i][0];
        free(mid[i]);
    }
    free(mid);
    atomic_fetch_add(&g_checksum, sum);
    atomic_fetch_add(&g_ops, 2 * (uint64_t)ops + 2 * PHASE_BLOCKS + 2 * PHASE_MID);
    return NULL;
}

static void phases(void) {
    run_threads(g_threads, phases_thread);
}

/* ---- main --------------------------------------------------------------- */

int main(int argc, char **argv) {
    if (argc < 4 || argc > 5) {
        fprintf(stderr,
                "usage: workloads larson|prodcons|cache-scratch|cache-thrash|sizewalk|churn|mixed|phases "
                "THREADS SCALE [SEED]\n");
        return 2;
    }
    const char *name = argv[1];
    g_threads = atoi(argv[2]);
    g_scale = atol(argv[3]);
    if (argc == 5) g_seed = strtoull(argv[4], NULL, 0);
    if (g_threads < 1 || g_scale < 1) die("THREADS and SCALE must be at least 1");

    double t0 = now();
    if (strcmp(name, "larson") == 0) larson();
    else if (strcmp(name, "prodcons") == 0) prodcons();
    else if (strcmp(name, "cache-scratch") == 0) cache(1);
    else if (strcmp(name, "cache-thrash") == 0) cache(0);
    else if (strcmp(name, "sizewalk") == 0) sizewalk();
    else if (strcmp(name, "churn") == 0) churn();
    else if (strcmp(name, "mixed") == 0) mixed();
    else if (strcmp(name, "phases") == 0) phases();
    else die("unknown workload");
    double seconds = now() - t0;

    printf("workload=%s checksum=%llu seconds=%.6f ops=%llu threads=%d scale=%ld peak_kib=%ld\n", name,
           (unsigned long long)atomic_load(&g_checksum), seconds,
           (unsigned long long)atomic_load(&g_ops), g_threads, g_scale, peak_kib());
    return 0;
}
