#!/usr/bin/env python3
"""Single-node dyadfs demo: epochs of shuffled sample reads through the mount."""
import argparse, json, multiprocessing as mp, os, random, shutil, subprocess, sys, tempfile, time

def read_file(path):
    with open(path, "rb") as f:
        return len(f.read())

def stats(dyadfs, mnt):
    out = subprocess.run([dyadfs, "stats", mnt, "--json"], check=True, capture_output=True)
    return json.loads(out.stdout)

def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dyadfs", required=True)
    ap.add_argument("--files", type=int, default=1024)
    ap.add_argument("--size-kib", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--dir", default=None, help="work directory (default: a new temp dir)")
    a = ap.parse_args()
    work = a.dir or tempfile.mkdtemp(prefix="dyadfs-demo-")
    backing, ssd, mnt = (os.path.join(work, d) for d in ("shared-fs", "nvme-cache", "dyad"))
    for d in (backing, ssd, mnt):
        os.makedirs(d, exist_ok=True)
    print(f"generating {a.files} samples of {a.size_kib} KiB in {backing}", flush=True)
    for i in range(a.files):
        sub = os.path.join(backing, "train", f"class{i % 10}")
        os.makedirs(sub, exist_ok=True)
        with open(os.path.join(sub, f"sample{i:06}.npz"), "wb") as f:
            f.write(os.urandom(a.size_kib * 1024))
    names = sorted(os.path.relpath(os.path.join(r, n), backing)
                   for r, _, ns in os.walk(backing) for n in ns)
    mounted = False
    try:
        def mount():
            subprocess.run([a.dyadfs, "mount", mnt, "--ssd", ssd, "--backing", backing], check=True)
        mount(); mounted = True
        print(f"mounted {mnt} (cache {ssd})\n")
        print(f"{'epoch':>5} {'seconds':>8} {'samples/s':>10} {'MiB local':>10} {'MiB backing':>12}  note")
        rng = random.Random(0)
        with mp.Pool(a.workers) as pool:
            for epoch in range(1, a.epochs + 2):
                note = ""
                if epoch == a.epochs + 1:
                    subprocess.run(["fusermount3", "-u", mnt], check=True); mounted = False
                    time.sleep(0.2)
                    mount(); mounted = True
                    note = "after unmount + mount (warm restart)"
                before = stats(a.dyadfs, mnt)
                order = names[:]; rng.shuffle(order)
                t = time.time()
                total = sum(pool.map(read_file, [os.path.join(mnt, n) for n in order], chunksize=16))
                dt = time.time() - t
                after = stats(a.dyadfs, mnt)
                assert total == a.files * a.size_kib * 1024
                d = lambda k: (after[k] - before[k]) / 2**20
                print(f"{epoch:>5} {dt:>8.2f} {a.files / dt:>10.0f} {d('bytes_from_local'):>10.1f} "
                      f"{d('bytes_from_backing'):>12.1f}  {note}", flush=True)
        print("\n" + subprocess.run([a.dyadfs, "stats", mnt], capture_output=True, text=True).stdout)
        print("('MiB local' counts bytes the daemon served from its cache; with passthrough the kernel\n"
              " reads cached files directly, counted as local_hits/passthrough_opens instead.)")
    finally:
        if mounted:
            subprocess.run(["fusermount3", "-u", mnt])
            time.sleep(0.2)
        if a.dir is None:
            shutil.rmtree(work, ignore_errors=True)

if __name__ == "__main__":
    sys.exit(main())
