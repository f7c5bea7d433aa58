"""dyadfs from Python: the `dyadfs` command this package installed ([`binary`]), a mount's
counters (`dyadfs.stats`) and the sampler's order handed to a mount (`dyadfs.torch`)."""
import os
import shutil
import sys
import sysconfig

try:
    from importlib.metadata import version as _version

    __version__ = _version("dyadfs")
except Exception:  # a clone's python/ on sys.path, not an installed wheel
    __version__ = "unknown"


def binary():
    """The path of the `dyadfs` binary installed with this package (the environment's scripts
    directory), else the one on PATH, else None."""
    here = os.path.join(sysconfig.get_path("scripts"), "dyadfs")
    if os.access(here, os.X_OK):
        return here
    beside = os.path.join(os.path.dirname(sys.executable), "dyadfs")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("dyadfs")
