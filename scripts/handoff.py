"""One side of scripts/bench_handoff.sh's producer -> consumer hand-off (not an example: a
benchmark's probe). Python's own open/write/close, as a simulation or a DataLoader would.

  produce DIR P N SIZE LOG [--rename|--shutil|--cp]   writes DIR/f-P-IIIII (N files of SIZE
      bytes), logging for each [time just before its close, time its close returned]; with
      PACE_MS set, waits that long after each file (a stream the consumers keep up with);
      --rename writes DIR/.f-P-IIIII.tmp and renames it (how a plain shared directory hands
      over a whole file); --shutil copies a file of the bytes from a temp dir with shutil.copy,
      --cp with the cp command (a producer's tools, which look at the destination first: the
      whole copy counts as the close)
  consume DIR P N SIZE LOG [--poll]     opens DIR/f-P-IIIII in order, read whole and checked,
      logging for each [time open was called, time it returned, time the read ended]; --poll
      retries a missing name every millisecond (a plain directory has no --wait)
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


def body(p, i, size):
    head = f"{p}:{i}:".encode()
    return (head * (size // len(head) + 1))[:size]


def main():
    mode, d, p, n, size, log = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
    flag = sys.argv[7] if len(sys.argv) > 7 else ""
    out = []
    scratch = tempfile.mkdtemp(prefix="dyadfs-handoff-") if flag in ("--shutil", "--cp") else None
    pace = float(os.environ.get("PACE_MS", "0")) / 1000
    for i in range(n):
        name = os.path.join(d, f"f-{p}-{i:05}")
        if mode == "produce" and pace and i:
            time.sleep(pace)
        if mode == "produce":
            data = body(p, i, size)
            if scratch:
                src = os.path.join(scratch, f"f-{p}-{i:05}")
                with open(src, "wb") as f:
                    f.write(data)
                t = time.time()
                if flag == "--shutil":
                    shutil.copy(src, name)
                else:
                    subprocess.run(["cp", src, name], check=True)
                out.append([t, time.time()])
                os.unlink(src)
                continue
            path = os.path.join(d, f".f-{p}-{i:05}.tmp") if flag == "--rename" else name
            f = open(path, "wb")
            f.write(data)
            t = time.time()
            f.close()
            if flag == "--rename":
                os.rename(path, name)
            out.append([t, time.time()])
        else:
            called = time.time()
            while True:
                try:
                    f = open(name, "rb")
                    break
                except FileNotFoundError:
                    if flag != "--poll":
                        raise
                    time.sleep(0.001)
            opened = time.time()
            with f:
                if f.read() != body(p, i, size):
                    sys.exit(f"wrong bytes in {name}")
            out.append([called, opened, time.time()])
    if scratch:
        shutil.rmtree(scratch)
    with open(log, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
