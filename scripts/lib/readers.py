# A training loop's reads, shared by the benchmarks (run, not imported): 4 processes forked
# before the clock starts, each opening and reading its quarter of the names listed in FILE
# whole (no process started per file), as a DataLoader's workers do; prints the seconds from
# their start signal until the last is done.
# Usage: python3 scripts/lib/readers.py ROOT FILE
import os, sys, time

root, names = sys.argv[1], open(sys.argv[2]).read().split()
go_r, go_w = os.pipe()
kids = []
for q in range(4):
    pid = os.fork()
    if pid == 0:
        os.read(go_r, 1)
        for n in names[q::4]:
            with open(os.path.join(root, n), "rb", buffering=0) as f:
                while f.read(1 << 20):
                    pass
        os._exit(0)
    kids.append(pid)
t = time.perf_counter()
os.write(go_w, b"xxxx")
for k in kids:
    os.waitpid(k, 0)
print(time.perf_counter() - t)
