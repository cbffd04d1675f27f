#!/usr/bin/env python3
"""Registers and spills of every kernel entry, from `ptxas -v`, and the difference between two
reports: the check every kernel edit needs (at 255 registers ptxas moves by register numbering
alone, so an edit to shared code can make an entry it did not mean to touch spill).

    python3 benches/ptxas_regs.py report PTX ARCH OUT.txt   # e.g. flashattn_sm90a.ptx sm_90a
    python3 benches/ptxas_regs.py diff BEFORE.txt AFTER.txt  # entries whose numbers moved

PTX: target/release/build/flashattn-*/out/flashattn_sm80.ptx (ARCH sm_80, and sm_90 as an H100
or H200 runs it) or flashattn_sm90a.ptx (sm_90a), the newest by mtime. ptxas: PATH, else the
copy host/build.rs installs (~/.cache/flashattn-cuda/nvidia/cu13/bin). A report line is
`entry registers spill_store_bytes spill_load_bytes stack_frame_bytes`; `report` exits 1 if any
entry spills or has a stack frame, or a function one calls does (as CI's `ptx` test).
"""

import os
import re
import shutil
import subprocess
import sys


def ptxas():
    found = shutil.which("ptxas")
    if found:
        return found
    cached = os.path.expanduser("~/.cache/flashattn-cuda/nvidia/cu13/bin/ptxas")
    if os.path.exists(cached):
        return cached
    sys.exit("ptxas not found: pip install nvidia-cuda-nvcc, or build the host crate once")


def report(ptx, arch, out):
    run = subprocess.run([ptxas(), f"-arch={arch}", "-v", ptx, "-o", os.devnull], capture_output=True, text=True)
    # A spill line belongs to the "Function properties for NAME" line before it: ptxas also
    # lists the called functions' (`.func`) properties, after an entry's own, and those must
    # not overwrite the entry's numbers.
    entries, called, cur, props = {}, {}, None, None
    for line in (run.stdout + run.stderr).splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            cur = m.group(1)
            entries[cur] = [0, 0, 0, 0]
            continue
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            props = m.group(1)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur and props == cur:
            entries[cur][1:] = [int(m.group(2)), int(m.group(3)), int(m.group(1))]
        elif m and props and any(map(int, m.groups())):
            # A called function's own stack or spill fails CI's test as an entry's does.
            called[props] = [int(m.group(2)), int(m.group(3)), int(m.group(1))]
        m = re.search(r"Used (\d+) registers", line)
        if m and cur:
            entries[cur][0] = int(m.group(1))
    if run.returncode != 0:
        sys.exit(f"ptxas failed ({run.returncode}): {run.stderr[-2000:]}")
    with open(out, "w") as fh:
        for name in sorted(entries):
            fh.write("{} {} {} {} {}\n".format(name, *entries[name]))
    spilling = [n for n, v in entries.items() if v[1] or v[2] or v[3]]
    spilling += [f"{n} (called; spill {v[0]}/{v[1]}, stack {v[2]})" for n, v in called.items()]
    print(f"{len(entries)} entries, {len(spilling)} spilling or with a stack frame" + "".join(f"\n  {n}" for n in spilling))
    return 1 if spilling else 0


def read(path):
    with open(path) as fh:
        return {p[0]: tuple(map(int, p[1:4])) for p in (line.split() for line in fh) if len(p) in (4, 5)}


def diff(before, after):
    a, b = read(before), read(after)
    for name in sorted(set(a) | set(b)):
        if a.get(name) != b.get(name):
            fmt = lambda v: "-" if v is None else "{} regs, spill {}/{}".format(*v)
            print(f"{name}: {fmt(a.get(name))} -> {fmt(b.get(name))}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "report":
        sys.exit(report(*sys.argv[2:5]))
    if len(sys.argv) == 4 and sys.argv[1] == "diff":
        sys.exit(diff(*sys.argv[2:4]))
    sys.exit(__doc__)
