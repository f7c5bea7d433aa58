#!/usr/bin/env python3
"""dyadfs demo: 4 daemons (2 racks) on 127.0.0.1 over one generated dataset on a slow shared
file system. Each epoch every node reads a different shard (like DistributedSampler.set_epoch),
so epoch 1 reads the shared file system, epochs 2.. pull from the other nodes' caches, and a
last epoch re-reads each node's own last shard: local hits. The page cache is dropped before
every epoch (with --drop-caches), so each tier is read from where it lives."""
import argparse, json, os, shutil, subprocess, sys, tempfile, time
from concurrent.futures import ThreadPoolExecutor

def stats(dyadfs, mnt):
    out = subprocess.run([dyadfs, "stats", mnt, "--json"], check=True, capture_output=True)
    return json.loads(out.stdout)

def read_shard(mnt, names):
    t = time.time()
    n = 0
    for name in names:
        with open(os.path.join(mnt, name), "rb") as f:
            n += len(f.read())
    return time.time() - t, n

def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dyadfs", required=True)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--files", type=int, default=1024)
    ap.add_argument("--size-kib", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--port", type=int, default=7700)
    ap.add_argument("--dir", default=None, help="work directory (default: a new temp dir)")
    ap.add_argument("--backing", default=None,
                    help="the shared file system's directory (default: DIR/shared-fs)")
    ap.add_argument("--drop-caches", action="store_true",
                    help="drop the page cache before every epoch (needs root)")
    a = ap.parse_args()
    work = a.dir or tempfile.mkdtemp(prefix="dyadfs-demo-")
    backing = a.backing or os.path.join(work, "shared-fs")
    os.makedirs(backing, exist_ok=True)
    print(f"generating {a.files} samples of {a.size_kib} KiB in {backing}", flush=True)
    names = []
    for i in range(a.files):
        rel = os.path.join("train", f"class{i % 10}", f"sample{i:06}.npz")
        os.makedirs(os.path.join(backing, os.path.dirname(rel)), exist_ok=True)
        with open(os.path.join(backing, rel), "wb") as f:
            f.write(os.urandom(a.size_kib * 1024))
        names.append(rel)
    peers = os.path.join(work, "peers")
    with open(peers, "w") as f:
        for i in range(a.nodes):
            f.write(f"{i} 127.0.0.1:{a.port + i} rack{i * 2 // a.nodes}\n")
    # The job secret every node proves on every connection (dyadfs keygen writes it 0600).
    secret = os.path.join(work, "secret")
    if not os.path.exists(secret):
        subprocess.run([a.dyadfs, "keygen", secret], check=True, stdout=subprocess.DEVNULL)
    env = dict(os.environ, UCX_TLS="tcp", UCX_NET_DEVICES="lo", DYADFS_SECRET_FILE=secret)
    mnts = []
    try:
        for i in range(a.nodes):
            mnt, ssd = os.path.join(work, f"node{i}", "dyad"), os.path.join(work, f"node{i}", "nvme")
            os.makedirs(mnt, exist_ok=True)
            subprocess.run([a.dyadfs, "mount", mnt, "--ssd", ssd, "--backing", backing,
                            "--node-id", str(i), "--peers", peers], check=True, env=env)
            mnts.append(mnt)
        print(f"mounted {a.nodes} nodes (peers file {peers}: " +
              ", ".join(open(peers).read().split("\n")[:-1]) + ")\n")
        print(f"{'epoch':>5} {'node':>4} {'seconds':>8} {'files/s':>8} {'MiB peers':>10} "
              f"{'MiB backing':>12} {'local hits':>10}")
        shard = lambda k: names[k::a.nodes]
        tiers = {"shared FS": [0, 0.0], "peers": [0, 0.0], "local": [0, 0.0]}
        # Epochs 1..E rotate the shards; a last one re-reads each node's own last shard.
        plan = [(e + 1, lambda i, e=e: (i + e) % a.nodes) for e in range(a.epochs)]
        plan.append(("last", lambda i: (i + a.epochs - 1) % a.nodes))
        with ThreadPoolExecutor(a.nodes) as pool:
            for label, which in plan:
                if a.drop_caches:
                    subprocess.run(["sync"], check=True)
                    with open("/proc/sys/vm/drop_caches", "w") as f:
                        f.write("3\n")
                before = [stats(a.dyadfs, m) for m in mnts]
                t0 = time.time()
                runs = list(pool.map(lambda i: read_shard(mnts[i], shard(which(i))),
                                     range(a.nodes)))
                wall = time.time() - t0
                after = [stats(a.dyadfs, m) for m in mnts]
                moved = {"shared FS": 0, "peers": 0, "local": 0}
                for i, (dt, n) in enumerate(runs):
                    d = lambda k: after[i][k] - before[i][k]
                    moved["shared FS"] += d("bytes_from_backing")
                    moved["peers"] += d("bytes_from_peers")
                    moved["local"] += n - d("bytes_from_backing") - d("bytes_from_peers")
                    print(f"{label:>5} {i:>4} {dt:>8.2f} {len(shard(which(i))) / dt:>8.0f} "
                          f"{d('bytes_from_peers') / 2**20:>10.1f} {d('bytes_from_backing') / 2**20:>12.1f} "
                          f"{d('local_hits'):>10}", flush=True)
                # The epoch's time goes to the tier that served most of its bytes.
                top = max(moved, key=moved.get)
                tiers[top][0] += sum(moved.values())
                tiers[top][1] += wall
        total = {k: sum(stats(a.dyadfs, m)[k] for m in mnts)
                 for k in ("bytes_from_backing", "bytes_from_peers", "lookups_rack", "lookups_global")}
        print(f"\ndataset {a.files * a.size_kib / 1024:.0f} MiB; read from the shared FS "
              f"{total['bytes_from_backing'] / 2**20:.0f} MiB in all, from peers "
              f"{total['bytes_from_peers'] / 2**20:.0f} MiB; lookups at rack homes "
              f"{total['lookups_rack']}, at global homes {total['lookups_global']}")
        for tier, (n, secs) in tiers.items():
            if secs > 0:
                print(f"epochs served by {tier:<9}: {n / 2**20:7.0f} MiB in {secs:6.2f} s, "
                      f"{n / 2**20 / secs:7.0f} MiB/s for the 4 nodes together")
    finally:
        for m in mnts:
            subprocess.run(["fusermount3", "-u", m])
        time.sleep(0.3)
        if a.dir is None:
            shutil.rmtree(work, ignore_errors=True)

if __name__ == "__main__":
    sys.exit(main())
