"""Checkpoint hand-off between nodes: a trainer saves a model checkpoint under the dyadfs mount
on one node (torch.save), the next stage loads it on another node (torch.load) through its
own mount, with no shared file system in between. Falls back to numpy (np.savez / np.load)
where torch is not installed.

Usage: python3 checkpoint.py save DIR      (on the producer's node)
       python3 checkpoint.py load DIR      (on the consumer's node; checks every tensor)
"""
import sys

import numpy as np

try:
    import torch
except ImportError:
    torch = None


def weights():
    """The trained state: a small MLP's weights, the same on both sides (fixed seed)."""
    rng = np.random.default_rng(2024)
    shapes = {"fc1.weight": (512, 784), "fc1.bias": (512,), "fc2.weight": (10, 512), "fc2.bias": (10,)}
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def save(directory):
    state = weights()
    if torch is not None:
        model = torch.nn.Sequential()
        model.add_module("fc1", torch.nn.Linear(784, 512))
        model.add_module("fc2", torch.nn.Linear(512, 10))
        model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
        torch.save({"epoch": 7, "model": model.state_dict()}, f"{directory}/checkpoint.pt")
        print(f"torch.save: {directory}/checkpoint.pt")
    else:
        np.savez(f"{directory}/checkpoint.npz", **state)
        print(f"np.savez: {directory}/checkpoint.npz")


def load(directory):
    want = weights()
    if torch is not None:
        ckpt = torch.load(f"{directory}/checkpoint.pt", weights_only=True)
        got = {k: v.numpy() for k, v in ckpt["model"].items()}
        assert ckpt["epoch"] == 7, ckpt["epoch"]
    else:
        with np.load(f"{directory}/checkpoint.npz") as z:
            got = {k: z[k] for k in z.files}
    assert got.keys() == want.keys(), sorted(got)
    for k in want:
        if not np.array_equal(got[k], want[k]):
            sys.exit(f"validation: BAD tensor {k}")
    print(f"loaded {len(got)} tensors from {directory}: validation OK ({'torch' if torch else 'numpy'})")


if __name__ == "__main__":
    {"save": save, "load": load}[sys.argv[1]](sys.argv[2])
