/* The region API of canopy.h, linked against libcanopy_malloc.
 * Prints "regions ok" and exits 0 on success; a failure prints what and exits 1. */
#include <errno.h>
#include <sys/wait.h>
#include <unistd.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "canopy.h"

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "regions: check failed at line %d: %s (%s)\n", __LINE__, #c, canopy_region_error()); exit(1); } } while (0)

struct node { struct node *next; uint64_t value; };

static void *worker(void *arg) {
    canopy_rid_t parent = (canopy_rid_t)(uintptr_t)arg;
    for (int round = 0; round < 50; round++) {
        canopy_rid_t r = canopy_ralloc(parent, 2);
        CHECK(r != 0);
        struct node *head = NULL;
        for (uint64_t i = 0; i < 500; i++) {
            struct node *n = canopy_region_alloc(sizeof *n, r);
            CHECK(n != NULL);
            n->next = head;
            n->value = i;
            head = n;
        }
        uint64_t sum = 0;
        for (struct node *n = head; n; n = n->next) sum += n->value;
        CHECK(sum == 499 * 500 / 2);
        CHECK(canopy_rfree(r) == 0);
    }
    return NULL;
}

int main(void) {
    /* A tree of regions. */
    canopy_rid_t a = canopy_ralloc(CANOPY_REGION_ROOT, 1);
    canopy_rid_t b = canopy_ralloc(a, 2);
    CHECK(a != 0 && b != 0 && a != b && a != CANOPY_REGION_ROOT);

    /* A 30,000-node list packs into a handful of runs. */
    struct node *head = NULL;
    for (uint64_t i = 0; i < 30000; i++) {
        struct node *n = canopy_region_alloc(sizeof *n, b);
        CHECK(n != NULL && ((uintptr_t)n & 15) == 0); /* a 16-byte slot */
        n->next = head;
        n->value = i;
        head = n;
    }
    CHECK(canopy_region_of(head) == b);
    CHECK(canopy_region_of(&head) == 0);
    size_t nruns = canopy_region_pack(a, NULL, 0);
    CHECK(nruns >= 1 && nruns <= 4);
    canopy_run_t runs[8];
    CHECK(canopy_region_pack(a, runs, 8) == nruns);
    size_t bytes = 0;
    for (size_t i = 0; i < nruns; i++) bytes += runs[i].len;
    CHECK(bytes >= 30000 * sizeof(struct node) && bytes <= 30000 * sizeof(struct node) + 3 * 4096);

    /* Many objects in one call; realloc keeps contents and moves regions. */
    void *objs[100];
    CHECK(canopy_region_balloc(200, a, 100, objs) == 0);
    memset(objs[7], 0x5a, 200);
    char *moved = canopy_region_realloc(objs[7], 20000, b);
    CHECK(moved != NULL && canopy_region_of(moved) == b);
    for (int i = 0; i < 200; i++) CHECK((unsigned char)moved[i] == 0x5a);
    CHECK(canopy_region_free(moved) == 0);
    CHECK(canopy_region_free(NULL) == 0);

    /* Bad calls: an error, errno, a message, and nothing lost. */
    errno = 0;
    CHECK(canopy_region_free(objs[0]) == 0);
    CHECK(canopy_region_free(objs[0]) == -1 && errno == EINVAL);
    CHECK(strstr(canopy_region_error(), "double free") != NULL);
    CHECK(canopy_region_free((char *)objs[1] + 8) == -1 && strstr(canopy_region_error(), "not at its start"));
    int local;
    CHECK(canopy_region_free(&local) == -1 && strstr(canopy_region_error(), "not in memory owned by any region"));
    CHECK(canopy_region_alloc(10, 0) == NULL && errno == EINVAL);
    CHECK(canopy_region_alloc(10, 987654321) == NULL && strstr(canopy_region_error(), "does not exist"));
    CHECK(canopy_rfree(CANOPY_REGION_ROOT) == -1 && strstr(canopy_region_error(), "root"));
    CHECK(canopy_region_balloc(10, a, 5, NULL) == -1);

    /* fork() while threads are inside region calls: the child can go on. */
    {
        pthread_t busy[2];
        for (int i = 0; i < 2; i++) CHECK(pthread_create(&busy[i], NULL, worker, (void *)(uintptr_t)a) == 0);
        for (int k = 0; k < 20; k++) {
            pid_t pid = fork();
            CHECK(pid >= 0);
            if (pid == 0) {
                canopy_rid_t r = canopy_ralloc(a, 3);
                void *objs2[1000];
                int ok = r != 0 && canopy_region_balloc(100, r, 1000, objs2) == 0 && canopy_rfree(r) == 0 &&
                         canopy_region_of(head) == b;
                _exit(ok ? 0 : 7);
            }
            int status = 0;
            CHECK(waitpid(pid, &status, 0) == pid);
            CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        }
        for (int i = 0; i < 2; i++) pthread_join(busy[i], NULL);
    }

    /* Threads create and free regions under a shared parent. */
    pthread_t t[4];
    for (int i = 0; i < 4; i++) CHECK(pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)a) == 0);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);

    /* Freeing a frees b and every object; the ids are dead for good. */
    uint64_t sum = 0;
    for (struct node *n = head; n; n = n->next) sum += n->value;
    CHECK(sum == (uint64_t)29999 * 30000 / 2);
    CHECK(canopy_rfree(a) == 0);
    CHECK(canopy_rfree(a) == -1 && strstr(canopy_region_error(), "has been freed"));
    CHECK(canopy_region_alloc(10, b) == NULL && strstr(canopy_region_error(), "has been freed"));
    CHECK(canopy_region_free(head) == -1);
    CHECK(canopy_ralloc(b, 0) == 0);

    /* malloc and regions side by side. */
    canopy_rid_t c = canopy_ralloc(CANOPY_REGION_ROOT, 0);
    void *m = malloc(100), *o = canopy_region_alloc(100, c);
    CHECK(m && o && canopy_region_of(m) == 0 && canopy_region_of(o) == c);
    CHECK(canopy_region_free(m) == -1);
    free(m);
    if (getenv("REGIONS_FREE_REGION_OBJECT_WITH_FREE")) {
        void *volatile alias = o; /* the compiler must not see free(o) then use o */
        free(alias); /* refused by the allocator: not malloc memory */
        CHECK(canopy_region_free(o) == 0);
    }
    CHECK(canopy_rfree(c) == 0);
    printf("regions ok\n");
    return 0;
}
