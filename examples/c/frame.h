/* The bytes of frame i, position dependent so a misplaced chunk is caught. */
#include <stddef.h>
#include <stdint.h>

static void frame_fill(unsigned char *buf, size_t size, long i) {
    uint64_t x = (uint64_t)(i + 1) * 0x9e3779b97f4a7c15ull;
    for (size_t k = 0; k < size; k++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf[k] = (unsigned char)x;
    }
}
