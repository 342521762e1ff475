"""How long each command's help page takes: each page as it is now (its command's parser alone,
without torch) against the same page in a process that imports torch before it, as each did
while `import fastdata` imported torch for it. Each page a fresh
process, the two sides interleaved in ABBA rounds; the page cache warm (a first run warms it).
Prints the median wall time of each side and the ratio per page; writes JSON.

    python benchmarks/help_pages.py [--rounds 7] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import _common

# (`fastdata --help`, which lists the commands, imported no torch before either)
PAGES = [["fastdata", "profile", "--help"], ["fastdata-profile", "--help"],
         ["fastdata", "bench", "augment", "--help"], ["fastdata", "shard", "--help"], ["fastdata", "demo", "--help"]]


def _seconds(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0 or "usage:" not in done.stdout:
        raise SystemExit(f"{' '.join(command)} failed: {done.stderr.strip()[-2000:]}")
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    scripts = os.path.dirname(sys.executable)  # the console scripts beside this Python
    if shutil.which("fastdata", path=scripts) is None:
        sys.exit(f"fastdata's console scripts are not installed beside {sys.executable}")
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "sitecustomize.py"), "w") as f:
            f.write("import torch\n")
        sides = {"now": dict(os.environ),
                 "torch first": dict(os.environ, PYTHONPATH=os.pathsep.join(
                     filter(None, [tmp, os.environ.get("PYTHONPATH")])))}
        commands = [[os.path.join(scripts, page[0]), *page[1:]] for page in PAGES]
        for command in commands:  # warm-up: the page cache
            for env in sides.values():
                _seconds(command, env)
        times: dict[str, dict[str, list[float]]] = {" ".join(p): {s: [] for s in sides} for p in PAGES}
        for r in range(args.rounds):
            for page, command in zip(PAGES, commands):
                for side in list(sides) if r % 2 == 0 else reversed(list(sides)):
                    times[" ".join(page)][side].append(_seconds(command, sides[side]))
    rows = {}
    print(f"{'page':<32}{'torch first s':>14}{'now s':>8}{'speed-up':>10}  95% interval")
    for page, got in times.items():
        base, now = got["torch first"], got["now"]
        ratio, (low, high) = _common.median(base) / _common.median(now), _common.ratio_ci(base, now)
        rows[page] = {"torch_first_s": _common.median(base), "now_s": _common.median(now), "ratio": ratio,
                      "interval": [low, high]}
        print(f"{page:<32}{_common.median(base):>14.2f}{_common.median(now):>8.2f}{ratio:>9.1f}x  "
              f"{low:.1f}-{high:.1f}")
    _common.write("help_pages", {"rounds": args.rounds, "rows": rows}, args.json)


if __name__ == "__main__":
    main()
