"""Workload 1: an unmodified PyTorch input pipeline over a directory of npz files, as a
training job's rank would run it: NpzDataset (np.load(path)["x"] in __getitem__), a
DistributedSampler split (a different shard every epoch through set_epoch), and
DataLoader(batch_size=32, num_workers=4). No model: the step is empty, so the epoch time is the
input pipeline's. Prints one JSON line per epoch: rank, epoch, seconds, samples, bad (samples
whose bytes differ from what dataset.py wrote; only with --verify), and cpu_busy_percent (how
busy the machine's CPUs were during the epoch, all processes).

Usage: python3 train.py --data DIR --rank R --world W --epochs 1 [--first-epoch E] [--verify]
                        [--barrier DIR] [--prefetch]

--prefetch wraps the sampler in examples/python/dyadfs_prefetch.py's PrefetchSampler: each
epoch's file order goes to the dyadfs mount the data is under, which fills the files ahead.
"""
import argparse
import json
import os
import sys
import time
import warnings

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dataset import sample  # noqa: E402


class NpzDataset(Dataset):
    def __init__(self, root):
        self.files = sorted(f for f in os.listdir(root) if f.endswith(".npz"))
        self.root = root

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        x = np.load(os.path.join(self.root, self.files[i]))["x"]
        return torch.from_numpy(x), i


def barrier(directory, rank, world):
    """Waits until all `world` ranks have arrived in `directory`."""
    os.makedirs(directory, exist_ok=True)
    open(os.path.join(directory, str(rank)), "w").close()
    while len(os.listdir(directory)) < world:
        time.sleep(0.01)


def cpu_ticks():
    """The machine's (busy, idle) CPU ticks so far."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[0] + v[1] + v[2] + v[5] + v[6], v[3] + v[4]


def main():
    # Several ranks with 4 workers each share few cores on one test machine; torch warns.
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--first-epoch", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--verify", action="store_true", help="check every sample's bytes")
    p.add_argument("--prefetch", action="store_true",
                   help="hand each epoch's file order to the dyadfs mount (dyadfs_prefetch.py)")
    p.add_argument("--barrier", help="a directory the ranks meet in before the first epoch, so"
                   " that no rank's epoch overlaps another's start-up (importing torch)")
    a = p.parse_args()
    ds = NpzDataset(a.data)
    sampler = DistributedSampler(ds, num_replicas=a.world, rank=a.rank, shuffle=True, seed=0)
    if a.prefetch:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                        "..", "..", "examples", "python"))
        from dyadfs_prefetch import PrefetchSampler
        sampler = PrefetchSampler(sampler, [os.path.join(a.data, f) for f in ds.files])
    loader = DataLoader(ds, batch_size=a.batch_size, sampler=sampler, num_workers=a.workers)
    if a.barrier:
        barrier(a.barrier, a.rank, a.world)
    for epoch in range(a.first_epoch, a.first_epoch + a.epochs):
        sampler.set_epoch(epoch)
        t0, c0 = time.perf_counter(), cpu_ticks()
        samples = bad = 0
        for x, idx in loader:
            samples += len(idx)
            if a.verify:
                for row, i in zip(x.numpy(), idx.tolist()):
                    bad += not np.array_equal(row, sample(i, row.size))
        seconds, c1 = time.perf_counter() - t0, cpu_ticks()
        busy, idle = c1[0] - c0[0], c1[1] - c0[1]
        print(json.dumps({"rank": a.rank, "epoch": epoch, "seconds": round(seconds, 3),
                          "samples": samples, "bad": bad,
                          "cpu_busy_percent": round(100 * busy / max(1, busy + idle), 1)}),
              flush=True)


if __name__ == "__main__":
    main()
