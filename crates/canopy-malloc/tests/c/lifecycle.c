/* Process and thread lifecycle under LD_PRELOAD: allocation before main, from
 * thread-local destructors, thousands of short-lived threads (some blocks
 * freed by the parent), and fork() while other threads allocate.
 * Usage: lifecycle [threads-to-churn].  Prints "lifecycle ok". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char *early;
__attribute__((constructor)) static void before_main(void) {
    early = malloc(100);
    strcpy(early, "allocated before main");
}

static pthread_key_t key;
static void tls_dtor(void *p) {
    /* Allocation and free inside a thread-local destructor. */
    char *q = malloc(64);
    memcpy(q, p, 16);
    free(p);
    free(q);
}

static void *short_lived(void *arg) {
    pthread_setspecific(key, malloc(32));
    void *keep = NULL;
    for (int i = 0; i < 200; i++) {
        void *p = malloc(16 + (i * 37) % 2000);
        memset(p, i, 16);
        if (i == 100) keep = p; else free(p);
    }
    (void)arg;
    return keep; /* freed by the parent */
}

static volatile int stop;
enum { HANDOFF = 3000 };
static void *handoff[HANDOFF];
static volatile int handoff_ready;

static void *busy(void *arg) {
    if (arg) {
        /* Blocks owned by this thread's heap, freed later by a thread of a
         * forked child (which may get this thread's id there). */
        for (int i = 0; i < HANDOFF; i++) handoff[i] = malloc(48);
        __atomic_store_n(&handoff_ready, 1, __ATOMIC_RELEASE);
    }
    while (!stop) {
        void *ps[64];
        for (int i = 0; i < 64; i++) ps[i] = malloc(8 + i * 24);
        for (int i = 0; i < 64; i++) free(ps[i]);
    }
    return NULL;
}

static void *child_thread(void *arg) {
    (void)arg;
    void *p = malloc(1000);
    free(p);
    /* Free the parent's busy thread's blocks, then check this thread's own
     * allocations stay distinct and intact. */
    for (int i = 0; i < HANDOFF; i++) free(handoff[i]);
    enum { N = 20000 };
    static unsigned char *mine[N];
    for (int i = 0; i < N; i++) { mine[i] = malloc(48); memset(mine[i], i & 255, 48); }
    for (int i = 0; i < N; i++)
        for (int j = 0; j < 48; j++)
            if (mine[i][j] != (unsigned char)(i & 255)) { fprintf(stderr, "child thread: block %d corrupted\n", i); _exit(3); }
    for (int i = 0; i < N; i++) free(mine[i]);
    return NULL;
}

int main(int argc, char **argv) {
    int churn = argc > 1 ? atoi(argv[1]) : 2000;
    if (!early || strcmp(early, "allocated before main") != 0) { fprintf(stderr, "constructor allocation lost\n"); return 1; }
    free(early);
    pthread_key_create(&key, tls_dtor);
    for (int i = 0; i < churn; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, short_lived, NULL) != 0) { fprintf(stderr, "pthread_create failed\n"); return 1; }
        void *ret;
        pthread_join(t, &ret);
        free(ret);
    }
    /* fork while two threads allocate */
    pthread_t b[2];
    for (int i = 0; i < 2; i++) pthread_create(&b[i], NULL, busy, i == 0 ? (void *)1 : NULL);
    while (!__atomic_load_n(&handoff_ready, __ATOMIC_ACQUIRE)) sched_yield();
    for (int f = 0; f < 20; f++) {
        pid_t pid = fork();
        if (pid == 0) {
            for (int i = 0; i < 1000; i++) { void *p = malloc(i * 8); free(p); }
            pthread_t t;
            pthread_create(&t, NULL, child_thread, NULL);
            pthread_join(t, NULL);
            _exit(0);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) { fprintf(stderr, "child %d failed: status %d\n", f, st); return 1; }
    }
    stop = 1;
    for (int i = 0; i < 2; i++) pthread_join(b[i], NULL);

    /* Alone again: the global heap goes back to running without its lock. */
    size_t (*stats_json)(char *, size_t) = (size_t (*)(char *, size_t))dlsym(RTLD_DEFAULT, "canopy_stats_json");
    if (!stats_json) { fprintf(stderr, "canopy_stats_json not found\n"); return 1; }
    for (int i = 0; i < 4; i++) { void *big = malloc(8 << 20); free(big); }
    char buf[4096];
    stats_json(buf, sizeof buf);
    const char *u = strstr(buf, "\"unlocked_global_entries\":");
    const char *s = strstr(buf, "\"solo_periods\":");
    long unlocked0 = u ? atol(u + strlen("\"unlocked_global_entries\":")) : -1;
    long periods = s ? atol(s + strlen("\"solo_periods\":")) : -1;
    for (int i = 0; i < 4; i++) { void *big = malloc(8 << 20); free(big); }
    stats_json(buf, sizeof buf);
    u = strstr(buf, "\"unlocked_global_entries\":");
    long unlocked1 = u ? atol(u + strlen("\"unlocked_global_entries\":")) : -1;
    if (periods < 1 || unlocked1 <= unlocked0) {
        fprintf(stderr, "no new solo period after the threads ended: periods=%ld unlocked %ld -> %ld\n", periods, unlocked0, unlocked1);
        return 1;
    }
    printf("lifecycle ok\n");
    return 0;
}
