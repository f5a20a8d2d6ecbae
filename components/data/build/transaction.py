"""Where a build runs and what a failure leaves behind. :func:`run` is the entry point: the
refusal of a non-empty output folder that is not simgraph's (no manifest of its format, no swap
journal, no ``.simgraph-owner.json`` of a build killed before its manifest:
:func:`components.io.storage.claim_dir`, before anything is written), the output's lock (one
preprocess per dir, naming its holder, :func:`_exclusive`), the refusal of an output holding a
dataset built with other parameters, the in-place (resumable) build, the ``--overwrite`` build
staged in ``.next/`` (:func:`_open_stage`) and swapped in with a journal (``.swap.json``) once
it verifies (:func:`_swap`), the recovery of a swap a killed run left half done
(:func:`_recover_swap`), and URI outputs (:func:`_run_uri`: built in a local cache dir,
compared with the remote manifest, uploaded manifest last). The swap's on-disk states: the
comment above :func:`_move`."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from components.config import PreprocessConfig
from components.data.build.common import PreprocessError, _digest, _read_json
from components.data.build.driver import _build
from components.data.build.listing import list_items
from components.data.build.manifest import _cleanup, _verified_manifest
from components.data.build.planning import _params
from components.data.build.source_record import SOURCE_FILE, SourceRecord, check_unchanged
from components.data.build.timing import BuildTimes
from components.data.shards import MANIFEST
from components.data.splits import SPLITS
from components.io.files import remove_temporaries, sha256_file, write_json


def run(cfg: PreprocessConfig, overwrite: bool = False, echo: bool = True) -> dict[str, Any]:
    """Build (or finish building) the dataset dir ``cfg.output``; return the manifest.

    Without ``overwrite`` the build resumes in place, and an output holding a dataset built
    with other parameters is refused (:class:`PreprocessError` naming ``--overwrite``). With
    ``overwrite`` the new dataset is built beside the current one (in ``<output>/.next/``) and
    swapped in only once it is complete and its split files verify: a build that fails, is
    killed or was given a mistyped source leaves the current dataset as it was
    (:func:`_swap`, the package docstring).

    A URI output (``s3://…``, ``gs://…``) is checked against the manifest already there, built
    in a local dir under the staging cache (resumable like any other) and then uploaded: the
    split files and class files first, ``manifest.json`` last, so readers never see a manifest
    whose files are missing (:func:`_run_uri`).

    Raises:
        PreprocessError: the source cannot be listed or gives nothing usable, another preprocess
            holds the output, the output holds a dataset built with other parameters (and
            ``overwrite`` is off), or an upload fails.
    """
    from components.io import storage
    from components.io.paths import resolve_path

    if storage.is_uri(cfg.output):
        return _run_uri(cfg, overwrite, echo)
    out = Path(resolve_path(cfg.output))
    # A folder of someone else's files is refused before anything is written to it: the build
    # would replace files with its names (classes.json, ...), and --overwrite delete them.
    storage.claim_dir(out, "dataset", _is_dataset_dir, error=PreprocessError,
                      command="preprocess", fix=_CLAIM_FIX)
    manifest = _run_local(cfg, out, overwrite, echo)
    storage.release_dir(out)  # its manifest says it is a dataset dir from now on
    return manifest


_CLAIM_FIX = "give output= a new or empty folder"


def _is_dataset_dir(path: str, names: Sequence[str]) -> bool:
    """Whether the dir ``path`` (whose entries are ``names``) holds simgraph's dataset: a
    manifest of its format, or a swap journal (a killed ``--overwrite`` swap, whose manifest
    may be aside for the moment)."""
    from components.data.shards import FORMAT
    from components.io import storage

    for name, key, want in ((MANIFEST, "format", FORMAT), (SWAP_JOURNAL, "new", None)):
        if name not in names:
            continue
        if not storage.is_uri(path):
            data = _read_json(Path(path) / name)  # a JSON list there: one line naming it
        else:
            try:
                data = json.loads(storage.read_text(storage.join(path, name)))
            except (storage.StorageError, ValueError, UnicodeDecodeError):
                continue
        if isinstance(data, dict) and key in data and (want is None or data[key] == want):
            return True
    return False


def _run_local(cfg: PreprocessConfig, out: Path, overwrite: bool,
               echo: bool) -> dict[str, Any]:
    """:func:`run` into the local dir ``out`` (the user's output, or a URI output's build
    cache), under its lock."""
    params = _params(cfg)
    params_digest = _digest(params)
    out.mkdir(parents=True, exist_ok=True)  # for the lock file; nothing else before the lock
    with _exclusive(out):
        return _run_locked(cfg, out, params, params_digest, overwrite, echo)


# Entries of a dataset dir that a build writes (and an --overwrite replaces); anything else in
# the dir (``inspect/``, a user's notes) is left alone.
OWNED = ("shards", MANIFEST, "caption_embeddings.npy", "caption_embeddings.json",
         "captions.npz",  # the embeddings' file before 2026-11-27 (replaced when found)
         "classes.json", "class_embeddings.npy",
         "class_similarity.npy", "captions.json", "caption_index.npy", "content.npz",
         SOURCE_FILE,
         *(f"{s}.beton" for s in SPLITS))
NEXT = ".next"  # an --overwrite build in progress (same filesystem: renames are atomic)
PREVIOUS = ".previous"  # the replaced dataset's entries while a swap runs
SWAP_JOURNAL = ".swap.json"  # present exactly while a swap runs (see _swap)
STAGE_MARK = ".staging.json"  # in NEXT: {"params_digest": the parameters it is built with}


def _run_uri(cfg: PreprocessConfig, overwrite: bool, echo: bool) -> dict[str, Any]:
    """:func:`run` for a URI output.

    The remote ``manifest.json`` decides whether the output holds a dataset built with other
    parameters (the local build dir is only this host's cache: it may be missing, or stale
    after another host replaced the remote dataset). A remote dataset is replaced only after
    the local build is complete: its manifest is deleted first (readers then see no dataset
    rather than a manifest naming files being replaced), the files are uploaded, the new
    manifest last, then the old dataset's files the new one does not have are deleted.
    """
    from components.data.staging import default_cache_dir
    from components.io import storage

    uri = cfg.output
    params_digest = _digest(_params(cfg))
    remote = _remote_manifest(uri)
    # No lock on an object store (docs/reliability.md): the remote dir is only refused when it
    # holds files that are not simgraph's; two builds uploading at once are not detected.
    storage.claim_dir(uri, "dataset", _is_dataset_dir, error=PreprocessError,
                      command="preprocess", fix=_CLAIM_FIX)
    if remote is not None and remote.get("params_digest") != params_digest and not overwrite:
        raise PreprocessError(
            f"{storage.display(uri)} holds a dataset built with other parameters"
            f"{_differ(remote, _params(cfg))}; choose another output or pass --overwrite to "
            "rebuild it"
        )
    local = default_cache_dir() / "build" / hashlib.sha256(uri.encode()).hexdigest()[:16]
    cached = _read_json(local / MANIFEST)
    # The cache holding other parameters than asked for is not the user's dataset (the remote
    # one, checked above, is): rebuild it (beside it, swapped in when complete).
    stale = isinstance(cached, dict) and cached.get("params_digest") != params_digest
    manifest = _run_local(dataclasses.replace(cfg, output=str(local)), local,
                          overwrite or stale, echo)
    try:
        names = [n for n in sorted(os.listdir(local))
                 if n not in (MANIFEST, "shards") and not n.startswith(".")
                 and (local / n).is_file()]
        if remote is not None and _canonical(remote) != _canonical(manifest):
            _delete_remote(storage.join(uri, MANIFEST))
        for name in names:
            storage.upload_file(local / name, storage.join(uri, name))
        if cfg.keep_shards:
            storage.upload_dir(local / "shards", storage.join(uri, "shards"))
        storage.upload_file(local / MANIFEST, storage.join(uri, MANIFEST))
        storage.release_dir(uri)
        # Files of a dataset this one replaced (or of an upload that stopped half-way) that
        # the new manifest does not name: a split file it lacks, shards it did not keep.
        sent = {*names, MANIFEST, *(("shards",) if cfg.keep_shards else ())}
        for name in sorted(set(OWNED) & set(storage.list_dir(uri)) - sent):
            stale_path = storage.join(uri, name)
            if storage.is_dir(stale_path):
                storage.delete_dir(stale_path)
            else:
                _delete_remote(stale_path)
    except storage.StorageError as e:
        raise PreprocessError(f"built {local} but cannot upload it: {e}; re-run to upload "
                              "it again") from None
    if echo:
        print(f"uploaded to {storage.display(uri)}")
    return manifest


def _remote_manifest(uri: str) -> dict[str, Any] | None:
    """The manifest at the URI dataset dir ``uri``; ``None`` when there is none (or it is not
    JSON, as a local manifest that does not parse counts as none).

    Raises:
        PreprocessError: the URI cannot be read (no bucket, no credentials, ...).
    """
    from components.io import storage

    try:
        text = storage.read_text(storage.join(uri, MANIFEST))
    except storage.StorageNotFoundError:
        return None
    except storage.StorageError as e:
        raise PreprocessError(f"cannot check what {storage.display(uri)} holds: {e}") from None
    try:
        m = json.loads(text)
    except ValueError:
        return None
    return m if isinstance(m, dict) else None


def _canonical(manifest: dict[str, Any]) -> str:
    """``manifest`` as comparable text (a dict read back from JSON has lists for tuples)."""
    return json.dumps(manifest, sort_keys=True, default=str)


def _delete_remote(path: str) -> None:
    """Delete one object (nothing happens if it is not there); errors as ``StorageError``."""
    from components.io import storage

    fs, p = storage.resolve(path)
    try:
        fs.delete_file(p)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise storage.StorageError(f"cannot delete {storage.display(path)}: {e}") from None


@contextlib.contextmanager
def _exclusive(out: Path) -> Iterator[None]:
    """One preprocess per output dir at a time (two would overwrite each other's shards):
    ``out/.lock`` names its holder (:func:`components.io.files.holding`); a second one is refused
    naming it, a dead holder's lock taken over."""
    from components.io.files import LockHeld, holding

    try:
        with holding(out / ".lock", f"the dataset dir {out}",
                     refusal="another simgraph preprocess is writing it; wait for it or "
                             "stop it"):
            yield
    except LockHeld as e:
        raise PreprocessError(str(e)) from None


def _differ(manifest: dict[str, Any], params: dict[str, Any], named: int = 4) -> str:
    """`` (key: old -> new, ...)``: the build parameters a dataset's ``manifest`` was made
    with that ``params`` change (dotted keys), for the refusal that names ``--overwrite``;
    empty when the manifest does not record them."""
    old = manifest.get("params")
    if not isinstance(old, dict):
        return ""

    def flat(d: dict[str, Any], at: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(flat(v, f"{at}{k}.") if isinstance(v, dict) else {f"{at}{k}": v})
        return out

    a, b = flat(old), flat(params)
    keys = sorted(k for k in a.keys() | b.keys() if a.get(k, "?") != b.get(k, "?"))
    if not keys:
        return ""
    shown = [f"{k}: {a.get(k, '(unset)')!r} -> {b.get(k, '(unset)')!r}" for k in keys[:named]]
    more = f", and {len(keys) - named} more" if len(keys) > named else ""
    return f" ({', '.join(shown)}{more})"


def _run_locked(
    cfg: PreprocessConfig, out: Path, params: dict[str, Any], params_digest: str,
    overwrite: bool, echo: bool,
) -> dict[str, Any]:
    """:func:`run` under the output's lock: finish or undo an interrupted swap, then build in
    place (resume) or, with ``overwrite``, in ``out/.next`` and swap it in."""
    _recover_swap(out, echo)
    stage = out / NEXT
    for d in (out, out / "shards", stage, stage / "shards"):
        remove_temporaries(d)  # left by a killed run; under the lock nobody else writes
    if not overwrite:
        old = _read_json(out / MANIFEST)
        if old and old.get("params_digest") != params_digest:
            raise PreprocessError(
                f"{out} holds a dataset built with other parameters{_differ(old, params)}; "
                "choose another output or pass --overwrite to rebuild it"
            )
        done_manifest = _verified_manifest(out, params_digest)
        if done_manifest is not None:
            note = _complete_for_source(cfg, out, done_manifest)
            _cleanup(out, cfg, done_manifest)
            if echo:
                print(f"simgraph preprocess: {out} is already complete and verified{note}")
            return done_manifest
        times = BuildTimes()
        with times.stage("listing"):
            listed = list_items(cfg, spill=out)
        with times.stage("source_record"):
            record = SourceRecord.of(listed)
        (out / "shards").mkdir(exist_ok=True)
        return _build(cfg, out, params, params_digest, listed, record, echo, out, times)

    # List first: a mistyped source fails here, before the staging dir (which may hold a
    # resumable build with the right source) or the dataset is touched.
    times = BuildTimes()
    with times.stage("listing"):
        listed = list_items(cfg, spill=out)
    with times.stage("source_record"):
        record = SourceRecord.of(listed)
    manifest = _verified_manifest(stage, params_digest)
    if manifest is not None and _source_digest(manifest) != record.digest():
        # Complete, but from the source as it was when it was built (a run killed before
        # the swap, the source changed since): built again, from the source as it is now.
        if echo:
            print(f"simgraph preprocess: the complete build in {stage} was made from another "
                  "version of the source; building it again")
        _remove(stage)
        manifest = None
    if manifest is None:
        _open_stage(stage, params_digest, echo)
        _build(cfg, stage, params, params_digest, listed, record, echo, out, times)
        manifest = _verified_manifest(stage, params_digest)
        if manifest is None:
            raise PreprocessError(
                f"the new build in {stage} does not verify (a split file differs from its "
                f"manifest); {out} is unchanged; re-run with --overwrite to rebuild it")
    elif echo:
        print(f"simgraph preprocess: {stage} is complete and verified")
    _swap(out)
    if echo:
        print(f"simgraph preprocess: swapped the new build into {out}")
    return manifest


def _source_digest(manifest: dict[str, Any]) -> str | None:
    source = manifest.get("source")
    return source.get("digest") if isinstance(source, dict) else None


def _complete_for_source(cfg: PreprocessConfig, out: Path, manifest: dict[str, Any]) -> str:
    """Check the complete dataset in ``out`` against its source listed again; return a note
    for the "already complete" line when the source could not be compared (it cannot be
    listed here — a dataset copied without it — or the dataset predates source records).

    Raises:
        PreprocessError: the source changed since the build, naming what changed and the fix
            (:func:`~components.data.build.source_record.check_unchanged`).
    """
    try:
        listed = list_items(cfg, spill=out)
    except PreprocessError as e:
        # The dataset is whole without its source (its files verified above): usable, but
        # not known to match a source that is not here.
        return f" (its source was not compared: {e})"
    if not check_unchanged(out, manifest, SourceRecord.of(listed)):
        return (" (built before simgraph recorded its source: not compared with it; "
                "--overwrite rebuilds it)")
    return " (its source is unchanged)"


def _open_stage(stage: Path, params_digest: str, echo: bool) -> None:
    """Make ``stage`` ready for a build with ``params_digest``: one built (or half built) with
    other parameters, or without a mark saying which, is deleted; one with the same
    parameters is kept, so its finished shards are reused (resume)."""
    mark = _read_json(stage / STAGE_MARK)
    resume = isinstance(mark, dict) and mark.get("params_digest") == params_digest
    if not resume:
        _remove(stage)
    elif echo:
        print(f"simgraph preprocess: resuming the --overwrite build in {stage}")
    (stage / "shards").mkdir(parents=True, exist_ok=True)
    if not resume:  # the mark goes last: a stage without one is deleted as unknown
        write_json(stage / STAGE_MARK, {"params_digest": params_digest})


# ---------------------------------------------------------------------------------------------
# The swap of an --overwrite build into the dataset dir.
#
# On disk while it runs (all under the output's lock, all renames within one filesystem):
#
#   out/.swap.json   {"params_digest": the new build's, "new": [entries of .next to move in],
#                     "old": [entries of out to move aside]}; written (atomically) before the
#                     first rename, deleted after the last: its presence means "swap running".
#   phase 1          old entries out/<name> -> out/.previous/<name>, manifest.json first (a
#                    reader then finds no manifest, never one naming files being moved);
#   phase 2          new entries out/.next/<name> -> out/<name>, manifest.json last;
#   done             .swap.json deleted, then .previous/ and the rest of .next/ (its mark).
#
# Phase 2 starts only after phase 1 has moved every old entry, so for a journal's name:
# .previous/<name> absent -> out/<name> (if any) is the old entry; .next/<name> present -> the
# new entry has not moved; .next/<name> absent and (.previous/<name> present or <name> not
# old) -> out/<name> is the new entry. _recover_swap reads the state back from these rules.


def _move(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst`` (the one step of a swap; tests inject faults here)."""
    os.rename(src, dst)


def _fsync_dir(path: Path) -> None:
    """Make the renames in ``path`` durable (best effort: not every filesystem allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _manifest_first(names: Sequence[str]) -> list[str]:
    return sorted(names, key=lambda n: (n != MANIFEST, n))


def _manifest_last(names: Sequence[str]) -> list[str]:
    return sorted(names, key=lambda n: (n == MANIFEST, n))


def _swap(out: Path) -> None:
    """Swap the complete, verified build in ``out/.next`` into ``out`` (the layout above);
    the replaced entries are deleted. Call under the output's lock. Killed at any point, the
    next :func:`run` on ``out`` finishes it (:func:`_recover_swap`)."""
    stage = out / NEXT
    new = sorted(n for n in os.listdir(stage) if not n.startswith("."))
    old = sorted(n for n in set(OWNED) | set(new) if os.path.lexists(out / n))
    manifest = _read_json(stage / MANIFEST)
    if os.path.lexists(out / PREVIOUS):  # only a finished swap's leftovers (see _recover_swap)
        shutil.rmtree(out / PREVIOUS)
    journal = {"params_digest": manifest["params_digest"], "new": new, "old": old}
    write_json(out / SWAP_JOURNAL, journal)
    _fsync_dir(out)
    _complete_swap(out, journal)


def _complete_swap(out: Path, journal: dict[str, Any]) -> None:
    """Run (or finish) the two phases of the swap ``journal`` describes, then clean up."""
    stage, prev = out / NEXT, out / PREVIOUS
    prev.mkdir(exist_ok=True)
    for name in _manifest_first(journal["old"]):
        if not os.path.lexists(prev / name) and os.path.lexists(out / name):
            _move(out / name, prev / name)
    _fsync_dir(prev)
    _fsync_dir(out)
    for name in _manifest_last(journal["new"]):
        if os.path.lexists(stage / name):
            # Every old entry is aside by now: something here is not part of any dataset.
            _remove(out / name)
            _move(stage / name, out / name)
    _fsync_dir(out)
    _discard_swap(out)
    shutil.rmtree(stage, ignore_errors=True)  # its mark (and hidden temporaries) only


def _discard_swap(out: Path) -> None:
    """The end of a swap (or of its roll-back): the journal first, then the leftovers."""
    (out / SWAP_JOURNAL).unlink(missing_ok=True)
    _fsync_dir(out)
    shutil.rmtree(out / PREVIOUS, ignore_errors=True)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def _new_entry(out: Path, journal: dict[str, Any], name: str) -> Path | None:
    """Where the swap's new entry ``name`` is now (``.next/<name>`` or ``out/<name>``), or
    ``None`` when it is in neither (the rules above the swap functions)."""
    if os.path.lexists(out / NEXT / name):
        return out / NEXT / name
    moved_in = name not in journal["old"] or os.path.lexists(out / PREVIOUS / name)
    return out / name if moved_in and os.path.lexists(out / name) else None


def _swap_verified(out: Path, journal: dict[str, Any]) -> bool:
    """The swap's new dataset is whole: its manifest is complete with the journal's params
    digest, every new entry exists, and every split file's sha256 matches the manifest."""
    where = _new_entry(out, journal, MANIFEST)
    m = _read_json(where) if where is not None else None
    if (not isinstance(m, dict) or not m.get("complete")
            or m.get("params_digest") != journal.get("params_digest")):
        return False
    if any(_new_entry(out, journal, n) is None for n in journal["new"]):
        return False
    for split in m["splits"].values():
        if split["samples"]:
            f = _new_entry(out, journal, split["file"])
            if f is None or sha256_file(f) != split["sha256"]:
                return False
    return True


def _recover_swap(out: Path, echo: bool) -> None:
    """Under the output's lock, before anything else: finish a swap a killed run left half
    done when its new dataset verifies, else put the previous dataset back (the new entries
    go back to ``.next``, which a later ``--overwrite`` with the same parameters resumes).
    A ``.previous`` without a journal, and a ``.next`` holding nothing but its mark, are a
    finished swap's leftovers and are deleted.

    Raises:
        PreprocessError: ``.swap.json`` is there but is not a journal (it is written
            atomically, so something else wrote it): the message says what to compare.
    """
    journal = _read_json(out / SWAP_JOURNAL)
    if not isinstance(journal, dict):
        if os.path.lexists(out / SWAP_JOURNAL):  # written atomically: not ours, or damaged
            raise PreprocessError(
                f"{out / SWAP_JOURNAL} is not a swap journal; compare {out} with "
                f"{out / PREVIOUS} and {out / NEXT}, fix it by hand, then delete it")
        if os.path.lexists(out / PREVIOUS):
            shutil.rmtree(out / PREVIOUS)
        stage = out / NEXT
        if stage.is_dir() and all(n.startswith(".") for n in os.listdir(stage)):
            shutil.rmtree(stage)  # a finished swap's (its mark): nothing to resume
        return
    if _swap_verified(out, journal):
        _complete_swap(out, journal)
        if echo:
            print(f"simgraph preprocess: finished swapping the new build into {out} "
                  "(an earlier run was interrupted)")
        return
    stage, prev = out / NEXT, out / PREVIOUS
    stage.mkdir(exist_ok=True)
    for name in _manifest_first(journal["new"]):  # the new manifest leaves first
        where = _new_entry(out, journal, name)
        if where == out / name:
            _move(where, stage / name)
    _fsync_dir(out)
    if prev.is_dir():
        for name in _manifest_last(os.listdir(prev)):  # the old manifest comes back last
            if not os.path.lexists(out / name):
                _move(prev / name, out / name)
    _fsync_dir(out)
    _discard_swap(out)
    if echo:
        print(f"simgraph preprocess: an interrupted swap's new build in {stage} does not "
              f"verify; restored the previous dataset in {out}")
