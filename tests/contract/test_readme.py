"""The README, run: its first command, then every code block in order, as a newcomer would type
them, in an empty HOME (shell commands first, then the Python blocks as one session); and every command it names inline is checked against the script's own
--help. `bash scripts/install.sh` and `python3 -m pytest -q`, the rest of the README's first two
lines, are what `.ci/run` itself runs.

A block preceded by `<!-- not run: why -->` (a GPU, Docker) is not run here; `text` blocks are
output, and `diff` blocks are checked to compile."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCK = re.compile(r"(?:<!-- not run: (?P<why>[^>]*) -->\s*\n)?```(?P<lang>\w+)\n(?P<code>.*?)```", re.S)


def blocks() -> list[tuple[str, str, str | None]]:
    return [(m["lang"], m["code"], m["why"]) for m in BLOCK.finditer(README.read_text())]


def _env(home: Path) -> dict:
    return {**os.environ, "HOME": str(home), "OMP_NUM_THREADS": "1", "FASTDATA_CACHE": str(home / ".cache" / "fastdata")}


def test_the_first_lines_are_the_two_commands():
    lang, code, _ = blocks()[0]
    lines = [line.split("#")[0].strip() for line in code.strip().splitlines()]
    assert lang == "bash" and lines == ["bash scripts/install.sh && fastdata-profile synthetic --step-ms 100 --tune",
                                        "python3 -m pytest -q"]
    assert README.read_text().startswith("# fastdata\n\n```bash\n")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_block_runs_in_order(tmp_path):
    """The first command (the profile and tune, in an empty HOME: it makes the synthetic set the
    other blocks use), then the bash blocks in order, then the Python blocks in order in one
    interpreter."""
    home = tmp_path / "home"
    home.mkdir()
    env = _env(home)
    first = blocks()[0][1].strip().splitlines()[0].split("#")[0]
    profile = first.split("&&", 1)[1].strip()
    done = subprocess.run(shlex.split(profile), env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "verdict:" in done.stdout and "tuned:" in done.stdout, done.stdout[-3000:]
    python: list[str] = []
    for lang, code, why in blocks()[1:]:
        if why is not None or lang in ("text", "markdown"):
            continue
        if lang == "diff":
            for line in code.splitlines():
                if line.startswith(("+", "-")) and not line.startswith(("+++", "---")):
                    compile(line[1:], "README diff", "exec")
        elif lang == "bash":  # commands a reader runs in a shell, in order; the Python blocks read their output
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", code], env=env, cwd=tmp_path, capture_output=True,
                                  text=True, timeout=300)
            assert done.returncode == 0, f"{code}\n{done.stderr[-3000:]}"
        elif lang == "python":
            python.append(code)
        else:
            pytest.fail(f"a {lang!r} block: mark it `<!-- not run: why -->` or teach this test to run it")
    # the Python blocks, one after the other in one interpreter, as a reader's session
    script = "\n".join(python)
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"{script}\n{done.stderr[-3000:]}"


def inline_commands() -> list[str]:
    """Commands the README names in `code`: benchmarks and fastdata's console scripts."""
    spans = re.findall(r"`([^`\n]+)`", BLOCK.sub("", README.read_text()))
    found = []
    for span in spans:
        words = span.replace("OMP_NUM_THREADS=1 ", "").split()
        if len(words) >= 2 and words[0] == "python" and words[1].startswith("benchmarks/"):
            found.append(" ".join(words))
        elif words and re.fullmatch(r"fastdata(-[a-z]+)?", words[0]) and len(words) > 1:
            found.append(" ".join(words))
    return found


@pytest.mark.parametrize("command", sorted(set(inline_commands())))
def test_every_inline_command_names_a_real_script_and_flags(command):
    words = command.split()
    root = README.parent
    if words[0] == "python":
        script = root / words[1]
        assert script.is_file(), f"{words[1]} does not exist"
        argv, rest = [sys.executable, str(script)], words[2:]
    else:
        argv, rest = [words[0]], words[1:]
        while rest and rest[0].islower() and rest[0].isidentifier():  # subcommands (`fastdata bench augment`), not metavars
            argv.append(rest.pop(0))
    done = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    for flag in (w.split("=")[0] for w in rest if w.startswith("--")):
        assert flag in done.stdout, f"`{command}`: {argv[-1]} --help has no {flag}"


def test_the_readme_is_short():
    assert len(README.read_text().splitlines()) <= 250
