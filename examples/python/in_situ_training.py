"""In-situ training on a dyadfs managed directory (DYAD's first use, MuMMI-style): producers on
some nodes write samples as they make them, and an unmodified torch DataLoader on other nodes
trains on them, each open waiting (`dyadfs mount --wait`) for a sample not produced yet. Nothing
touches a shared file system: every node mounts `dyadfs mount /dyad --ssd /nvme --wait 60s`.

  produce DIR --producer P --samples N [--rate R] [--dim D] [--copy] --log LOG
      writes DIR/sample-P-IIIII.npy, R samples a second: a structured numpy array of one record,
      a float32 vector `x` of D values and an int64 `label`. Logs one JSON line per sample: its
      name, the time just before its close, and the sha256 of its bytes. --copy: writes each to
      a scratch directory and copies it in with shutil.copy (as staging code does; the time
      logged is just before the copy).
  train DIR --producers P --samples N --rank R --world W [--epochs E] [--workers K] --log LOG
      trains a linear classifier for E epochs on this rank's share of the P x N samples
      (every W-th, from R), read by a DataLoader with K worker processes through a Dataset
      that lists DIR and opens each sample by name. Logs one JSON line per sample read: name,
      epoch, the time of its open, the sha256 of its bytes, and the process that read it.
"""
import argparse
import hashlib
import io
import json
import os
import shutil
import tempfile
import time

import numpy as np

CLASSES = 4


def record_dtype(dim):
    return np.dtype([("x", np.float32, (dim,)), ("label", np.int64)])


def sample(producer, i, dim):
    """The sample a producer makes at step i: reproducible, so a consumer could check it too."""
    rng = np.random.default_rng(producer * 1_000_003 + i)
    rec = np.zeros(1, dtype=record_dtype(dim))
    label = int(rng.integers(CLASSES))
    # Classes are separable: the label shifts the mean of a slice of the vector.
    x = rng.standard_normal(dim).astype(np.float32)
    x[label * (dim // CLASSES) : (label + 1) * (dim // CLASSES)] += 2.0
    rec["x"][0] = x
    rec["label"][0] = label
    return rec


def name(producer, i):
    return f"sample-{producer}-{i:05}.npy"


def produce(a):
    os.makedirs(a.dir, exist_ok=True)
    period = 1.0 / a.rate if a.rate > 0 else 0.0
    start = time.time()
    scratch = tempfile.mkdtemp(prefix="in-situ-") if a.copy else None
    with open(a.log, "a") as log:
        for i in range(a.samples):
            buf = io.BytesIO()
            np.save(buf, sample(a.producer, i, a.dim))
            data = buf.getvalue()
            if scratch:
                src = os.path.join(scratch, name(a.producer, i))
                with open(src, "wb") as f:
                    f.write(data)
                closing = time.time()
                shutil.copy(src, os.path.join(a.dir, name(a.producer, i)))
                os.unlink(src)
            else:
                with open(os.path.join(a.dir, name(a.producer, i)), "wb") as f:
                    f.write(data)
                    # A consumer may open it once it is closed (published), not before.
                    closing = time.time()
            log.write(json.dumps({"name": name(a.producer, i), "closing": closing,
                                  "sha256": hashlib.sha256(data).hexdigest()}) + "\n")
            log.flush()
            delay = start + (i + 1) * period - time.time()
            if delay > 0:
                time.sleep(delay)
    if scratch:
        shutil.rmtree(scratch)
    print(f"producer {a.producer}: wrote {a.samples} samples to {a.dir}")


class Samples:
    """A map-style Dataset over the samples' names: opens each through the mount (the open
    waits until its producer has closed it), and logs what it read."""

    def __init__(self, directory, names, log):
        self.directory, self.names, self.log = directory, names, log
        self.epoch = 0

    def __len__(self):
        return len(self.names)

    def __getitem__(self, k):
        import torch

        n = self.names[k]
        with open(os.path.join(self.directory, n), "rb") as f:
            opened = time.time()  # when the open returned (it waits for the producer's close)
            data = f.read()
        with open(self.log, "a") as log:
            log.write(json.dumps({"name": n, "epoch": self.epoch, "opened": opened, "pid": os.getpid(),
                                  "sha256": hashlib.sha256(data).hexdigest()}) + "\n")
        rec = np.load(io.BytesIO(data))
        return torch.from_numpy(rec["x"][0].copy()), int(rec["label"][0])


def train(a):
    import torch
    from torch.utils.data import DataLoader

    every = [name(p, i) for p in range(a.producers) for i in range(a.samples)]
    mine = every[a.rank :: a.world]
    present = set(os.listdir(a.dir)) if os.path.isdir(a.dir) else set()
    print(f"rank {a.rank}: {len(mine)} samples, {len(present & set(mine))} already produced")
    data = Samples(a.dir, mine, a.log)
    torch.manual_seed(a.rank)
    model = torch.nn.Linear(a.dim, CLASSES)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = torch.nn.CrossEntropyLoss()
    for epoch in range(a.epochs):
        data.epoch = epoch
        loader = DataLoader(data, batch_size=16, shuffle=epoch > 0, num_workers=a.workers)
        seen, correct, total_loss = 0, 0, 0.0
        for x, y in loader:
            opt.zero_grad()
            out = model(x)
            loss = loss_fn(out, y)
            loss.backward()
            opt.step()
            seen += len(y)
            correct += int((out.argmax(1) == y).sum())
            total_loss += float(loss) * len(y)
        print(f"rank {a.rank} epoch {epoch + 1}: {seen} samples, loss {total_loss / seen:.3f}, "
              f"accuracy {correct / seen:.2f}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("produce")
    pr.add_argument("dir")
    pr.add_argument("--producer", type=int, required=True)
    pr.add_argument("--samples", type=int, required=True)
    pr.add_argument("--rate", type=float, default=0.0, help="samples a second (0: as fast as it can)")
    pr.add_argument("--dim", type=int, default=1024)
    pr.add_argument("--copy", action="store_true", help="copy each sample in with shutil.copy")
    pr.add_argument("--log", required=True)
    tr = sub.add_parser("train")
    tr.add_argument("dir")
    tr.add_argument("--producers", type=int, required=True)
    tr.add_argument("--samples", type=int, required=True)
    tr.add_argument("--rank", type=int, default=0)
    tr.add_argument("--world", type=int, default=1)
    tr.add_argument("--epochs", type=int, default=3)
    tr.add_argument("--workers", type=int, default=2)
    tr.add_argument("--dim", type=int, default=1024)
    tr.add_argument("--log", required=True)
    a = p.parse_args()
    produce(a) if a.cmd == "produce" else train(a)


if __name__ == "__main__":
    main()
