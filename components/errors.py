"""One base for the errors simgraph raises on purpose, and how entry points report them.

Every error a user can act on (a bad config value, a missing dataset, a corrupted checkpoint,
a non-finite loss) is a :class:`SimgraphError` subclass defined next to the code that raises
it (``ConfigError`` in :mod:`components.config`, ``DatasetError`` in
:mod:`components.data.reader`, ...). Each also derives from the builtin it refines
(``ValueError`` for bad input, ``RuntimeError`` for a failed operation), so ``except
ValueError`` keeps working. Callers dispatch on the type, never on the message text:

* :func:`root_cause` finds the simgraph error inside what Ray hands back (a Train
  ``WorkerGroupError``'s ``worker_failures``, a task's ``RayTaskError.cause``, chained
  ``__cause__``);
* :func:`run_command` is the one ``main()`` wrapper: a config error exits 2, any other
  :class:`SimgraphError` exits 1, each as one line on stderr; anything else is a bug and keeps
  its traceback.

Messages are bounded: a value a user wrote is shown through :func:`clip` (its ``repr``, cut
to :data:`VALUE_LIMIT` characters, saying how long it was), and :func:`run_command` cuts any
message to :data:`MESSAGE_LIMIT` characters with :func:`bounded` (its start and its end, where
the fix is said, are kept).
"""

from __future__ import annotations

import re
import reprlib
import sys
from collections.abc import Callable

from components.redaction import redact

VALUE_LIMIT = 200  # characters of a value shown in a message
MESSAGE_LIMIT = 2000  # characters of one message line


def clip(value: object, limit: int = VALUE_LIMIT) -> str:
    """``repr(value)`` for a message, at most about ``limit`` characters: a longer one is cut
    and says how long the whole was (a string's length; a container's item count). Never
    builds the whole repr of a huge or deeply shared value (``reprlib``)."""
    r = reprlib.Repr()
    r.maxlevel, r.maxlist, r.maxtuple, r.maxdict, r.maxset = 3, 12, 12, 8, 12
    r.maxstring = r.maxother = r.maxlong = limit
    text = r.repr(value)
    size = ""
    if isinstance(value, str) and len(value) + 2 > limit:
        size = f" ({len(value)} characters)"
    elif isinstance(value, list | tuple | dict | set) and ("..." in text or len(text) > limit):
        size = f" ({len(value)} items)"
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text + size


def bounded(message: str, limit: int = MESSAGE_LIMIT) -> str:
    """``message`` cut to about ``limit`` characters: its first two thirds and its last third
    (where the fix is usually said), joined by ``[... N characters ...]``."""
    if len(message) <= limit:
        return message
    head, tail = (2 * limit) // 3, limit // 3
    return f"{message[:head]} [... {len(message) - head - tail} characters ...] {message[-tail:]}"


class SimgraphError(Exception):
    """Base of the errors simgraph raises for input or state the user can fix; the message
    says what is wrong and how to fix it. ``exit_code`` is what ``simgraph`` exits with."""

    exit_code = 1
    headline = ""  # printed before the message, e.g. "invalid config: "


class NonFiniteError(SimgraphError, ValueError):
    """NaN or inf where an objective needs finite numbers (its embeddings, captions or bank)."""


def _children(e: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    failures = getattr(e, "worker_failures", None)  # ray.train.WorkerGroupError: rank -> error
    if isinstance(failures, dict):
        out += [failures[r] for r in sorted(failures)]
    cause = getattr(e, "cause", None)  # ray.exceptions.RayTaskError: the task's own exception
    if isinstance(cause, BaseException):
        out.append(cause)
    for chained in (e.__cause__, e.__context__):
        if chained is not None:
            out.append(chained)
    return out


def root_cause(e: BaseException) -> BaseException:
    """The first :class:`SimgraphError` in ``e`` or what it wraps (breadth first, lowest rank
    first), else the innermost exception on the first path."""
    seen: set[int] = set()
    queue = [e]
    innermost = e
    while queue:
        x = queue.pop(0)
        if id(x) in seen:
            continue
        seen.add(id(x))
        # A RayTaskError(X) is also an X (Ray subclasses the cause); its message is Ray's
        # traceback header, so take the cause itself.
        if isinstance(x, SimgraphError) and not isinstance(getattr(x, "cause", None),
                                                           BaseException):
            return x
        kids = _children(x)
        if kids and x is innermost:
            innermost = kids[0]
        queue += kids
    return innermost


def describe(e: BaseException) -> str:
    """One line for a user about :func:`root_cause`: ``TypeName: message`` — the message's
    first line for a simgraph error, its last line otherwise (a Ray wrapper's text ends with the
    wrapped error's own ``Name: message`` line, which is kept as it is)."""
    cause = root_cause(e)
    lines = str(cause).strip().splitlines()
    # A Ray wrapper's message starts with its own headline; the error itself is on its last line.
    text = lines[0] if isinstance(cause, SimgraphError) or len(lines) < 2 else lines[-1]
    name = type(cause).__name__
    if not text:
        return name
    # A wrapper's last line already names the error ("KeyError: 'x'"): keep it as it is.
    return text if re.match(r"^[\w.]*(Error|Exception)\b", text) else f"{name}: {text}"


INTERRUPTED = 130  # the shell's code for a process ended by SIGINT
TERMINATED = 143  # ... and by SIGTERM


class Terminated(BaseException):  # noqa: N818 (a stop request, not an error)
    """SIGTERM (``kill``, a service stop, a batch scheduler's preemption) as an exception in
    the main thread (:func:`stop_on_sigterm`): unwound like Ctrl-C, so what was complete stays
    and the command ends with one line, not Ray's native crash dump."""


def stop_on_sigterm() -> None:
    """Make SIGTERM raise :class:`Terminated` in the main thread. Called before a command's
    body and again after ``ray.init`` (Ray's core worker installs a native SIGTERM handler
    that dumps stacks and aborts: exit 134); a no-op off the main thread."""
    import signal
    import threading

    def terminated(signum: int, frame: object) -> None:
        raise Terminated()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, terminated)


def run_command(command: str, body: Callable[[], object]) -> int:
    """Run a ``simgraph <command>`` body; returns its exit code. A :class:`SimgraphError`
    becomes one ``simgraph <command>: ...`` line on stderr and its ``exit_code`` (2 for config
    errors, 1 otherwise); Ctrl-C one line and :data:`INTERRUPTED`; any other exception is a
    bug and keeps its traceback. SIGTERM: one line and :data:`TERMINATED`
    (:func:`stop_on_sigterm`).

    Example::

        def main(config: str) -> int:
            return run_command("pretrain", lambda: run(load_config(config, PretrainConfig)))
    """
    stop_on_sigterm()
    try:
        body()
    except SimgraphError as e:
        # never a URI's credentials, whoever wrote it
        print(bounded(redact(f"simgraph {command}: {e.headline}{e}")), file=sys.stderr)
        return e.exit_code
    except (KeyboardInterrupt, Terminated) as e:  # the user's choice, not a bug: no traceback
        how, code = (("terminated (SIGTERM)", TERMINATED) if isinstance(e, Terminated)
                     else ("interrupted (Ctrl-C)", INTERRUPTED))
        print(f"simgraph {command}: {how}; what was complete stays (the same command resumes "
              "runs, builds and sweeps)", file=sys.stderr)
        return code
    return 0
