/* Under a limit on address space (RLIMIT_AS, what `ulimit -v` sets) the
 * allocator starts small and grows.  The program sets a 512 MiB limit and
 * runs itself again under it (so the library starts under the limit), then:
 * fills about 300 MiB with blocks of every kind while four threads allocate
 * and free small and medium blocks across threads, checks every block's
 * contents, allocates until it is refused (NULL and ENOMEM, no crash), frees
 * everything and allocates again, and frees pointers outside the arena (far
 * above it, where the arena could have grown to, and below it, where its
 * tables are), which must be refused, not crash (not in check mode, which
 * aborts on them by design).  Then `canopy_collect` gives the free memory
 * back, addresses included: the free top of the arena, and the free spans
 * below the pages the worker threads' heaps (kept for adoption) still hold,
 * which become holes: the process's VmSize falls by at least 256 MiB (505
 * to 47 MiB when written; 46 MiB, the top alone, before free spans below
 * live memory were unmapped too), and the program can map that much itself
 * under the limit.  Prints "aslimit ok". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "aslimit: check failed at line %d: %s\n", __LINE__, #c); exit(1); } } while (0)

#define LIMIT (512ul << 20)
#define SLOTS 4096

static void *shared[4][SLOTS];

/* The process's mapped address space (VmSize) in bytes. */
static size_t vm_size(void) {
    FILE *f = fopen("/proc/self/status", "r");
    CHECK(f != NULL);
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %zu kB", &kb) == 1) break;
    fclose(f);
    CHECK(kb > 0);
    return kb << 10;
}

static uint32_t next(uint32_t *s) { *s ^= *s << 13; *s ^= *s >> 17; *s ^= *s << 5; return *s; }

/* Each thread fills its own table, then frees the next thread's table's
 * blocks (cross-thread frees) after checking them. */
static pthread_barrier_t barrier;
static void *worker(void *arg) {
    long id = (long)arg;
    uint32_t s = (uint32_t)id * 2654435761u + 1;
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < SLOTS; i++) {
            size_t n = next(&s) % 8 == 0 ? 8192 + next(&s) % 60000 : 16 + next(&s) % 1000;
            unsigned char *p = malloc(n);
            CHECK(p != NULL);
            memset(p, (int)(id + i) & 255, 16);
            shared[id][i] = p;
        }
        pthread_barrier_wait(&barrier);
        long other = (id + 1) % 4;
        for (int i = 0; i < SLOTS; i++) {
            unsigned char *p = shared[other][i];
            CHECK(p[0] == (unsigned char)((other + i) & 255) && p[15] == p[0]);
            free(p);
        }
        pthread_barrier_wait(&barrier);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        struct rlimit r;
        CHECK(getrlimit(RLIMIT_AS, &r) == 0);
        CHECK(r.rlim_max == RLIM_INFINITY || r.rlim_max >= LIMIT); /* the hard limit stays */
        r.rlim_cur = LIMIT;
        CHECK(setrlimit(RLIMIT_AS, &r) == 0);
        execv("/proc/self/exe", (char *[]){argv[0], "limited", NULL});
        perror("execv");
        return 1;
    }
    struct rlimit r;
    CHECK(getrlimit(RLIMIT_AS, &r) == 0 && r.rlim_cur == LIMIT);

    /* About 300 MiB of small, medium and large blocks, every byte written. */
    enum { MAX = 100000 };
    static unsigned char *held[MAX];
    static size_t size[MAX];
    size_t total = 0;
    int n = 0;
    uint32_t s = 7;
    while (total < (300ul << 20)) {
        uint32_t k = next(&s) % 16;
        size_t len = k == 0 ? (1ul << 20) + next(&s) % (3ul << 20) : k < 4 ? 9000 + next(&s) % 200000 : 1 + next(&s) % 2000;
        unsigned char *p = malloc(len);
        CHECK(p != NULL);
        memset(p, n & 255, len);
        held[n] = p;
        size[n++] = len;
        total += len;
        CHECK(n < MAX);
    }

    pthread_barrier_init(&barrier, NULL, 4);
    pthread_t t[4];
    for (long i = 0; i < 4; i++) CHECK(pthread_create(&t[i], NULL, worker, (void *)i) == 0);
    for (int i = 0; i < 4; i++) CHECK(pthread_join(t[i], NULL) == 0);

    for (int i = 0; i < n; i++) {
        for (size_t j = 0; j < size[i]; j += 509) CHECK(held[i][j] == (unsigned char)(i & 255));
        CHECK(held[i][size[i] - 1] == (unsigned char)(i & 255));
    }

    /* Past the limit: refused cleanly. */
    enum { MORE = 512 };
    void *more[MORE];
    int m = 0;
    for (; m < MORE; m++) {
        errno = 0;
        more[m] = malloc(8u << 20);
        if (!more[m]) {
            CHECK(errno == ENOMEM);
            break;
        }
    }
    CHECK(m < MORE); /* 4 GiB cannot fit under 512 MiB */
    errno = 0;
    CHECK(malloc(1ul << 30) == NULL && errno == ENOMEM);

    /* Frees outside the arena: refused (reported on stderr), the program
     * goes on.  A pointer 64 GiB above a block lies where an arena reserved
     * whole would have units, but this one never grew there; 1 GiB below
     * one lies among its tables. */
    unsigned char *probe = malloc(64);
    CHECK(probe != NULL);
    const char *check = getenv("CANOPY_CHECK");
    if (!check || strcmp(check, "1") != 0) { /* check mode aborts on them, by design */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wfree-nonheap-object"
        free(probe + (64ul << 30));
        free(probe - (1ul << 30));
#pragma GCC diagnostic pop
    }
    free(probe);

    for (int i = 0; i < m; i++) free(more[i]);
    for (int i = 0; i < n; i++) free(held[i]);

    /* The heap's addresses go back: room for a mapping of the program's own. */
    size_t (*collect)(void) = (size_t (*)(void))dlsym(RTLD_DEFAULT, "canopy_collect");
    CHECK(collect != NULL); /* run under LD_PRELOAD of Canopy */
    size_t before = vm_size();
    collect();
    size_t after = vm_size();
    CHECK(after + (256ul << 20) <= before);
    size_t room = before - after - (4ul << 20);
    void *own = mmap(NULL, room, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(own != MAP_FAILED);
    memset(own, 1, 1ul << 20);
    CHECK(munmap(own, room) == 0);
    /* Memory freed is memory to allocate again. */
    void *again[64];
    for (int i = 0; i < 64; i++) {
        again[i] = malloc(4u << 20);
        CHECK(again[i] != NULL);
        memset(again[i], i, 4u << 20);
    }
    for (int i = 0; i < 64; i++) free(again[i]);
    printf("aslimit ok\n");
    return 0;
}
