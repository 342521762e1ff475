"""What `fastdata run` adds to a command's start-up: a script that imports torch and makes one
DataLoader (so the hook is installed and the loader served), run plain and under `fastdata run
--`, each in a fresh process, in ABBA rounds. Prints the median wall time of each, the seconds
`fastdata run` adds and the ratio; writes JSON. The regime: the page cache warm (a first run
warms it), no GPU, the summary line on stderr included.

    OMP_NUM_THREADS=1 python benchmarks/run_startup.py [--rounds 10] [--json PATH]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common

SCRIPT = ("import torch\n"
          "loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(8)), batch_size=4)\n"
          "assert [b[0].tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]\n")


def _seconds(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "train.py"
        script.write_text(SCRIPT)
        commands = {"plain": [sys.executable, str(script)],
                    "fastdata run": [sys.executable, "-m", "fastdata", "run", "--", sys.executable, str(script)]}
        for command in commands.values():  # warm-up: the page cache, bytecode
            _seconds(command)
        times: dict[str, list[float]] = {name: [] for name in commands}
        names = list(commands)
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else reversed(names):
                times[name].append(_seconds(commands[name]))
    plain, run = _common.median(times["plain"]), _common.median(times["fastdata run"])
    low, high = _common.ratio_ci(times["fastdata run"], times["plain"])
    print(f"plain {plain:.2f} s, under fastdata run {run:.2f} s: +{run - plain:.2f} s "
          f"({run / plain:.2f}x the time; 95% interval {low:.2f}-{high:.2f})")
    _common.write("run_startup", {"rounds": args.rounds, "seconds": times,
                                  "median_s": {"plain": plain, "fastdata run": run}, "added_s": run - plain,
                                  "ratio": run / plain, "ratio_ci95": [low, high]}, args.json)


if __name__ == "__main__":
    main()
