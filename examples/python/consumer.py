"""DYAD's minimal consumer in Python, unchanged by dyadfs: a loop of N files opened with open(),
read whole and checked. It may start before the producer: a dyadfs mount started with `--wait`
holds each open until the producer has closed that file (or the wait runs out: ENOENT).
Exits 1 on any wrong byte.

Usage: python3 consumer.py DIR N SIZE
"""
import sys

from producer import frame


def main():
    directory, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    for i in range(n):
        path = f"{directory}/frame_{i}.bin"
        with open(path, "rb") as f:
            if f.read() != frame(i, size):
                sys.exit(f"validation: BAD {path}")
    print(f"consumed {n} files of {size} bytes from {directory}: validation OK")


if __name__ == "__main__":
    main()
