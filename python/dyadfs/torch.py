"""Reads ahead of the sampler: tells a dyadfs mount, at the start of every epoch, the order in
which this rank will open its files, so the mount fills them into its cache (from peers or the
shared file system) a bounded window ahead of the DataLoader. How the data is read does not
change.

    from dyadfs.torch import PrefetchSampler      # pip install dyadfs


    sampler = PrefetchSampler(DistributedSampler(ds, ...), paths=ds.paths)
    loader = DataLoader(ds, batch_size=32, sampler=sampler, num_workers=4)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            ...

(From a clone, `examples/python/dyadfs_prefetch.py` exports the same names.)
`paths[i]` is the file the dataset opens for index `i` (absolute, under the mount). Only the
standard library is used (no torch import): the wrapper is a plain iterable, which DataLoader
accepts as a sampler. Outside a dyadfs mount it does nothing (one warning) and the job runs
as before.

The request is the one `dyadfs prefetch MNT --list FILE --stream NAME` sends: the list, as
paths relative to the mount root, in a file the caller owns, named in a getxattr of the mount
root (`user.dyadfs.prefetch:NAME:FILE`). A new list replaces the stream's previous one.
"""
import json
import os
import tempfile
import warnings

from .stats import mount_root

PREFETCH_XATTR = "user.dyadfs.prefetch:"


def prefetch(paths, mount=None, stream="default"):
    """Hands the mount `paths` (absolute under it, or relative to its root) in reading order.
    Returns the daemon's answer, e.g. {"files": 2500, "skipped": 0}; raises OSError."""
    paths = list(paths)
    if mount is None:
        mount = mount_root(paths[0]) if paths else None
        if mount is None:
            raise OSError("not under a dyadfs mount")
    mount = os.path.realpath(mount)
    fd, name = tempfile.mkstemp(prefix="dyadfs-prefetch-", suffix=".list")
    try:
        with os.fdopen(fd, "w") as f:
            for p in paths:
                p = os.fspath(p)
                f.write((os.path.relpath(p, mount) if os.path.isabs(p) else p) + "\n")
        answer = os.getxattr(mount, PREFETCH_XATTR + stream + ":" + name)
    finally:
        os.unlink(name)
    return json.loads(answer)


class PrefetchSampler:
    """Wraps a sampler (e.g. torch's DistributedSampler): each time an epoch starts iterating
    it, the files of its indices go to the mount in that order, then the indices are yielded
    unchanged."""

    def __init__(self, sampler, paths, mount=None, stream=None):
        self.sampler = sampler
        self.paths = paths
        self.mount = mount
        rank = getattr(sampler, "rank", None)
        self.stream = stream or ("default" if rank is None else f"rank{rank}")
        self._warned = False

    def __iter__(self):
        order = list(iter(self.sampler))
        try:
            prefetch((self.paths[i] for i in order), self.mount, self.stream)
        except OSError as e:
            if not self._warned:
                warnings.warn(f"dyadfs prefetch not available: {e}")
                self._warned = True
        return iter(order)

    def __len__(self):
        return len(self.sampler)

    def set_epoch(self, epoch):
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)
