"""The `fastdata` command and its aliases: help with an example, --version, the exit codes (0,
1 with one line, 2 with one line, 130), and the command-line faults of issue 20."""

from __future__ import annotations

import importlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fastdata
from fastdata import bench, cli, demo, shard
from fastdata._cli import CommandError, Progress
from fastdata._pillow import PILLOW
from fastdata.profiling import cli as profile_cli
from fastdata.synthetic import make_imagenet_like

from _images import color_folder

# argv of each command's page under `fastdata`, and the alias that runs the same command
LEAVES = {("profile",): profile_cli.main, ("bench", "augment"): bench.main, ("shard",): shard.main,
          ("demo",): demo.main}
ALIAS_ARGV = {("profile",): [], ("bench", "augment"): ["augment"], ("shard",): [], ("demo",): []}


def _help(main, argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def _split(page: str) -> tuple[str, str]:
    """(the text before the options, the options section) of a help page."""
    before, _, options = page.partition("\noptions:\n")
    return before, options.partition("\nexample:")[0]


def _entries(options: str) -> dict[str, str]:
    """{--flag: its help text} of an options section."""
    entries, flag = {}, None
    for line in options.splitlines():
        m = re.match(r"  (?:-\w, )?(--[\w-]+)", line)
        if m:
            flag = m.group(1)
            entries[flag] = line
        elif flag and line.startswith("   "):
            entries[flag] += " " + line.strip()
    return entries


def _one_line_error(err: str, prog: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return color_folder(tmp_path_factory.mktemp("images"), classes=2, per_class=6, sides=(20, 40),
                        name=lambda i: f"{i:03d}.jpg")


# ----------------------------------------------------------------- help, examples, --version

@pytest.mark.parametrize("argv", [[], ["profile"], ["bench"], ["bench", "augment"], ["shard"], ["demo"]])
def test_every_help_ends_with_an_example_that_parses(argv, capsys):
    page = _help(cli.main, argv, capsys)
    example = page.rpartition("\nexample:\n")[2]
    assert example.strip(), page
    commands = [line.strip() for line in example.splitlines() if line.strip().startswith("fastdata ")]
    assert commands and all(c.split()[1] == (argv or ["profile"])[0] for c in commands), example
    for command in commands:  # a command line `fastdata` accepts, with real flags
        args = cli.parser(shlex.split(command)[1]).parse_args(shlex.split(command)[1:])
        assert callable(args.run)


def test_top_help_lists_the_commands_and_the_exit_codes(capsys):
    page = _help(cli.main, [], capsys)
    for name in cli.COMMANDS:
        assert re.search(rf"^    {name} +\S", page, re.MULTILINE), name
        assert cli.COMMANDS[name][1].split()[0] in page
    codes = page.partition("exit codes:")[2]
    for code, says in (("0", "success"), ("1", "error"), ("2", "bad command line"), ("130", "interrupted")):
        assert re.search(rf"^  {code} +.*{says}", codes, re.MULTILINE), code
    assert "--debug" in codes


def _without_torch(tmp_path: Path) -> dict[str, str]:
    """The environment of a process in which `import torch` raises ImportError."""
    (tmp_path / "sitecustomize.py").write_text("import sys; sys.modules['torch'] = None\n")
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))


def _console_script(name: str) -> Path:
    script = Path(sys.executable).parent / name
    if not script.exists():
        pytest.skip(f"{name}'s console script is not installed beside {sys.executable}")
    return script


@pytest.mark.parametrize("argv", [["--help"], ["-h"], []])
def test_the_top_help_page_imports_no_torch(tmp_path, argv):
    """`fastdata --help` (and `fastdata` alone) answers without importing torch, which takes
    seconds: with torch unimportable, the page (or the missing command's one line) comes all the
    same; `fastdata --version`, which prints torch's version, still refuses in one line."""
    script, env = _console_script("fastdata"), _without_torch(tmp_path)
    done = subprocess.run([str(script), *argv], capture_output=True, text=True, timeout=60, env=env)
    if argv:
        assert done.returncode == 0 and "    run       run a training command" in done.stdout, done.stderr
        assert done.stdout.rstrip().endswith(cli.EXAMPLE)
    else:
        assert done.returncode == 2 and done.stderr.startswith("fastdata: error: the following arguments are "
                                                               "required: COMMAND"), done.stderr
    done = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 1 and "fastdata needs PyTorch, but it is not installed" in done.stderr


@pytest.mark.parametrize("leaf", list(LEAVES))
@pytest.mark.parametrize("form", ["fastdata", "alias", "-m fastdata"])
def test_each_command_help_page_imports_no_torch(tmp_path, leaf, form):
    """A command's help page is its parser alone: with torch unimportable, `fastdata profile
    --help` (its alias `fastdata-profile --help`, `python -m fastdata profile -h`, and the other
    commands alike) prints its page and example, exit 0, without the seconds torch's import
    takes. The same command given --version (which prints torch's version), or a --help past
    `--`, is no help page: it still needs torch, and refuses in one line."""
    if form == "alias":
        argv = [str(_console_script(f"fastdata-{leaf[0]}")), *ALIAS_ARGV[leaf]]
    elif form == "fastdata":
        argv = [str(_console_script("fastdata")), *leaf]
    else:
        argv = [sys.executable, "-m", "fastdata", *leaf]
    env = _without_torch(tmp_path)
    example = importlib.import_module(cli.COMMANDS[leaf[0]][0]).EXAMPLE
    for flag in ("--help", "-h"):
        done = subprocess.run([*argv, flag], capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 0 and done.stderr == "", done.stderr
        assert "\noptions:\n" in done.stdout and "--debug" in done.stdout, done.stdout
        assert done.stdout.rstrip().endswith(example.splitlines()[-1]), done.stdout
    for tail in (["--version"], ["--help", "--version"], ["--", "--help"]):
        done = subprocess.run([*argv, *tail], capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 1 and "fastdata needs PyTorch, but it is not installed" in done.stderr, tail


@pytest.mark.parametrize("leaf", list(LEAVES))
def test_each_alias_is_the_same_command(leaf, capsys):
    ours = _split(_help(cli.main, list(leaf), capsys))[1]
    alias = _split(_help(LEAVES[leaf], ALIAS_ARGV[leaf], capsys))[1]
    assert ours == alias and "--version" in ours and "--debug" in ours


@pytest.mark.parametrize("leaf", list(LEAVES))
def test_help_names_only_real_flags(leaf, capsys):
    """`fastdata-bench --help` once showed a --batch-size it did not have."""
    before, options = _split(_help(cli.main, list(leaf), capsys))
    real = set(_entries(options))
    named = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", before))
    assert named and named <= real, named - real
    if leaf == ("bench", "augment"):
        assert "--batch-size" not in before + options


@pytest.mark.parametrize("leaf", list(LEAVES))
def test_every_flag_with_a_default_says_it(leaf, capsys):
    parser = cli.parser(leaf[0])
    sub = parser.parse_args([*leaf, *(["src", "o-%d.tar"] if leaf == ("shard",) else [])])
    entries = _entries(_split(_help(cli.main, list(leaf), capsys))[1])
    checked = 0
    for flag, text in entries.items():
        default = getattr(sub, flag[2:].replace("-", "_"), None)
        if default is None or isinstance(default, bool) or flag in ("--help", "--version"):
            continue
        checked += 1
        assert "default" in text, text
        if leaf == ("demo",) and isinstance(default, int):
            assert f"default {default})" in text, text
    assert checked >= 3


def test_demo_flags_have_help_and_defaults(capsys):
    entries = _entries(_split(_help(demo.main, [], capsys))[1])
    for flag, default in (("--samples", 4096), ("--images", 512), ("--batch-size", 256), ("--workers", 2),
                          ("--epochs", 3), ("--repeats", 5)):
        assert f"(default {default})" in entries[flag], entries[flag]
    assert "~/.cache/fastdata/demo-images" in entries["--data"]


def _versions() -> list[str]:
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build"
    return [f"fastdata {fastdata.__version__}", f"torch {torch.__version__} ({build})", PILLOW]


@pytest.mark.parametrize("argv", [["--version"], ["profile", "--version"], ["bench", "augment", "--version"]])
def test_version(argv, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 0
    assert capsys.readouterr().out.splitlines() == _versions()
    assert "SIMD" in PILLOW or "stock" in PILLOW or "unknown" in PILLOW


@pytest.mark.parametrize("module", ["fastdata.cli", "fastdata.profiling.cli", "fastdata.bench", "fastdata.shard",
                                    "fastdata.demo"])
def test_version_of_every_script(module):
    # as a console script runs it: the module's main, imported
    done = subprocess.run([sys.executable, "-c", f"import sys; from {module} import main; sys.exit(main())",
                           "--version"], capture_output=True, text=True, timeout=100)
    assert done.returncode == 0 and done.stdout.splitlines() == _versions(), done.stderr


def test_python_dash_m_fastdata_is_the_command(tmp_path):
    done = subprocess.run([sys.executable, "-m", "fastdata", "--version"], capture_output=True, text=True,
                          timeout=100, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.splitlines() == _versions(), done.stderr


# ----------------------------------------------------------------- exit codes

@pytest.mark.parametrize("argv", [["--bogus"], ["profile", "x", "--steps", "0"], ["bench"],
                                  ["bench", "augment", "--images", "zero"], ["shard", "src"],
                                  ["shard", "src", "out.tar"], ["demo", "--workers", "-1"],
                                  ["demo", "--images", "5"], ["run"]])
def test_a_bad_command_line_is_2_and_one_line(argv, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    line = _one_line_error(captured.err, captured.err.partition(": error:")[0])
    assert line.startswith("fastdata") and line.endswith("(see --help)")


@pytest.mark.parametrize("argv,prog,says", [
    (["profile", "/no/such/folder", "--step-ms", "5"], "fastdata profile", "does not exist"),
    (["shard", "/no/such/folder", "{out}/s-%06d.tar"], "fastdata shard", "does not exist"),
])
def test_a_missing_source_is_1_and_one_line(argv, prog, says, tmp_path, capsys):
    assert cli.main([a.replace("{out}", str(tmp_path)) for a in argv]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and says in _one_line_error(captured.err, prog)
    assert not list(tmp_path.iterdir())


def test_a_missing_source_in_a_real_process():
    done = subprocess.run([sys.executable, "-m", "fastdata.cli", "shard", "/no/such/folder", "/tmp/x-%d.tar"],
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 1 and done.stdout == ""
    assert "/no/such/folder" in _one_line_error(done.stderr, "fastdata shard")


def test_demo_failure_is_1_and_one_line_and_debug_shows_the_traceback(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    argv = ["demo", "--samples", "32", "--batch-size", "16", "--epochs", "1", "--repeats", "1", "--workers", "0",
            "--images", "10", "--data", str(tmp_path / "file" / "data")]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "run 1/1" not in err  # said before the drop-in part runs (its runs print "run 1/1: ...")
    line = _one_line_error(err.splitlines()[-1], "fastdata demo")
    assert "is not a directory" in line and str(tmp_path / "file") in line
    with pytest.raises(CommandError, match="is not a directory"):
        cli.main([*argv, "--debug"])


def test_interrupted_is_130(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(bench, "augment", interrupted)
    assert cli.main(["bench", "augment", "-q"]) == 130
    assert capsys.readouterr().err.strip() == "fastdata bench augment: interrupted"


# ----------------------------------------------------------------- the faults

@pytest.mark.parametrize("flag", ["--json", "--plot"])
@pytest.mark.parametrize("case", ["under-a-file", "a-directory"])
def test_bench_output_paths_are_checked_before_measuring(flag, case, tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("")
    path = tmp_path / "file" / "out" if case == "under-a-file" else tmp_path
    measured = []
    monkeypatch.setattr(bench, "augment", lambda args: measured.append(args) or {})
    assert bench.main(["augment", flag, str(path)]) == 1
    captured = capsys.readouterr()
    line = _one_line_error(captured.err, "fastdata-bench augment")
    assert f"{flag} {str(path)!r} cannot be written" in line
    assert ("'" + str(tmp_path / "file") + "' is not a directory" if case == "under-a-file" else "a directory") in line
    assert not measured and captured.out == ""
    with pytest.raises(CommandError):
        bench.main(["augment", flag, str(path), "--debug"])


def test_bench_writes_json_into_a_new_folder(tmp_path, capsys):
    out = tmp_path / "new" / "augment.json"
    (tmp_path / "old.json").write_text("kept until the results replace it")
    assert cli.main(["bench", "augment", "--images", "2", "--reps", "1", "--size", "16", "--no-pipeline", "-q",
                     "--json", str(out), "--plot", str(tmp_path / "old.json")]) == 0
    assert set(json.loads(out.read_text())["ops"]) >= {"RandomResizedCrop", "Normalize"}
    assert (tmp_path / "old.json").read_text().startswith("<!doctype html>")


def test_shard_under_a_file_says_not_a_directory(folder, tmp_path, capsys):
    (tmp_path / "file").write_text("")
    pattern = tmp_path / "file" / "deeper" / "x-%06d.tar"
    assert shard.main([str(folder), str(pattern)]) == 1
    line = _one_line_error(capsys.readouterr().err, "fastdata-shard")
    assert f"'{tmp_path / 'file'}' is not a directory" in line and "File exists" not in line
    with pytest.raises(NotADirectoryError, match="is not a directory"):
        shard.write_shards(folder, pattern)
    assert (tmp_path / "file").read_text() == ""


def test_import_error_without_torch_suggests_the_cpu_wheel():
    done = subprocess.run([sys.executable, "-c", "import sys; sys.modules['torch'] = None; import fastdata"],
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 1
    message = done.stderr.strip().splitlines()[-1]
    assert message.startswith("ImportError: fastdata needs PyTorch")
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in message
    assert "GPU" in message and "CUDA" in message


@pytest.mark.parametrize("version", ["2.5.1+cu124", "1.13.1", "2.6.0", "2.13.0+cpu", "2.14.0.dev20261201"])
def test_a_torch_older_than_2_6_is_refused_in_one_line_at_import(version):
    """torch 2.5 has no DataLoader `in_order` (2.6 added it): there the first loader would fail
    with an AttributeError, and under `fastdata run` so would the script (the registry's 2.5.1,
    checked by hand); refused at import, the hook stays off and the script runs as it is."""
    code = f"import torch; torch.__version__ = {version!r}; import fastdata; print(fastdata.loader.__name__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    if version.startswith(("2.5", "1.")):
        assert done.returncode == 1
        assert done.stderr.strip().splitlines()[-1] == (
            f"ImportError: fastdata needs torch 2.6 or newer, but this is torch {version}: upgrade it (pip install -U "
            "torch, from the index of the CUDA build you use)")
    else:
        assert done.returncode == 0 and done.stdout.strip() == "loader", done.stderr[-2000:]


@pytest.mark.parametrize("torch_is", ["missing", "2.5.1"])
@pytest.mark.parametrize("command", ["fastdata-profile", "fastdata", "-m fastdata"])
def test_a_command_without_a_torch_it_can_use_says_so_in_one_line(tmp_path, torch_is, command):
    """The console scripts import the package before their own error handling: where `import
    fastdata` refuses (no torch, a torch older than 2.6) a command still answers in one line,
    `COMMAND: error: ...`, exit 1, as its other errors are reported, with no traceback, before
    any work (making the synthetic set here). A help page needs no torch (the test above)."""
    script = Path(sys.executable).parent / command.split()[-1]
    if command.startswith("-m"):
        argv = [sys.executable, "-m", "fastdata"]
    elif script.exists():
        argv = [str(script)]
    else:
        pytest.skip(f"{command}'s console script is not installed beside {sys.executable}")
    (tmp_path / "sitecustomize.py").write_text(
        "import sys; sys.modules['torch'] = None\n" if torch_is == "missing" else
        f"import torch; torch.__version__ = {torch_is!r}\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    job = [*([] if command == "fastdata-profile" else ["profile"]), "synthetic", "--step-ms", "100"]
    done = subprocess.run([*argv, *job], capture_output=True, text=True, timeout=100, env=env)
    assert done.returncode == 1 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    want = ("fastdata needs PyTorch, but it is not installed" if torch_is == "missing" else
            "fastdata needs torch 2.6 or newer, but this is torch 2.5.1: upgrade it")
    assert line.startswith(f"{Path(argv[-1]).name}: error: ImportError: {want}"), line


# ----------------------------------------------------------------- progress

class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_in_a_log_is_a_few_lines():
    log = io.StringIO()
    with Progress("things", 1000, stream=log) as shown:
        for done in range(1, 1001):
            shown.update(done)
    lines = log.getvalue().splitlines()
    assert [line.split(": ")[1].split()[0] for line in lines] == ["0/1000", "250/1000", "500/1000", "750/1000",
                                                                  "1000/1000"]


def test_progress_on_a_terminal_is_a_rich_bar():
    tty = _Terminal()
    with Progress("things", 50, stream=tty) as shown:
        for done in range(1, 51):
            shown.update(done)
    text = tty.getvalue()
    assert "things" in text and "50/50" in text and "━" in text and "\x1b[" in text


def test_synthetic_set_progress_in_a_log(tmp_path, capsys):
    make_imagenet_like(tmp_path / "d", n_images=40, n_classes=2, workers=2, progress=True)
    lines = capsys.readouterr().err.splitlines()
    assert 2 <= len(lines) <= 5 and lines[-1].startswith(f"synthetic images under {tmp_path / 'd'}: 40/40")
    assert all("\r" not in line for line in lines)

