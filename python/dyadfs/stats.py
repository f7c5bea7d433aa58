"""A dyadfs mount's counters from Python, as `dyadfs stats --json MNT` prints them (the same
keys), read from the mount root's `user.dyadfs.stats` attribute: no subprocess, no binary.

    from dyadfs.stats import stats
    s = stats("/dyad")
    print(s["local_hits"], s["bytes_from_peers"])
"""
import json
import os

STATS_XATTR = "user.dyadfs.stats"


def mount_root(path):
    """The root of the dyadfs mount that holds `path` (the one directory that answers the
    stats attribute), or None."""
    p = os.path.realpath(path)
    while True:
        try:
            os.getxattr(p, STATS_XATTR)
            return p
        except OSError:
            pass
        parent = os.path.dirname(p)
        if parent == p:
            return None
        p = parent


def stats(path):
    """The counters of the dyadfs mount holding `path`, as a dict; raises OSError outside one."""
    root = mount_root(path)
    if root is None:
        raise OSError(f"{path} is not under a dyadfs mount")
    return json.loads(os.getxattr(root, STATS_XATTR))
