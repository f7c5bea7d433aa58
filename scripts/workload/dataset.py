"""The workload's dataset: COUNT npz files of about SIZE bytes, sample i holding `x` (SIZE
uint8 bytes that depend only on i, so a reader can check every byte without the original) and
`y` (its label).

Usage: python3 dataset.py DIR COUNT SIZE
"""
import os
import sys

import numpy as np


def sample(i, size):
    """The bytes of sample i."""
    return np.random.default_rng(i).integers(0, 256, size, dtype=np.uint8)


def name(i):
    return f"sample_{i:06d}.npz"


def main():
    directory, count, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    os.makedirs(directory, exist_ok=True)
    for i in range(count):
        path = os.path.join(directory, name(i))
        if not os.path.exists(path):
            np.savez(path, x=sample(i, size), y=np.int64(i % 1000))
    print(f"{count} files of {size} bytes in {directory}", file=sys.stderr)


if __name__ == "__main__":
    main()
