"""DYAD's minimal producer in Python, unchanged by dyadfs: a loop of N files written with open()
and closed. Closing a file under a dyadfs mount publishes it to every other node.

Usage: python3 producer.py DIR N SIZE
"""
import random
import sys


def frame(i, size):
    # Deterministic bytes per frame, so the consumer can check them without a side channel.
    return random.Random(i).randbytes(size)


def main():
    directory, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    for i in range(n):
        with open(f"{directory}/frame_{i}.bin", "wb") as f:
            f.write(frame(i, size))
    print(f"produced {n} files of {size} bytes in {directory}")


if __name__ == "__main__":
    main()
