"""The offline install kit (components/deploy/): what it leaves to the node, how it is cut
into pieces, and that its install.sh needs nothing but the kit (no index, no network) and
refuses a damaged kit or another Python. The real build (wheels for the node, FFCV compiled and
its libraries vendored) runs in ``make gpu-kit`` and on the GPU node (docs/gpu.md)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from components.deploy import offline_kit as kit
from components.deploy import wheels
from pipelines import offline_kit as command

ROOT = Path(__file__).resolve().parents[2]


def test_have_file_takes_freeze_output_and_bare_names(tmp_path: Path) -> None:
    f = tmp_path / "have.txt"
    f.write_text("# node\nTorch==2.11.0+cu130\nopencv_python_headless==5.0.0\nPyYAML\n"
                 "ray[default] @ file:///x\n\n")
    assert wheels.read_have(f) == {"torch", "opencv-python-headless", "pyyaml", "ray"}
    (tmp_path / "empty.txt").write_text("# nothing\n")
    with pytest.raises(wheels.KitError, match="no package names"):
        wheels.read_have(tmp_path / "empty.txt")


def test_requirements_leave_the_nodes_packages_to_the_node() -> None:
    have = wheels.read_have(ROOT / "examples/offline/gpu-node-packages.txt")
    assert {"torch", "torchvision", "numpy", "numba", "sentence-transformers"} <= have
    reqs = wheels.project_requirements(have, wheels.DEFAULT_WITHOUT, "train,tune,data")
    names = {wheels.requirement_name(r) for r in reqs}
    # torch cannot be replaced by a kit; ffcv and simgraph are built here, not resolved
    assert not names & (have | {"ffcv", "simgraph", "openvino"})
    ray = next(r for r in reqs if r.startswith("ray"))
    assert ray == "ray[train,tune,data]==2.60.0"  # the project's pin, the kit's extras
    assert {"ray", "optuna", "tensorboardx"} <= names


def _fake_kit(tmp_path: Path, python: str) -> Path:
    """A kit folder as build() writes it, over a site of stand-in packages."""
    site = tmp_path / "build/site"
    for mod in ("ray", "ray/train", "ray/tune", "ffcv", "optuna"):
        (site / mod).mkdir(parents=True)
        (site / mod / "__init__.py").write_text("__version__ = '0.test'\n")
    (site / "bin").mkdir()
    (site / "bin/tool").write_text("#!/build/venv/bin/python\nprint('ok')\n")
    out = tmp_path / "kit"
    out.mkdir()
    pieces = kit.pack(site, out, piece_mib=1)
    (out / "install.sh").write_text(kit.INSTALL_SH)
    (out / "kit.json").write_text(json.dumps({"python": python, "pieces": pieces}))
    (out / "SHA256SUMS").write_text("".join(f"{kit.sha256(out / p)}  {p}\n" for p in pieces))
    return out


def _install(k: Path, target: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    return subprocess.run(["bash", str(k / "install.sh"), str(target)], capture_output=True,
                          text=True, env=env, timeout=120)


def test_install_sh_unpacks_verifies_and_imports_offline(tmp_path: Path) -> None:
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    k = _fake_kit(tmp_path, here)
    target = tmp_path / "site"
    r = _install(k, target)
    assert r.returncode == 0, r.stderr
    assert "ray 0.test, ffcv 0.test, optuna 0.test import" in r.stdout
    assert (target / "ray/train/__init__.py").is_file()
    # the scripts' first line names this interpreter, not the build machine's
    assert (target / "bin/tool").read_text().splitlines()[0] == f"#!{sys.executable}"
    env = (k / "env.sh").read_text()
    assert f'export PYTHONPATH="{target}' in env and f"{target}/bin" in env
    assert not list(tmp_path.glob(".kit-unpack.*"))  # the staging folder is gone


def test_install_sh_refuses_a_damaged_kit_and_another_python(tmp_path: Path) -> None:
    k = _fake_kit(tmp_path, "2.7")
    r = _install(k, tmp_path / "site")
    assert r.returncode == 2 and "this kit is for Python 2.7" in r.stderr
    assert not (tmp_path / "site").exists()

    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    k2 = _fake_kit(tmp_path / "b", here)
    piece = next(k2.glob("site.tar.xz.*"))
    piece.write_bytes(piece.read_bytes()[:-10])  # a transfer cut short
    target = tmp_path / "b/site"
    target.mkdir()
    (target / "keep").write_text("an earlier install")
    r = _install(k2, target)
    assert r.returncode == 2 and "missing or damaged" in r.stderr
    assert (target / "keep").read_text() == "an earlier install"  # nothing replaced


def test_pieces_are_cut_at_the_limit_and_join_back(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "blob").write_bytes(os.urandom(int(2.5 * 2**20)))  # incompressible
    out = tmp_path / "out"
    out.mkdir()
    pieces = kit.pack(site, out, piece_mib=1)
    assert len(pieces) == 3 and all((out / p).stat().st_size <= 2**20 for p in pieces)
    joined = b"".join((out / p).read_bytes() for p in pieces)
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(joined), mode="r:xz") as t:
        data = t.extractfile("site/blob").read()  # type: ignore[union-attr]
    assert hashlib.sha256(data).digest() == hashlib.sha256((site / "blob").read_bytes()).digest()


def test_a_foreign_output_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    have = tmp_path / "have.txt"
    have.write_text("torch\n")
    with pytest.raises(wheels.KitError, match="not a kit"):
        kit.build(sys.executable, have, tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_kit_for_a_clean_venv_carries_torch_ffcvs_imports_and_replaced_pins(
        tmp_path: Path) -> None:
    """Without ``--have`` the node has nothing: torch is carried (as the wheel given with
    ``--wheel``: its pin leaves the resolve), ``--require`` replaces a pin or adds one, and
    FFCV's run-time imports (cv2, tqdm: FFCV is installed without its declared dependencies)
    are carried unless the node has a distribution that provides them."""
    reqs = wheels.project_requirements(set(), wheels.DEFAULT_WITHOUT, "train,tune,data",
                                    require=["torchvision==0.28.0"])
    by_name = {wheels.requirement_name(r): r for r in reqs}
    assert by_name["torch"] == "torch==2.14.1" and by_name["torchvision"] == "torchvision==0.28.0"
    assert {"opencv-python-headless", "tqdm"} <= set(by_name)
    assert len(reqs) == len(by_name)  # one requirement per distribution
    # A node with any OpenCV build has cv2.
    node = wheels.project_requirements({"opencv-python", "tqdm"}, (), "train")
    assert not {wheels.requirement_name(r) for r in node} & {"opencv-python-headless", "tqdm"}
    with pytest.raises(wheels.KitError, match=r"--require '==1' names no distribution"):
        wheels.project_requirements(set(), (), "train", require=["==1"])
    # pip takes --platform tags literally: every glibc from 2.5 to the node's 2.35, no gap
    # (nvidia-nccl-cu13's wheel is manylinux_2_18: the index's torch was not resolvable).
    tags = set(wheels.Target("python3", "3.11").pip_cross())
    assert {f"manylinux_2_{v}_x86_64" for v in range(5, 36)} <= tags
    wheel = tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(b"PK")
    assert wheels.wheel_name(wheel) == "torch"
    for bad in (tmp_path / "torch.tar.gz", tmp_path / "missing-1-py3-none-any.whl"):
        with pytest.raises(wheels.KitError, match=r"--wheel .*not a wheel file"):
            wheels.wheel_name(bad)


def test_the_pack_level_is_free_and_bad_options_are_refused(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "a.txt").write_text("x" * 100_000)
    for preset in (0, 9):
        out = tmp_path / f"out{preset}"
        out.mkdir()
        pieces = kit.pack(site, out, piece_mib=1, xz_preset=preset)
        import tarfile

        with tarfile.open(out / pieces[0], mode="r:xz") as t:  # the same format either way
            assert t.extractfile("site/a.txt").read() == b"x" * 100_000  # type: ignore[union-attr]
    with pytest.raises(wheels.KitError, match="--xz-preset 12"):
        kit.build(sys.executable, None, tmp_path / "k", xz_preset=12)
    assert command.main(["--python", sys.executable, "--out", str(tmp_path / "k"),
                     "--no-build"]) == 2
    assert command.main(["--python", sys.executable, "--out", str(tmp_path / "none"), "--no-build",
                     "--check"]) == 2  # no kit there: said in one line, nothing run
