"""The sampler's order handed to a dyadfs mount, from a clone: the names of `dyadfs.torch`
(python/dyadfs/torch.py; `pip install dyadfs` installs it as a package).

    import sys; sys.path.insert(0, "/path/to/dyadfs/examples/python")
    from dyadfs_prefetch import PrefetchSampler
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

from dyadfs.stats import STATS_XATTR, mount_root  # noqa: E402,F401
from dyadfs.torch import PREFETCH_XATTR, PrefetchSampler, prefetch  # noqa: E402,F401
