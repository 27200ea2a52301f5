/* Bad frees under LD_PRELOAD.  Usage: badfree double|foreign|interior|large|medium|unchecked
 * (`unchecked`: a block freed twice through canopy_free_class_unchecked, found in the
 * preloaded library as a weak symbol).
 * In check mode Canopy must abort with a message; in the default mode the
 * program goes on, and the memory stays consistent: the next allocations are
 * distinct and keep their contents.  Prints "survived" at the end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Keep the compiler from pairing up and removing malloc/free calls. */
static void *volatile keep;
static char *hide(char *p) { keep = p; return (char *)keep; }

/* Canopy's rich interface, from the preloaded library. */
extern unsigned canopy_size_class(size_t) __attribute__((weak));
extern void canopy_free_class_unchecked(void *, unsigned) __attribute__((weak));

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "double";
    char *p = hide(malloc(100));
    static char not_ours[64];
    if (!strcmp(what, "double")) { free(p); free(p); }
    else if (!strcmp(what, "foreign")) { free(not_ours + 16); free(p); }
    else if (!strcmp(what, "interior")) { free(p + 8); free(p); }
    else if (!strcmp(what, "large")) { char *l = hide(malloc(4 << 20)); free(p); free(l); free(l); }
    else if (!strcmp(what, "medium")) { char *m = hide(malloc(50000)); free(p); free(m); free(m); }
    else if (!strcmp(what, "unchecked")) {
        if (!canopy_size_class || !canopy_free_class_unchecked) { fprintf(stderr, "no canopy_free_class_unchecked\n"); return 1; }
        unsigned c = canopy_size_class(100);
        canopy_free_class_unchecked(p, c);
        canopy_free_class_unchecked(p, c);
    }
    char *a = hide(malloc(100)), *b = hide(malloc(100));
    if (a == b) { fprintf(stderr, "same block handed out twice\n"); return 1; }
    memset(a, 1, 100); memset(b, 2, 100);
    for (int i = 0; i < 100; i++) if (a[i] != 1 || b[i] != 2) { fprintf(stderr, "corrupted\n"); return 1; }
    free(a); free(b);
    printf("survived\n");
    return 0;
}
