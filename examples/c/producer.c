/* DYAD's minimal producer, unchanged by dyadfs: a loop of N files, each created, written
 * with plain open/write/close and closed. Closing a file under a dyadfs mount publishes it to
 * every other node. Usage: producer DIR N SIZE */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frame.h"

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s DIR N SIZE\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    long n = atol(argv[2]);
    size_t size = (size_t)atol(argv[3]);
    unsigned char *buf = malloc(size ? size : 1);
    if (!buf) return 1;
    for (long i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/frame_%ld.bin", dir, i);
        frame_fill(buf, size, i);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) {
            fprintf(stderr, "open %s: %s\n", path, strerror(errno));
            return 1;
        }
        for (size_t off = 0; off < size;) {
            ssize_t w = write(fd, buf + off, size - off);
            if (w < 0) {
                fprintf(stderr, "write %s: %s\n", path, strerror(errno));
                return 1;
            }
            off += (size_t)w;
        }
        if (close(fd) != 0) {
            fprintf(stderr, "close %s: %s\n", path, strerror(errno));
            return 1;
        }
    }
    printf("produced %ld files of %zu bytes in %s\n", n, size, dir);
    free(buf);
    return 0;
}
