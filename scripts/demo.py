#!/usr/bin/env python3
"""dyadfs demo: 4 daemons (2 racks) on 127.0.0.1 over one generated dataset. Each epoch every
node reads a different shard (like DistributedSampler.set_epoch), so from epoch 2 on the bytes
come from the other nodes' NVMe caches over UCX instead of the shared file system."""
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
    a = ap.parse_args()
    work = a.dir or tempfile.mkdtemp(prefix="dyadfs-demo-")
    backing = os.path.join(work, "shared-fs")
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
        with ThreadPoolExecutor(a.nodes) as pool:
            for epoch in range(a.epochs):
                before = [stats(a.dyadfs, m) for m in mnts]
                runs = list(pool.map(lambda i: read_shard(mnts[i], shard((i + epoch) % a.nodes)),
                                     range(a.nodes)))
                after = [stats(a.dyadfs, m) for m in mnts]
                for i, (dt, n) in enumerate(runs):
                    d = lambda k: after[i][k] - before[i][k]
                    print(f"{epoch + 1:>5} {i:>4} {dt:>8.2f} {len(shard(i)) / dt:>8.0f} "
                          f"{d('bytes_from_peers') / 2**20:>10.1f} {d('bytes_from_backing') / 2**20:>12.1f} "
                          f"{d('local_hits'):>10}", flush=True)
        total = {k: sum(stats(a.dyadfs, m)[k] for m in mnts)
                 for k in ("bytes_from_backing", "bytes_from_peers", "lookups_rack", "lookups_global")}
        print(f"\ndataset {a.files * a.size_kib / 1024:.0f} MiB; read from the shared FS "
              f"{total['bytes_from_backing'] / 2**20:.0f} MiB in all, from peers "
              f"{total['bytes_from_peers'] / 2**20:.0f} MiB; lookups at rack homes "
              f"{total['lookups_rack']}, at global homes {total['lookups_global']}")
    finally:
        for m in mnts:
            subprocess.run(["fusermount3", "-u", m])
        time.sleep(0.3)
        if a.dir is None:
            shutil.rmtree(work, ignore_errors=True)

if __name__ == "__main__":
    sys.exit(main())
