"""What a ``simgraph`` command prints: quiet by default, everything with ``--verbose``.

Quiet (the default) keeps our own lines — the start-of-run summary, per-epoch lines, progress
lines during long epochs, result tables — plus every error and every warning we do not know
to be harmless. It drops:

* Ray Train's per-report dumps and start-up chatter (:data:`CHATTER`: ``Reporting training
  result N: TrainingReport(...)``, ``Checkpoint successfully created at ...``, worker-group
  start-up lines), by a filter on the worker output Ray forwards to the driver. Not by Ray
  Train's ``LoggingConfig(log_level="WARNING")``: that would also hide its INFO-level
  ``[FailurePolicy] RETRY`` report of a failed worker group, and Ray 2.60 logs the report
  dump on a logger named after a file path, which its level filter misses. Ray Train's log
  files under ``/tmp/ray/session_*/logs`` keep everything;
* Ray's INFO lines on the driver (``Started a local Ray instance``) and Ray Data's console
  progress log when stdout is not a terminal (Ray Data's log file keeps it);
* the known-harmless messages of :data:`HARMLESS` forwarded from Ray's worker processes or
  logged on the driver; the first one hidden prints one line saying so and where they are
  explained (``docs/ray-notes.md``, "Harmless messages"). One of them the driver's own C++
  core writes straight to its stderr, where no filter reaches (``Failed to determine local
  IP via external connectivity``): it stays, and the docs say why it is harmless. (The
  actor-restart error of Ray Data's caption actor pool, which the driver creates, was another;
  its cause is gone: ``docs/ray-notes.md``, "Ray Data".)

Progress during an epoch: when the driver's stdout is a terminal (and not ``--verbose``), rank 0
sends a progress event (:func:`progress_event`) about twice a second and the driver draws it
as one live tqdm bar per epoch (:class:`LiveBar`: step / steps, loss, img/s, ETA), erased when
the epoch's summary line prints. Otherwise (a log file, CI, ``--verbose``) rank 0 prints a
plain :func:`progress_line` every 20 s of a long epoch instead.

``--verbose`` (``SIMGRAPH_VERBOSE=1``, inherited by a local cluster's workers and passed to
training workers in their loop config) turns all of the above off: everything is shown.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sys
import threading
from collections.abc import Callable
from typing import Any

VERBOSE_ENV = "SIMGRAPH_VERBOSE"
OWN_PREFIX = "[simgraph]"  # lines workers print for the user
LIVE_TAG = f"{OWN_PREFIX} @progress "  # a progress event for the driver's live bar
LIVE_EVERY_S = 0.5  # rank 0 sends a progress event this often when the bar is live

# name -> pattern of a line that is harmless on the machines simgraph runs on (why: ray-notes).
HARMLESS: dict[str, re.Pattern[str]] = {
    "c10d-hostname": re.compile(r"The hostname of the client socket cannot be retrieved"),
    "actor-restart-args": re.compile(
        r"Actor with class name: '(PreemptionWatcher|MapWorker\(.*?\))'.* max_restarts > 0"),
    "local-ip": re.compile(r"Failed to determine local IP via external connectivity"),
    "token-auth": re.compile(r"Token authentication is enabled"),
    "multiple-ray": re.compile(r"Found multiple active Ray instances"),
}
# Ray actors whose whole output is harmless here: Ray Train's placement-group watchdog prints a
# ConnectionError traceback when two Ray instances share a host (training is unaffected).
HARMLESS_ACTORS = {"PlacementGroupCleaner": "multiple-ray"}
# Informational lines of Ray Train that quiet mode drops without a word.
CHATTER = re.compile(
    r"Reporting training result \d+: TrainingReport\(|Checkpoint successfully created at"
    r"|Setting up process group for|Started training worker group|Requesting resources"
    r"|Attempting to start training worker group|- \(ip=.*\) world_rank=")
_hidden: dict[str, int] = {}
_lock = threading.Lock()
_forwarding_filtered = False  # the driver's filter of forwarded worker output is installed


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def live() -> bool:
    """Whether this driver draws rank 0's progress as a live bar: its stdout is a terminal,
    not ``--verbose``, and its filter of forwarded worker output is installed (the events
    would print as raw lines otherwise)."""
    return _forwarding_filtered and not verbose() and sys.stdout.isatty()


def set_verbose(on: bool) -> None:
    """``--verbose``: this process and the Ray workers it starts show everything."""
    if on:
        os.environ[VERBOSE_ENV] = "1"
    else:
        os.environ.pop(VERBOSE_ENV, None)


def harmless(line: str) -> str | None:
    """The :data:`HARMLESS` name ``line`` matches, or None."""
    for name, pattern in HARMLESS.items():
        if pattern.search(line):
            return name
    return None


def _note_hidden(name: str) -> None:
    with _lock:
        first = not _hidden
        _hidden[name] = _hidden.get(name, 0) + 1
    if first:
        print("simgraph: hiding known-harmless Ray / torch messages (docs/ray-notes.md, "
              "'Harmless messages'); --verbose shows them", file=sys.stderr, flush=True)


def hidden_counts() -> dict[str, int]:
    """How many lines of each :data:`HARMLESS` kind this process has hidden."""
    with _lock:
        return dict(_hidden)


def filter_lines(lines: list[str]) -> list[str]:
    """``lines`` without Ray Train's chatter and the known-harmless ones (each harmless one is
    counted)."""
    kept = []
    for line in lines:
        if CHATTER.search(line):
            continue
        name = harmless(line)
        if name is None:
            kept.append(line)
        else:
            _note_hidden(name)
    return kept


def say(line: str) -> None:
    """Print one of our lines. A plain write: in Ray Train V2 workers ``print`` is patched to
    also log through the root logger, which printed every line twice."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class _HarmlessFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        name = harmless(record.getMessage())
        if name is not None:
            _note_hidden(name)
            return False
        return True


def before_ray_init() -> dict[str, Any]:
    """Quiet-mode settings to apply before ``ray.init``; returns extra ``ray.init`` kwargs."""
    if verbose():
        return {}
    # A logger's filters see only records logged on that logger, not its children's: the
    # filter goes on the logger that emits the notice.
    logger = logging.getLogger("ray._private.authentication.authentication_token_setup")
    if not any(isinstance(f, _HarmlessFilter) for f in logger.filters):
        logger.addFilter(_HarmlessFilter())
    return {"logging_level": logging.WARNING}


def after_ray_init() -> None:
    """Quiet mode, once Ray is up: filter forwarded worker output, quiet Ray Data's console."""
    if verbose():
        return
    _filter_forwarded_output()
    import ray.data  # noqa: F401 - configures the "ray.data" logger, adjusted below

    for handler in logging.getLogger("ray.data").handlers:
        if not isinstance(handler, logging.FileHandler) and type(handler).__name__ != (
                "SessionFileHandler"):
            handler.setLevel(logging.WARNING)


def _filter_forwarded_output() -> None:
    """Wrap Ray's handler of worker stdout/stderr lines so that :data:`HARMLESS` lines are
    dropped. Ray has no public hook for this; without the private dispatcher (another Ray
    version) the output is left as it is."""
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
    except ImportError:
        return
    global _forwarding_filtered
    with dispatcher._lock:
        handlers: list[tuple[str, Callable[[dict[str, Any]], None]]] = dispatcher.handlers
        for i, (name, handle) in enumerate(handlers):
            if name == "ray_print_logs":
                if not getattr(handle, "simgraph_filtered", False):
                    handlers[i] = (name, _filtered(handle))
                _forwarding_filtered = True


def _filtered(handle: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """Ray's handler without the harmless lines; our own ``[simgraph]`` lines from a worker
    (rank 0's epoch and progress lines) print as they are, without Ray's worker prefix;
    progress events (:data:`LIVE_TAG`) move the live bar."""

    def emit(data: dict[str, Any]) -> None:
        actor = HARMLESS_ACTORS.get(str(data.get("actor_name") or ""))
        if actor is not None:
            _note_hidden(actor)
            return
        lines = filter_lines(list(data.get("lines", [])))
        ours = [line for line in lines if line.startswith(OWN_PREFIX)]
        rest = [line for line in lines if not line.startswith(OWN_PREFIX)]
        sink = sys.stderr if data.get("is_err") else sys.stdout
        for line in ours:
            if line.startswith(LIVE_TAG):
                BAR.event(line)
            else:
                BAR.close()
                print(line, file=sink, flush=True)
        if rest:
            BAR.around(lambda: handle({**data, "lines": rest}))

    emit.simgraph_filtered = True  # type: ignore[attr-defined]
    return emit


def duration(seconds: float) -> str:
    """``1:02:03`` / ``2:03`` / ``12 s``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def epoch_line(row: dict[str, Any], epochs: int, eta_s: float | None) -> str:
    """One line per epoch: ``epoch 3/15  loss 3.912  lr 0.001  kNN 78.4 ± 1.3 %  620 img/s
    data-wait 3 %  12 s  ETA 2:24`` (``probe 81.0 ± 1.2 %`` after the kNN when the online
    linear probe reported)."""
    parts = [f"epoch {row['epoch']}/{epochs}", f"loss {row['loss']:.4f}", f"lr {row['lr']:.3g}"]
    for key, name in (("knn_top1", "kNN"), ("probe_top1", "probe")):
        if key in row:
            se = row.get(f"{key}_se")
            parts.append(f"{name} {100 * row[key]:.1f}" + (
                f" ± {100 * se:.1f} %" if se is not None else " %"))
    parts += [f"{row['samples_per_s']:.0f} img/s", f"data-wait {100 * row['data_wait']:.0f} %",
              duration(row["time_s"])]
    if eta_s is not None and row["epoch"] < epochs:
        parts.append(f"ETA {duration(eta_s)}")
    return f"{OWN_PREFIX} " + "  ".join(parts)


def progress_line(epoch: int, epochs: int, step: int, steps: int, loss: float,
                  samples_per_s: float, eta_epoch_s: float) -> str:
    """A line during a long epoch: ``epoch 3/15  step 40/84 (48 %)  loss 3.91  620 img/s
    epoch ETA 12 s``."""
    return (f"{OWN_PREFIX} epoch {epoch}/{epochs}  step {step}/{steps} "
            f"({100 * step // steps} %)  loss {loss:.4f}  {samples_per_s:.0f} img/s  "
            f"epoch ETA {duration(eta_epoch_s)}")


def progress_event(epoch: int, epochs: int, step: int, steps: int, loss: float,
                   samples_per_s: float) -> str:
    """Rank 0's progress for the driver's :class:`LiveBar` (one forwarded output line)."""
    return LIVE_TAG + json.dumps({"epoch": epoch, "epochs": epochs, "step": step,
                                  "steps": steps, "loss": loss, "ips": samples_per_s})


class LiveBar:
    """The driver's live progress bar: one tqdm bar per epoch, drawn from rank 0's
    :func:`progress_event` lines (step / steps, loss, img/s, tqdm's rate and ETA), erased
    (``leave=False``) when one of our own lines prints (the epoch's summary line), cleared and
    redrawn around any other output. ``file``: where to draw (stdout)."""

    def __init__(self, file: Any = None) -> None:
        self.file = file
        self.bar: Any = None
        self.epoch: int | None = None
        self.lock = threading.Lock()

    def event(self, line: str) -> None:
        """Move the bar to the event in ``line`` (a :data:`LIVE_TAG` line); a malformed one
        prints as it is."""
        try:
            e = json.loads(line[len(LIVE_TAG):])
            epoch, step, steps = int(e["epoch"]), int(e["step"]), int(e["steps"])
            post = f"loss {float(e['loss']):.4f}  {float(e['ips']):.0f} img/s"
            desc = f"{OWN_PREFIX} epoch {epoch}/{int(e['epochs'])}"
        except (ValueError, KeyError, TypeError):
            print(line, file=self.file or sys.stdout, flush=True)
            return
        from tqdm import tqdm

        with self.lock:
            if self.bar is not None and self.epoch != epoch:
                self._close()
            if self.bar is None:
                # A terminal that reports a 0 x 0 size (some ptys) gets no bar from tqdm.
                size = shutil.get_terminal_size((100, 20))
                self.bar = tqdm(total=steps, initial=step, desc=desc, unit="step",
                                postfix=post, leave=False, mininterval=0,
                                file=self.file or sys.stdout, ncols=size.columns,
                                nrows=size.lines)
                self.epoch = epoch
            self.bar.set_postfix_str(post, refresh=False)
            self.bar.update(max(0, step - self.bar.n))

    def around(self, write: Callable[[], None]) -> None:
        """Run ``write`` (other output) with the bar cleared, then draw the bar again."""
        with self.lock:
            if self.bar is None:
                write()
                return
            self.bar.clear()
            try:
                write()
            finally:
                self.bar.refresh()

    def close(self) -> None:
        """Erase the bar (the next event starts a new one)."""
        with self.lock:
            self._close()

    def _close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar, self.epoch = None, None


BAR = LiveBar()


__all__ = ["BAR", "CHATTER", "HARMLESS", "HARMLESS_ACTORS", "LIVE_EVERY_S", "LIVE_TAG",
           "OWN_PREFIX", "VERBOSE_ENV", "LiveBar", "after_ray_init", "before_ray_init", "duration",
           "epoch_line", "filter_lines", "harmless", "hidden_counts", "live", "progress_event",
           "progress_line", "say", "set_verbose", "verbose"]
