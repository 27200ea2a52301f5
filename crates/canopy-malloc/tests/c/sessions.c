/* Region sessions of canopy.h (canopy_region_begin .. canopy_region_end),
 * linked against libcanopy_malloc.  Prints "sessions ok" and exits 0 on
 * success; a failure prints what and exits 1. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "canopy.h"

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "sessions: check failed at line %d: %s (%s)\n", __LINE__, #c, canopy_region_error()); exit(1); } } while (0)
#define HAS(s) (strstr(canopy_region_error(), (s)) != NULL)

struct node { struct node *next; uint64_t value; };

static canopy_session_t g_session;
static canopy_rid_t g_region;
static atomic_int g_other_done;

/* Another thread with the session's handle: refused, nothing allocated. */
static void *use_foreign_handle(void *arg) {
    (void)arg;
    errno = 0;
    CHECK(canopy_session_alloc(g_session, 32) == NULL && errno == EINVAL && HAS("not open on this thread"));
    CHECK(canopy_region_end(g_session) == -1 && HAS("not open on this thread"));
    return NULL;
}

/* Another thread's region call waits for the session to end. */
static void *region_call_waits(void *arg) {
    (void)arg;
    canopy_rid_t r = canopy_ralloc(g_region, 0);
    CHECK(r != 0);
    atomic_store(&g_other_done, 1);
    CHECK(canopy_rfree(r) == 0);
    return NULL;
}

/* A thread that ends with its session open: the session is ended for it. */
static void *forget_to_end(void *arg) {
    canopy_rid_t r = (canopy_rid_t)(uintptr_t)arg;
    canopy_session_t s = canopy_region_begin(r);
    CHECK(s != 0);
    CHECK(canopy_session_alloc(s, 40) != NULL);
    return (void *)(uintptr_t)s;
}

/* A session begun while the thread is ending (in a pthread_key_t destructor,
 * after the thread's thread_local destructors have run) and not ended: the
 * thread still ends it.  `used_before` has the thread use a session first. */
static pthread_key_t g_late_key;

static void late_session(void *arg) {
    canopy_rid_t r = (canopy_rid_t)(uintptr_t)arg;
    canopy_session_t s = canopy_region_begin(r);
    if (s != 0) canopy_session_alloc(s, 48);
}

static void *end_with_late_session(void *arg) {
    canopy_rid_t r = (canopy_rid_t)(uintptr_t)arg;
    if (r & ((canopy_rid_t)1 << 63)) {
        r &= ~((canopy_rid_t)1 << 63);
        canopy_session_t s = canopy_region_begin(r);
        CHECK(s != 0 && canopy_session_alloc(s, 16) != NULL && canopy_region_end(s) == 0);
    }
    CHECK(pthread_setspecific(g_late_key, (void *)(uintptr_t)r) == 0);
    return NULL;
}

static void lock_lost(int sig) {
    (void)sig;
    static const char m[] = "sessions: the region lock was lost with a thread that ended\n";
    (void)!write(2, m, sizeof m - 1);
    _exit(1);
}

int main(void) {
    canopy_rid_t r = canopy_ralloc(CANOPY_REGION_ROOT, 0);
    CHECK(r != 0);
    g_region = r;

    /* A list of 30000 nodes built in one session. */
    canopy_session_t s = canopy_region_begin(r);
    CHECK(s != 0);
    g_session = s;
    struct node *head = NULL;
    for (uint64_t i = 0; i < 30000; i++) {
        struct node *n = canopy_session_alloc(s, sizeof *n);
        CHECK(n != NULL && ((uintptr_t)n & 15) == 0);
        n->next = head;
        n->value = i;
        head = n;
    }
    /* Objects of other sizes, up to one larger than a slab. */
    char *big = canopy_session_alloc(s, 10000);
    CHECK(big != NULL);
    memset(big, 0x5a, 10000);
    void *x = canopy_session_alloc(s, 200);
    CHECK(x != NULL && canopy_session_free(s, x) == 0);
    CHECK(canopy_session_free(s, x) == -1 && errno == EINVAL && HAS("double free"));
    CHECK(canopy_session_free(s, NULL) == 0);

    /* Misuse within the session: refused, the session goes on. */
    CHECK(canopy_region_begin(r) == 0 && HAS("end it first"));
    CHECK(canopy_region_alloc(16, r) == NULL && errno == EINVAL && HAS("end it first"));
    CHECK(canopy_ralloc(r, 0) == 0 && HAS("end it first"));
    CHECK(canopy_region_of(head) == 0); /* refused too: 0, with the message */
    CHECK(HAS("end it first"));
    CHECK(canopy_session_alloc(s + 1, 16) == NULL && HAS("not open"));
    CHECK(canopy_session_alloc(0, 16) == NULL && HAS("not open"));
    pthread_t t;
    CHECK(pthread_create(&t, NULL, use_foreign_handle, NULL) == 0);
    CHECK(pthread_join(t, NULL) == 0);

    /* Another thread's region call waits until the session ends. */
    atomic_store(&g_other_done, 0);
    CHECK(pthread_create(&t, NULL, region_call_waits, NULL) == 0);
    usleep(50 * 1000);
    CHECK(atomic_load(&g_other_done) == 0);

    /* fork() inside the session: the session goes on in both processes. */
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int ok = 1;
        for (int i = 0; i < 1000; i++) ok &= canopy_session_alloc(s, 24) != NULL;
        ok &= canopy_region_end(s) == 0;
        ok &= canopy_region_of(head) == r;
        canopy_rid_t q = canopy_ralloc(r, 0);
        ok &= q != 0 && canopy_rfree(q) == 0;
        _exit(ok ? 0 : 7);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(canopy_session_alloc(s, 24) != NULL);
    CHECK(atomic_load(&g_other_done) == 0);

    CHECK(canopy_region_end(s) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(atomic_load(&g_other_done) == 1);

    /* After the end: the handle is dead, the objects live in the region. */
    CHECK(canopy_session_alloc(s, 16) == NULL && errno == EINVAL && HAS("not open"));
    CHECK(canopy_region_end(s) == -1 && HAS("not open"));
    CHECK(canopy_region_of(head) == r && canopy_region_of(big) == r);
    uint64_t sum = 0;
    for (struct node *n = head; n; n = n->next) sum += n->value;
    CHECK(sum == (uint64_t)29999 * 30000 / 2);
    for (int i = 0; i < 10000; i++) CHECK((unsigned char)big[i] == 0x5a);
    CHECK(canopy_region_free(big) == 0);

    /* A thread that forgets to end its session does not keep the lock. */
    void *ended = NULL;
    CHECK(pthread_create(&t, NULL, forget_to_end, (void *)(uintptr_t)r) == 0);
    CHECK(pthread_join(t, &ended) == 0);
    CHECK((canopy_session_t)(uintptr_t)ended > s);
    canopy_rid_t q = canopy_ralloc(r, 0);
    CHECK(q != 0 && canopy_rfree(q) == 0);

    /* A session begun as the thread ends (after its thread_local destructors)
     * does not keep the lock either, whether or not the thread had used a
     * session before. */
    signal(SIGALRM, lock_lost);
    CHECK(pthread_key_create(&g_late_key, late_session) == 0);
    for (int used_before = 0; used_before < 2; used_before++) {
        canopy_rid_t arg = r | (used_before ? (canopy_rid_t)1 << 63 : 0);
        CHECK(pthread_create(&t, NULL, end_with_late_session, (void *)(uintptr_t)arg) == 0);
        CHECK(pthread_join(t, NULL) == 0);
        alarm(10);
        q = canopy_ralloc(r, 0);
        alarm(0);
        CHECK(q != 0 && canopy_rfree(q) == 0);
    }

    /* A session in a freed region, or a bad id, is refused. */
    CHECK(canopy_rfree(r) == 0);
    CHECK(canopy_region_begin(r) == 0 && errno == EINVAL && HAS("has been freed"));
    CHECK(canopy_region_begin(0) == 0 && errno == EINVAL);
    printf("sessions ok\n");
    return 0;
}
