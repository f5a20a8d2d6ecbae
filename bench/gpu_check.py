"""The GPU check: every command a user runs, on one GPU machine, in one bounded command.

Made for a GPU node without network access (``docs/gpu.md``: prepare a kit with
``make gpu-kit`` where pip works, carry ``.kit``, then on the node)::

    bash .kit/install.sh && . .kit/env.sh
    python bench/gpu_check.py --budget 480 --data .kit/data/fashion-mnist [--out DIR]

Each stage runs as its own process group with a timeout (a hung loader fails its stage, never
the check) and prints one line: ``PASS`` / ``FAIL`` / ``SKIP`` (and why), its seconds, a detail.
Stages, in order of what they are worth (a stage whose estimate no longer fits ``--budget`` is
skipped, saying so; one whose prerequisite failed is skipped naming it):

1. ``dataset``: Fashion-MNIST (the kit's copy) through ``simgraph preprocess`` (Ray Data).
2. ``pretrain``: CoNe (memory bank + EMA + CoNe's terms) with the online kNN every epoch,
   2 epochs, checkpoints.
3. ``evaluate`` / ``export`` / ``embed`` of that run (no ``--device``: the default device).
4. ``resume``: the same run continued to 3 epochs (``train.epochs=3``).
5. ``acceptance``: ``bench/gpu_acceptance.py`` (FFCV → CUDA, AMP, NCCL checks, img/s, host
   syncs per step, the paper estimate).
6. ``fp16``: SupCon under ``train.amp=fp16`` (GradScaler, step skipping).
7. ``sweep``: 2 trials and a ``confirm:`` stage (1 setting × 1 seed).
8. ``compile``: ``train.compile=true``.
9. ``in_process`` (only when Ray does not import): ``scaling.host=in_process`` is CPU-only,
   so this reports what a Ray-less node can still check (FFCV → CUDA).

Every training stage runs with ``scaling.max_failures=0``: a failure is reported once, not
retried.

The summary (``--out``/report.md) repeats the lines, the timing table, the acceptance report and
the environment (GPU, driver, torch, CUDA, packages). Exit status 0 when no stage failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
CLI = [PY, "-m", "pipelines.cli"]
R18 = "pipelines/configs/pretrain/fashion_mnist_resnet18.yaml"


@dataclasses.dataclass
class Stage:
    name: str
    estimate_s: float  # what it is expected to take on one H100 (skipped when it no longer fits)
    timeout_s: float
    needs: tuple[str, ...] = ()
    ray: bool = True
    status: str = "SKIP"
    seconds: float = 0.0
    detail: str = ""
    output: str = ""


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_cmd(cmd: Sequence[str], timeout: float, env: dict[str, str] | None = None,
            cwd: Path = ROOT) -> tuple[int | None, str]:
    """(exit status or None on timeout, combined output); the whole process group is killed
    at the timeout (Ray's and FFCV's children included)."""
    p = subprocess.Popen(list(cmd), cwd=cwd, env={**os.environ, **(env or {})},
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
        return p.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        return None, out


class Check:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = Path(args.work).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.dataset = self.work / "fashion-mnist"
        self.runs = self.work / "runs"
        self.deadline = time.monotonic() + args.budget
        self.stages: list[Stage] = []
        self.has_ray = importlib.util.find_spec("ray") is not None
        self.reports: list[str] = []

    # -- stages -------------------------------------------------------------------------
    def device_overrides(self) -> list[str]:
        if self.args.cpu:  # a dry run of the stages' commands on a machine without a GPU
            return ["scaling.use_gpu=false", "scaling.cpus_per_worker=1", "data.num_workers=1",
                    "train.amp=none", "data.batch_size=64"]
        return ["scaling.use_gpu=true", "scaling.cpus_per_worker=8", "data.num_workers=8"]

    def common(self, name: str, epochs: int, steps: int) -> list[str]:
        return [f"name={name}", f"storage={self.runs}", f"data.dataset={self.dataset}",
                f"train.epochs={epochs}", f"train.steps_per_epoch={steps}",
                *self.device_overrides(),
                "optim.warmup_epochs=1", "checkpoint.every_epochs=1", "checkpoint.keep=2",
                "scaling.max_failures=0"]  # a failure is reported, not retried 3 times

    def cli(self, stage: Stage, args: Sequence[str], expect: Callable[[str], str | None]
            | None = None) -> None:
        rc, out = run_cmd([*CLI, *args], stage.timeout_s,
                          env={"SIMGRAPH_RAY_DASHBOARD": "0"})
        stage.output = out
        if rc is None:
            stage.status, stage.detail = "FAIL", f"timed out after {stage.timeout_s:.0f} s " \
                                                  f"(hang): {_tail(out, 3)}"
        elif rc != 0:
            stage.status, stage.detail = "FAIL", f"exit {rc}: {_tail(out, 4)}"
        else:
            problem = expect(out) if expect else None
            stage.status = "FAIL" if problem else "PASS"
            stage.detail = problem or _tail(out, 2)

    def s_dataset(self, st: Stage) -> None:
        if (self.dataset / "manifest.json").is_file():
            st.status, st.detail = "PASS", "already built"
            return
        self.cli(st, ["preprocess", "pipelines/configs/data/fashion_mnist.yaml",
                      f"output={self.dataset}", f"source.path={Path(self.args.data).resolve()}",
                      "captions.enabled=false"])

    def s_acceptance(self, st: Stage) -> None:
        rc, out = run_cmd([PY, "bench/gpu_acceptance.py", "--steps", "40", "--epochs", "3",
                           "--dataset", str(self.dataset)], st.timeout_s)
        st.output = out
        if "### GPU acceptance" in out:
            self.reports.append(out[out.index("### GPU acceptance"):])
        st.status = "PASS" if rc == 0 else "FAIL"
        st.detail = "timed out" if rc is None else _tail(out, 2)

    def cone(self, epochs: int) -> list[str]:
        """``simgraph pretrain`` of the CoNe run (memory bank, EMA, online kNN every epoch);
        the resume stage is the same run with more epochs."""
        return ["pretrain", R18, *self.common("cone", epochs, 30), "loss.name=cone",
                "loss.bank_size=4096", "loss.top_n=32", "loss.lambda_sup=0.7",
                "loss.lambda_dc=0.4", "loss.tau_sup=0.1", "loss.tau_dc=0.07",
                "loss.ema_momentum=0.996", "knn.every_epochs=1", "knn.k=20"]

    def s_pretrain(self, st: Stage) -> None:
        self.cli(st, self.cone(2),
                 lambda out: None if (self.runs / "cone").is_dir() else "no run dir")

    def s_resume(self, st: Stage) -> None:
        self.cli(st, self.cone(3),
                 lambda out: None if "resum" in out.lower() else "no resume was reported")

    def s_evaluate(self, st: Stage) -> None:
        self.cli(st, ["evaluate", str(self.runs / "cone"), "--no-baseline"])

    def s_export(self, st: Stage) -> None:
        self.cli(st, ["export", str(self.runs / "cone"), "--out", str(self.work / "export")])

    def s_embed(self, st: Stage) -> None:
        self.cli(st, ["embed", str(self.runs / "cone"), "--data", str(self.dataset), "--split",
                      "test", "--out", str(self.work / "embed.parquet")])

    def s_fp16(self, st: Stage) -> None:
        self.cli(st, ["pretrain", R18, *self.common("fp16", 1, 40), "train.amp=fp16",
                      "knn.every_epochs=0"])

    def s_compile(self, st: Stage) -> None:
        self.cli(st, ["pretrain", R18, *self.common("compile", 1, 40), "train.compile=true",
                      "knn.every_epochs=0"])

    def s_sweep(self, st: Stage) -> None:
        space = self.work / "sweep.yaml"
        space.write_text(textwrap.dedent(f"""\
            name: gpu-check
            storage: {self.runs / 'sweeps'}
            base: {ROOT / R18}
            overrides: [data.dataset={self.dataset}, train.epochs=2, train.steps_per_epoch=20,
                        knn.every_epochs=1, knn.k=20, optim.warmup_epochs=1,
                        scaling.use_gpu=true, data.num_workers=4, scaling.max_failures=0]
            metric: knn_top1
            mode: max
            num_samples: 2
            max_concurrent: 1
            resources: {{workers: 1, cpus_per_worker: 4, gpus_per_worker: 1.0}}
            searcher: {{name: random, seed: 0}}
            scheduler: {{name: fifo}}
            confirm: {{top: 1, seeds: 1, split: test}}
            space:
              loss.tau: {{loguniform: [0.05, 0.5]}}
            """))
        self.cli(st, ["sweep", str(space)])

    def s_in_process(self, st: Stage) -> None:
        code = ("import torch, sys; sys.path.insert(0, 'bench'); import gpu_acceptance as g; "
                "from components.config import PretrainConfig, load_config; "
                f"cfg = load_config(g.CONFIG, PretrainConfig, ['data.dataset={self.dataset}']); "
                f"print(g.check_ffcv_cuda(cfg, __import__('pathlib').Path('{self.dataset}')))")
        rc, out = run_cmd([PY, "-c", code], st.timeout_s)
        st.output = out
        st.status = "PASS" if rc == 0 and "ok=True" in out else "FAIL"
        st.detail = _tail(out, 2)

    # -- driver -------------------------------------------------------------------------
    def plan(self) -> list[Stage]:
        return [
            Stage("dataset", 30, 240),
            Stage("pretrain", 90, 200, ("dataset",)),
            Stage("evaluate", 45, 120, ("pretrain",)),
            Stage("export", 20, 90, ("pretrain",)),
            Stage("embed", 40, 120, ("pretrain",)),
            Stage("resume", 60, 150, ("pretrain",)),
            Stage("acceptance", 100, 200, ("dataset",)),
            Stage("fp16", 60, 150, ("dataset",)),
            Stage("sweep", 150, 300, ("dataset",)),
            Stage("compile", 80, 200, ("dataset",)),
            Stage("in_process", 40, 120, ("dataset",), ray=False),
        ]

    def run(self, only: set[str] | None) -> int:
        done: dict[str, Stage] = {}
        for st in self.plan():
            self.stages.append(st)
            left = self.deadline - time.monotonic()
            failed = [n for n in st.needs if done.get(n) is None or done[n].status != "PASS"]
            if only and st.name not in only and st.name != "dataset":
                st.detail = "not asked for (--stages)"
            elif st.ray and not self.has_ray:
                st.detail = "Ray does not import here"
            elif not st.ray and self.has_ray and not only:
                st.detail = "Ray is here: the Ray stages cover it"
            elif failed:
                st.detail = f"needs {', '.join(failed)}"
            elif left < st.estimate_s:
                st.detail = f"out of budget ({left:.0f} s left, needs ~{st.estimate_s:.0f})"
            else:
                st.timeout_s = min(st.timeout_s, max(left, 10.0))
                t0 = time.monotonic()
                try:
                    getattr(self, f"s_{st.name}")(st)
                except Exception as e:  # noqa: BLE001 - the check reports, then goes on
                    st.status, st.detail = "FAIL", f"{type(e).__name__}: {e}"
                st.seconds = time.monotonic() - t0
            done[st.name] = st
            print(f"{st.status:4} {st.name:<11} {st.seconds:6.1f} s  "
                  f"{' '.join(st.detail.split())[:300]}", flush=True)
        return 1 if any(s.status == "FAIL" for s in self.stages) else 0


def environment() -> str:
    import torch

    lines = [f"python {sys.version.split()[0]}, torch {torch.__version__}, "
             f"CUDA {torch.version.cuda}, cuda available: {torch.cuda.is_available()}"]
    if torch.cuda.is_available():
        lines.append(f"{torch.cuda.device_count()} × {torch.cuda.get_device_name(0)}, "
                     f"capability {torch.cuda.get_device_capability(0)}")
    for m in ("ray", "ffcv", "optuna", "numpy", "numba"):
        try:
            lines.append(f"{m} {importlib.import_module(m).__version__}")
        except Exception as e:  # noqa: BLE001
            lines.append(f"{m}: {type(e).__name__}: {e}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=float, default=480.0, help="seconds for all stages")
    ap.add_argument("--data", default=".kit/data/fashion-mnist",
                    help="Fashion-MNIST idx files (the kit's, or Debian's)")
    ap.add_argument("--work", default="runs/gpu_check", help="datasets and runs go here")
    ap.add_argument("--out", help="a folder for report.md and each stage's log")
    ap.add_argument("--stages", help="comma-separated stage names to run (default: all)")
    ap.add_argument("--cpu", action="store_true",
                    help="try the stages' commands on the CPU (no GPU stage can pass)")
    args = ap.parse_args(argv)
    env = environment()
    print(env, flush=True)
    check = Check(args)
    rc = check.run(set(args.stages.split(",")) if args.stages else None)
    table = ["| stage | result | s | detail |", "|---|---|---|---|"] + [
        f"| {s.name} | {s.status} | {s.seconds:.0f} | "
        f"{' '.join(s.detail.split())[:200].replace('|', '/')} |" for s in check.stages]
    text = "\n".join(["## GPU check", "", "```", env, "```", "", *table, "", *check.reports])
    print("\n".join(table))
    print("\n".join(check.reports))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.md").write_text(text + "\n")
        (out / "stages.log").write_text("\n\n".join(
            f"===== {s.name} ({s.status}) =====\n{s.output[-20000:]}" for s in check.stages))
        (out / "stages.json").write_text(json.dumps(
            [dataclasses.asdict(s) | {"output": s.output[-4000:]} for s in check.stages],
            indent=1))
    print(f"gpu_check: exit {rc} ({shlex.join(sys.argv)})")
    return rc


if __name__ == "__main__":
    sys.exit(main())
