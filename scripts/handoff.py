"""One side of scripts/bench_handoff.sh's producer -> consumer hand-off (not an example: a
benchmark's probe). Python's own open/write/close, as a simulation or a DataLoader would.

  produce DIR P N SIZE LOG [--rename]   writes DIR/f-P-IIIII (N files of SIZE bytes), logging the
      time just before each close; --rename writes DIR/.f-P-IIIII.tmp and renames it (how a
      plain shared directory hands over a whole file)
  consume DIR P N SIZE LOG [--poll]     opens DIR/f-P-IIIII in order, read whole and checked,
      logging the time each open returned; --poll retries a missing name every millisecond
      (a plain directory has no --wait)
"""
import json
import os
import sys
import time


def body(p, i, size):
    head = f"{p}:{i}:".encode()
    return (head * (size // len(head) + 1))[:size]


def main():
    mode, d, p, n, size, log = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
    flag = sys.argv[7] if len(sys.argv) > 7 else ""
    out = []
    for i in range(n):
        name = os.path.join(d, f"f-{p}-{i:05}")
        if mode == "produce":
            data = body(p, i, size)
            path = os.path.join(d, f".f-{p}-{i:05}.tmp") if flag == "--rename" else name
            with open(path, "wb") as f:
                f.write(data)
                t = time.time()
            if flag == "--rename":
                os.rename(path, name)
            out.append(t)
        else:
            while True:
                try:
                    f = open(name, "rb")
                    break
                except FileNotFoundError:
                    if flag != "--poll":
                        raise
                    time.sleep(0.001)
            t = time.time()
            with f:
                if f.read() != body(p, i, size):
                    sys.exit(f"wrong bytes in {name}")
            out.append(t)
    with open(log, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
