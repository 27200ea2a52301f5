/* Exhaustion under LD_PRELOAD with a small arena (CANOPY_ARENA_GB=1): large
 * requests fail with NULL and ENOMEM, nothing crashes, and once memory is
 * freed allocation works again.  Prints "oom ok". */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "oom: check failed at line %d: %s\n", __LINE__, #c); exit(1); } } while (0)

int main(void) {
    enum { MAX = 64 };
    void *held[MAX];
    int n = 0;
    char *s = malloc(100); /* this thread's heap takes its first page now */
    CHECK(s != NULL);
    for (; n < MAX; n++) {
        errno = 0;
        held[n] = malloc(256u << 20); /* 256 MiB, never touched */
        if (!held[n]) {
            CHECK(errno == ENOMEM);
            break;
        }
    }
    CHECK(n > 0 && n < MAX); /* a 1 GiB arena holds a few of them, not 64 */
    /* Small requests still work from the page the heap already holds. */
    char *t = malloc(100);
    CHECK(t != NULL);
    free(t);
    strcpy(s, "still alive");
    errno = 0;
    CHECK(calloc(1, 1u << 30) == NULL && errno == ENOMEM);
    CHECK(realloc(s, 2u << 30) == NULL && errno == ENOMEM);
    CHECK(strcmp(s, "still alive") == 0); /* a failed realloc keeps the block */
    for (int i = 0; i < n; i++) free(held[i]);
    void *again = malloc(256u << 20);
    CHECK(again != NULL);
    free(again);
    free(s);
    printf("oom ok\n");
    return 0;
}
