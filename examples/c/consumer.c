/* DYAD's minimal consumer, unchanged by dyadfs: a loop of N files, each opened with stdio,
 * read whole and checked. It may start before the producer: a dyadfs mount started with
 * `--wait` holds the open until the producer has closed the file (or the wait runs out:
 * ENOENT). Exits 1 on any wrong byte. Usage: consumer DIR N SIZE */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s DIR N SIZE\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    long n = atol(argv[2]);
    size_t size = (size_t)atol(argv[3]);
    unsigned char *got = malloc(size + 1), *want = malloc(size ? size : 1);
    if (!got || !want) return 1;
    for (long i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/frame_%ld.bin", dir, i);
        FILE *f = fopen(path, "rb");
        if (!f) {
            fprintf(stderr, "open %s: %s\n", path, strerror(errno));
            return 1;
        }
        /* One byte more than expected, so a longer file is caught too. */
        size_t len = fread(got, 1, size + 1, f);
        fclose(f);
        frame_fill(want, size, i);
        if (len != size || memcmp(got, want, size) != 0) {
            fprintf(stderr, "validation: BAD %s (%zu bytes)\n", path, len);
            return 1;
        }
    }
    printf("consumed %ld files of %zu bytes from %s: validation OK\n", n, size, dir);
    free(got);
    free(want);
    return 0;
}
