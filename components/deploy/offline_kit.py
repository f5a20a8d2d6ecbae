"""An offline install kit as files: the folder :func:`build` writes from the packages
:mod:`components.deploy.wheels` gathers, its pieces (:func:`pack`), their checksums, the
install script run on the node (:data:`INSTALL_SH`) and the optional Fashion-MNIST files.

The kit is one pre-installed ``site`` folder (plus simgraph itself as a wheel's files), packed
as ``site.tar.xz`` and split into pieces of at most ``--piece-mib``; ``SHA256SUMS`` covers every
piece; ``kit.json`` records the interpreter version, each package and version, what was left
out (``--have``, ``--without``) and what was pruned from Ray. With ``--fashion-mnist`` the
Debian ``dataset-fashion-mnist`` files are added under ``data/fashion-mnist`` (the train
images cut to ``--train-images`` to fit a transfer).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import shutil
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

from components.deploy.wheels import (
    DEFAULT_WITHOUT,
    PLATFORMS,
    RAY_PRUNE,
    KitError,
    Target,
    build_local_wheels,
    build_venv,
    canonical,
    install_site,
    project_requirements,
    read_have,
    requirement_name,
    resolve,
    wheel_name,
)

FASHION = Path("/usr/share/datasets/fashion-mnist")


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


__all__ = ["FASHION", "INSTALL_SH", "add_fashion_mnist", "build", "pack", "sha256"]
