#!/usr/bin/env python3
"""The chaos soak's driver (run by scripts/soak.sh, which builds and sets the environment).

SOAK_NODES daemons (6) in SOAK_RACKS racks (3) on 127.0.0.1 over one backing directory; a reader per node reads the
dataset in shifted shards in a loop and checks every byte; a driver freezes (SIGSTOP/SIGCONT),
kills and restarts daemons at random, usually one at a time, sometimes two at once, fills a
node's cache disk (each node's cache is on a tmpfs of its own) and flips bytes in a node's
cached data files (once, or twice with a read between: "recorrupt"). SOAK_START_WITH (e.g.
"fill,corrupt,recorrupt") runs those actions first; SOAK_MOUNT_ARGS adds mount options on every
node. At the end it reports reads, wrong bytes (must be 0), errors, the longest read stall on a
node that was up the whole read and the five slowest such reads (node, file, start time),
shared-FS bytes against the dataset size, failovers and the actions taken.
"""

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

BIN = os.environ["BIN"]
W = os.environ["W"]
SECONDS = int(os.environ.get("SOAK_SECONDS", "600"))
FILES = int(os.environ.get("SOAK_FILES", "300"))
SIZE = int(os.environ.get("SOAK_KIB", "256")) * 1024
LARGE = int(os.environ.get("SOAK_LARGE", "4"))
LARGE_SIZE = int(os.environ.get("SOAK_LARGE_MIB", "24")) << 20
PEER_TIMEOUT = float(os.environ.get("SOAK_PEER_TIMEOUT", "2"))
DETECT = float(os.environ.get("SOAK_DETECT", "2"))
NODES = int(os.environ.get("SOAK_NODES", "6"))
RACKS = int(os.environ.get("SOAK_RACKS", "3"))
SEED = int(os.environ.get("SOAK_SEED", "1"))
# Each node's cache holds this share of the dataset, so nodes keep evicting and pulling from
# each other (with the whole dataset cached everywhere, chaos would change nothing).
CACHE_SHARE = float(os.environ.get("SOAK_CACHE_SHARE", "0.4"))
START_WITH = [a for a in os.environ.get("SOAK_START_WITH", "").split(",") if a]
capacity = ["0"]

rng = random.Random(SEED)
lock = threading.Lock()
state = ["up"] * NODES  # up | stopped | dead
changes = [0] * NODES  # bumped at every action on a node: a read spanning one is not a stall
pids = [0] * NODES
counted = {"bytes_from_backing": 0, "bytes_from_peers": 0, "failovers": 0,
           "checksum_failures": 0, "evictions": 0, "cache_write_errors": 0}
# Held by a node's reader around each file it reads, and by the driver while it flips bytes in
# that node's cache: a flip reaches a reader at its next open (the daemon checks a changed
# cache file again there); an open already handed to the kernel (passthrough) reads the file
# as it is, which docs/SEMANTICS.md says and this soak does not count against dyadfs.
gates = [threading.Lock() for _ in range(NODES)]
results = []  # (node, seconds, bytes, outcome, spanned_a_change)
actions = []
deaths = []  # (node, when, cause): daemons found gone that the driver had not killed
stop = threading.Event()
dataset_files = {}  # name -> (size, sha256), for the driver's own reads


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def mnt(i):
    return f"{W}/n{i}/mnt"


def disk(i):
    return f"{W}/n{i}/disk"


def ssd(i):
    return f"{disk(i)}/cache"


def stats(i):
    out = subprocess.run([BIN, "stats", mnt(i), "--json"], capture_output=True, text=True)
    return json.loads(out.stdout) if out.returncode == 0 else None


def mount(i):
    os.makedirs(mnt(i), exist_ok=True)
    cmd = [BIN, "mount", mnt(i), "--ssd", ssd(i), "--backing", f"{W}/backing",
           "--node-id", str(i), "--peers", f"{W}/peers", "--secret-file", f"{W}/secret",
           "--peer-timeout", f"{PEER_TIMEOUT}s", "--failure-detection", f"{DETECT}s",
           "--capacity", capacity[0]] + os.environ.get("SOAK_MOUNT_ARGS", "").split()
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"node {i} failed to mount: {out.stderr.strip()}")
    pids[i] = stats(i)["pid"]


def bank(i):
    """Adds a daemon's counters to the totals before it dies (a restart starts from zero)."""
    s = stats(i)
    if s:
        for k in counted:
            counted[k] += s.get(k, 0)


def make_dataset():
    files = {}
    os.makedirs(f"{W}/backing", exist_ok=True)
    sizes = [(f"s{k:04}", SIZE + k) for k in range(FILES)]
    sizes += [(f"large{k}", LARGE_SIZE + k) for k in range(LARGE)]
    for name, size in sizes:
        data = os.urandom(size)
        with open(f"{W}/backing/{name}", "wb") as f:
            f.write(data)
        files[name] = (size, hashlib.sha256(data).hexdigest())
    return files


def reader(i, files):
    names = sorted(files)
    k = i * len(names) // NODES
    while not stop.is_set():
        with lock:
            up, before = state[i] == "up", changes[i]
        if not up:
            time.sleep(0.2)
            continue
        name = names[k % len(names)]
        k += 1
        began = time.strftime('%H:%M:%S')
        t = time.monotonic()
        try:
            with gates[i], open(f"{mnt(i)}/{name}", "rb") as f:
                data = f.read()
            outcome = "ok" if hashlib.sha256(data).hexdigest() == files[name][1] else "wrong"
        except OSError as e:
            outcome = f"error {e.errno}"
            if e.errno == 107:  # ENOTCONN: the daemon is gone; the driver restarts it
                time.sleep(0.2)
        took = time.monotonic() - t
        with lock:
            spanned = changes[i] != before or state[i] != "up"
            results.append((i, took, files[name][0], outcome, spanned, began, name))
        if outcome == "wrong" and not spanned:
            log(f"WRONG BYTES: node {i} {name}")


def death_cause(n):
    """What the end of node n's log says killed its daemon: an assertion (UCX's print
    `Assertion ... failed`), a Rust panic, or nothing known."""
    try:
        with open(os.path.join(ssd(n), "dyadfs.log"), "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - (256 << 10)))
            tail = f.read().decode(errors="replace")
    except OSError:
        return "unknown (no log)"
    for line in reversed(tail.splitlines()):
        if "dyadfs::daemon: mounted" in line:
            break  # (what came before belongs to an earlier run of the daemon)
        if "Assertion" in line and "failed" in line:
            return "assertion: " + line.split("]", 1)[-1].strip()[:160]
        if "panicked at" in line:
            return "panic: " + line.strip()[:160]
    return "unknown"


def alive(n):
    """Whether node n's daemon still runs; one found gone is recorded and restarted."""
    try:
        os.kill(pids[n], 0)
        return True
    except ProcessLookupError:
        cause = death_cause(n)
        log(f"DAEMON GONE: node {n} (pid {pids[n]}) exited by itself ({cause}); see {ssd(n)}/dyadfs.log")
        deaths.append((n, time.strftime("%H:%M:%S"), cause))
        subprocess.run(["fusermount3", "-uz", mnt(n)], capture_output=True)
        mount(n)
        with lock:
            changes[n] += 1
        return False


def act(kind, nodes):
    with lock:
        for n in nodes:
            changes[n] += 1
    actions.append((kind, tuple(nodes)))
    log(f"{kind} {nodes}")


def fill_disk(n):
    """Fills node n's cache disk for a few seconds: its fills, pulls and writes meet ENOSPC,
    and its reads must go on (served uncached)."""
    act("fill disk", [n])
    filler = f"{disk(n)}/filler"
    st = os.statvfs(disk(n))
    try:
        with open(filler, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, st.f_bavail * st.f_frsize)
    except OSError:
        pass  # full already, or nearly: as full as it gets
    time.sleep(rng.uniform(3, 8))
    os.unlink(filler)


def corrupt(n):
    """Flips a byte in a few of node n's cached data files, between two of its reads."""
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(f"{ssd(n)}/data") for f in fs)
    picked = rng.sample(files, min(3, len(files)))
    flipped = 0
    with gates[n]:
        for path in picked:
            try:  # (the daemon may have evicted it since the walk)
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                size = os.fstat(fd).st_size
                if size:
                    at = rng.randrange(size)
                    byte = os.pread(fd, 1, at)
                    os.pwrite(fd, bytes([byte[0] ^ 0x40]), at)
                    flipped += 1
            finally:
                os.close(fd)
    act(f"corrupt {flipped} files", [n])


def path_hash(name):
    """dyadfs's path hash (FNV-1a, 64 bits): the name of a file's cache data file."""
    h = 0xCBF29CE484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def data_file(n, name):
    h = path_hash(name)
    return f"{ssd(n)}/data/{h >> 56:02x}/{h:016x}.dat"


def flip(path):
    """Flips a byte of a cached data file at random; False if it is gone (evicted)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        size = os.fstat(fd).st_size
        if not size:
            return False
        at = rng.randrange(size)
        byte = os.pread(fd, 1, at)
        os.pwrite(fd, bytes([byte[0] ^ 0x40]), at)
        return True
    finally:
        os.close(fd)


def driver_read(n, name):
    """Reads a file through node n's mount as the driver, the kernel's pages of it dropped
    first, and records the outcome with the readers'."""
    began = time.strftime('%H:%M:%S')
    t = time.monotonic()
    try:
        with open(f"{mnt(n)}/{name}", "rb") as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            data = f.read()
        right = hashlib.sha256(data).hexdigest() == dataset_files[name][1]
        outcome = "ok" if right else "wrong"
    except OSError as e:
        outcome = f"error {e.errno}"
    with lock:
        results.append((n, time.monotonic() - t, dataset_files[name][0], outcome, False, began,
                        name))
    if outcome == "wrong":
        log(f"WRONG BYTES: node {n} {name} (driver)")


def recorrupt(n):
    """Flips a byte in a few of node n's cached files, reads them (each open finds its file
    changed: the bad chunk is read anew), then flips another byte in each and reads them again:
    a repaired file changed again is caught as the first change was (issue 44: one the repair
    read whole in one read was served changed)."""
    with gates[n]:
        cached = [name for name in sorted(dataset_files) if os.path.exists(data_file(n, name))]
        picked = rng.sample(cached, min(3, len(cached)))
        for _ in range(2):
            picked = [name for name in picked if flip(data_file(n, name))]
            for name in picked:
                driver_read(n, name)
    act(f"recorrupt {len(picked)} files", [n])


def driver():
    end = time.monotonic() + SECONDS
    kinds = {"fill": fill_disk, "corrupt": corrupt, "recorrupt": recorrupt}
    for kind in START_WITH:
        up = [n for n in range(NODES) if state[n] == "up"]
        kinds[kind](rng.choice(up))
    while time.monotonic() < end:
        time.sleep(rng.uniform(3, 8))
        for n in range(NODES):
            alive(n)
        up = [n for n in range(NODES) if state[n] == "up"]
        roll = rng.random()
        if roll < 0.15:
            fill_disk(rng.choice(up))
        elif roll < 0.30:
            (corrupt if roll < 0.25 else recorrupt)(rng.choice(up))
        elif roll < 0.55:
            n = rng.choice(up)
            act("freeze", [n])
            with lock:
                state[n] = "stopped"
            os.kill(pids[n], signal.SIGSTOP)
            time.sleep(rng.uniform(2, 6))
            os.kill(pids[n], signal.SIGCONT)
            with lock:
                state[n] = "up"
                changes[n] += 1
        elif roll < 0.85:
            n = rng.choice(up)
            bank(n)
            act("kill+restart", [n])
            with lock:
                state[n] = "dead"
            os.kill(pids[n], signal.SIGKILL)
            time.sleep(rng.uniform(2, 4))
            subprocess.run(["fusermount3", "-uz", mnt(n)], capture_output=True)
            mount(n)
            with lock:
                state[n] = "up"
                changes[n] += 1
        elif roll < 0.90:
            pair = rng.sample(up, 2)
            act("freeze two", pair)
            with lock:
                for n in pair:
                    state[n] = "stopped"
            for n in pair:
                os.kill(pids[n], signal.SIGSTOP)
            time.sleep(3)
            for n in pair:
                os.kill(pids[n], signal.SIGCONT)
            with lock:
                for n in pair:
                    state[n] = "up"
                    changes[n] += 1


def main():
    racks = [f"r{i * RACKS // NODES}" for i in range(NODES)]
    base = 21000 + rng.randrange(0, 300) * 10
    with open(f"{W}/peers", "w") as f:
        for i in range(NODES):
            f.write(f"{i} 127.0.0.1:{base + i} {racks[i]}\n")
    subprocess.run([BIN, "keygen", f"{W}/secret"], check=True, capture_output=True)
    files = make_dataset()
    dataset_files.update(files)
    dataset = sum(s for s, _ in files.values())
    capacity[0] = f"{max(int(dataset * CACHE_SHARE) >> 20, LARGE_SIZE >> 19)}M"
    # Each node's cache disk: a tmpfs a little larger than its capacity, so a filler fills it.
    disk_mib = int(capacity[0][:-1]) * 5 // 4 + 16
    for i in range(NODES):
        os.makedirs(disk(i), exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={disk_mib}M,mode=0700", "tmpfs",
                        disk(i)], check=True)
        os.makedirs(ssd(i), mode=0o700, exist_ok=True)
    log(f"dataset: {len(files)} files, {dataset / 2**20:.1f} MiB; {NODES} daemons in {RACKS} racks; "
        f"caches of {capacity[0]} each; peer timeout {PEER_TIMEOUT}s, failure detection {DETECT}s; "
        f"{SECONDS}s of chaos")
    for i in range(NODES):
        mount(i)
    readers = [threading.Thread(target=reader, args=(i, files), daemon=True)
               for i in range(NODES)]
    for r in readers:
        r.start()
    try:
        driver()
    finally:
        stop.set()
        for r in readers:
            r.join(timeout=30)
        for i in range(NODES):
            if pids[i]:
                try:
                    os.kill(pids[i], signal.SIGCONT)
                except ProcessLookupError:
                    pass
        for i in range(NODES):
            bank(i)
            subprocess.run(["fusermount3", "-u", mnt(i)], capture_output=True)
    live = [r for r in results if not r[4]]
    wrong = sum(1 for r in results if r[3] == "wrong")
    errors = sum(1 for r in live if r[3].startswith("error"))
    down_reads = len(results) - len(live)
    stall = max(live, key=lambda r: r[1]) if live else (0, 0.0, 0, "", False, "", "")
    bound = PEER_TIMEOUT + 1.0
    print()
    print(f"reads                    {len(results)} ({len(live)} on nodes up for the whole read, "
          f"{down_reads} overlapping an action on their own node)")
    print(f"wrong bytes              {wrong} reads (must be 0)")
    print(f"errors on live nodes     {errors}")
    by = {}
    for r in live:
        if r[3].startswith("error"):
            by[(r[0], r[3])] = by.get((r[0], r[3]), 0) + 1
    if by:
        print("  by node and errno      " + ", ".join(f"node {n} {e}: {c}" for (n, e), c in sorted(by.items())))
    print(f"longest live read        {stall[1]:.2f} s (node {stall[0]}, {stall[2]} bytes); "
          f"bound: peer timeout {PEER_TIMEOUT}s + shared-FS time (< 1 s here) = {bound:.1f} s: "
          f"{'within' if stall[1] <= bound else 'OVER'}")
    slow = sorted(live, key=lambda r: r[1], reverse=True)[:5]
    print(f"slowest live reads       {', '.join(f'{r[1]:.2f}' for r in slow)} s")
    # When and where, to set beside the actions logged above.
    for r in slow:
        print(f"  {r[1]:5.2f} s  node {r[0]}  {r[6]}  began {r[5]}")
    print(f"shared-FS bytes          {counted['bytes_from_backing'] / 2**20:.1f} MiB = "
          f"{counted['bytes_from_backing'] / dataset:.2f}x the dataset "
          f"({dataset / 2**20:.1f} MiB)")
    print(f"bytes from peers         {counted['bytes_from_peers'] / 2**20:.1f} MiB")
    print(f"failovers                {counted['failovers']} (re-homings after a death)")
    print(f"evictions                {counted['evictions']} (caches hold {CACHE_SHARE:.0%} of the dataset)")
    print(f"checksum failures        {counted['checksum_failures']} (flipped bytes caught)")
    print(f"cache write errors       {counted['cache_write_errors']} (reads served uncached "
          f"while a cache disk was full)")
    print(f"daemons that died alone  {len(deaths)} {deaths}")
    kinds = {}
    for k, _ in actions:
        kinds[k] = kinds.get(k, 0) + 1
    print(f"actions                  {len(actions)}: " +
          ", ".join(f"{v} {k}" for k, v in sorted(kinds.items())))
    sys.exit(1 if wrong or deaths else 0)


if __name__ == "__main__":
    main()
