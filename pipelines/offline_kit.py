"""An offline install kit: what a node without network access lacks to run simgraph.

HPC compute nodes and the GPU machines this project is lent have PyTorch with CUDA and a
Python preinstalled, but no Ray, FFCV or Optuna, no package index, and take files in pieces of
limited size. On a machine *with* package access this gathers exactly the missing packages,
built for the node's Python and platform, into a folder that needs no network to install::

    python -m pipelines.offline_kit --python python3.12 --have NODE_PACKAGES.txt --out .kit
    # carry .kit to the node, then there:
    bash .kit/install.sh [TARGET]      # verifies, unpacks, checks the imports
    . .kit/env.sh                      # PYTHONPATH for this shell

The engine is :mod:`components.deploy`: what the kit carries and how pip gets it for the node
(``wheels.py``: ``--have``, ``--python``, ``--wheel``, ``--require``), the kit's files
(``offline_kit.py``: pieces, ``SHA256SUMS``, ``kit.json``, ``install.sh``), and ``--check``,
its proof in a clean venv without network (``kit_check.py``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from components.deploy.kit_check import check_install
from components.deploy.offline_kit import build
from components.deploy.wheels import DEFAULT_WITHOUT, KitError


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
