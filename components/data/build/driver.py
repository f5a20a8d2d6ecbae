"""Steps 2–5 of one build, in order, into one dir (:func:`_build`): hash, plan, embed the
captions, write the shards still missing, merge, write the manifest, reusing every shard whose
sidecar matches the plan. Which dir (the dataset dir, or ``.next/`` for ``--overwrite``) and
under which lock is :mod:`~components.data.build.transaction`'s.

Each stage's wall seconds go into the manifest's ``build_seconds``
(:class:`~components.data.build.timing.BuildTimes`; the table under ``--verbose``).

The stages' functions are looked up here, in this module's namespace: a test replaces one
(``monkeypatch.setattr(driver, "merge_splits", ...)``) here."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Any

from components.config import PreprocessConfig
from components.data import captions as cap
from components.data.build.common import PreprocessError, _digest
from components.data.build.embedding import (
    _stored_dim,
    caption_files,
    embed_captions,
    write_class_files,
)
from components.data.build.hashing import dedupe_enabled, hash_with_ray
from components.data.build.listing import Listed
from components.data.build.manifest import _assemble, _cleanup, summary
from components.data.build.merging import merge_splits
from components.data.build.placement import decide
from components.data.build.planning import plan
from components.data.build.source_record import SourceRecord, name_some
from components.data.build.tasks import map_tasks
from components.data.build.timing import BuildTimes
from components.data.build.writing import ShardSettings, _shard_done, shard_specs, write_shard
from components.data.caption_backend import AUTO, choose, reference_or
from components.runtime import console
from components.runtime.session import ray_session


def _check_source_held_still(record: SourceRecord, listed: Listed) -> None:
    """The source's files as the listing found them, checked again once every shard is
    written: a file rewritten meanwhile (a sync, a writer still at work) may have been hashed
    as one version and decoded as another, or read at offsets that moved (a tar shard).

    Raises:
        PreprocessError: naming the changed files; no manifest is written, and the re-run
            lists the source anew and rebuilds the shards those files touched.
    """
    changed = record.changed_files(listed)
    if changed:
        raise PreprocessError(
            f"the source changed while the build read it: {len(changed)} file(s) differ from "
            f"their listing ({name_some(changed)}); the shards made from them may hold old and new "
            "content, so the dataset is not marked complete: re-run `simgraph preprocess` "
            "once the source holds still (the shards of unchanged files are reused)")


def _build(
    cfg: PreprocessConfig, out: Path, params: dict[str, Any], params_digest: str,
    listed: Listed, record: SourceRecord, echo: bool, dest: Path,
    times: BuildTimes | None = None,
) -> dict[str, Any]:
    """Steps 2–5 into ``out`` (the dataset dir, or its ``.next`` staging dir for ``dest``),
    reusing the shards already there that match the plan; the manifest is written last.
    ``record``: ``listed`` with each item's file metadata (:class:`SourceRecord`, made once by
    the caller: the content cache, the shard digests and ``source.json.gz`` all read it).
    ``times``: the build's clock, holding the caller's stages (listing, source record); each
    stage here is added and the whole goes into the manifest's ``build_seconds``."""

    times = times if times is not None else BuildTimes()

    if echo:
        where = f"{dest}" if out == dest else f"{dest} (building in {out})"
        print(f"simgraph preprocess: listed {len(listed)} items from {cfg.source.kind} "
              f"source -> {where}", flush=True)
    with contextlib.ExitStack() as session:
        with times.stage("ray"):
            session.enter_context(ray_session(cfg.num_cpus))
            # which nodes see the build dir and the source (a cluster's; placement.py)
            placement = decide(out, listed.paths, echo)
        content = None
        if len(listed) and dedupe_enabled(cfg):
            t0 = time.perf_counter()
            with times.stage("hashing"):
                content = hash_with_ray(cfg, listed.paths, out, record.stat_at, placement)
            if echo:
                print(f"simgraph preprocess: hashed {len(listed)} items "
                      f"in {time.perf_counter() - t0:.1f} s")
        with times.stage("planning"):
            p = plan(cfg, listed, content, times, placement)
            del content  # ~90 B an item (digests, pHashes, skip reasons), not needed past the plan
            classes, texts = p.classes, p.texts
            digests = {}
            for k, name in enumerate(p.shard_names):
                # Field lists as dataclasses.astuple gives a Planned's (same digest), one
                # shard's at a time; each item's file metadata too: a shard of a killed build
                # is reused only while the files it was decoded from are unchanged.
                ids = p.sample_ids[p.shard(k)].tolist()
                digests[name] = _digest([params_digest, p.shard_fields(k),
                                         [record.stat_at(i) for i in ids]])
            done = {n: s for n in p.shard_names
                    if (s := _shard_done(out, n, digests[n])) is not None}
        todo = [k for k, n in enumerate(p.shard_names) if n not in done]
        n_todo = sum(p.shard(k).stop - p.shard(k).start for k in todo)
        if echo:
            print(f"simgraph preprocess: {len(p)} items in {len(p.shard_names)} shards "
                  f"({len(done)} already complete), {len(texts)} unique captions")

        with times.stage("captions"):
            model, choice = None, None
            if cfg.captions.enabled:
                # auto: the class embeddings come from the reference, which also checks the
                # faster backends on this build's captions (components/data/caption_backend.py)
                model = cap.load_encoder(cfg.captions.model,
                                         backend=reference_or(cfg.captions.backend))
                if cfg.captions.backend == AUTO and todo:
                    choice = choose(cfg.captions.model, texts, model,
                                    gpu=placement.gpus() > 0)
                    cfg = dataclasses.replace(cfg, captions=dataclasses.replace(
                        cfg.captions, backend=choice.backend))
                    if echo:
                        print(f"simgraph preprocess: captions.backend auto -> "
                              f"{choice.backend}: {choice.reason}", flush=True)
            class_files = write_class_files(cfg, classes, out, model)
            checks: dict[str, Any] | None = None
            if model is not None:
                checks, files = caption_files(cfg, p, out, model)
                class_files.update(files)
            t0 = time.perf_counter()
            table = (embed_captions(cfg, texts, out, dim=cap.embedding_dim(model),
                                   placement=placement)
                     if model is not None and todo else None)
            if echo and table is not None:
                took = time.perf_counter() - t0
                print(f"simgraph preprocess: {table.rows} caption embeddings in {took:.1f} s "
                      f"({len(texts) / max(took, 1e-9):.0f}/s, reused when cached)", flush=True)
        t0 = time.perf_counter()
        with times.stage("shards"):
            if todo:
                specs = shard_specs(p, todo)
                # one shard per task: no shuffle, each task writes what it read
                map_tasks(write_shard, specs, placement=placement, settings=ShardSettings(
                    out_dir=str(out), captions=table,
                    digests=digests, image=dataclasses.asdict(cfg.image),
                    caption_dtype=cfg.captions.dtype, bad_input=cfg.bad_input))
                if echo:
                    took = time.perf_counter() - t0
                    print(f"simgraph preprocess: decoded and wrote {n_todo} images in "
                          f"{len(specs)} shards in {took:.1f} s "
                          f"({n_todo / max(took, 1e-9):.0f} images/s)", flush=True)
            sides = dict(done)
            for name in (p.shard_names[k] for k in todo):
                # Just written: the task hashed the file it renamed; the merge verifies it
                # again.
                side = _shard_done(out, name, digests[name], verify=False)
                if side is None:
                    raise PreprocessError(f"shard {name} did not complete; re-run to continue")
                sides[name] = side
        t0 = time.perf_counter()
        with times.stage("merge"):
            merged = merge_splits(out, sides, placement)
        if echo:
            print(f"simgraph preprocess: merged {len(sides)} shards into "
                  f"{len(merged)} split files in {time.perf_counter() - t0:.1f} s", flush=True)
        dim = table.dim if table is not None else _stored_dim(out)
        stopping = time.perf_counter()
    times.add("ray", time.perf_counter() - stopping)  # a local Ray's shutdown

    with times.stage("source_record"):
        _check_source_held_still(record, listed)
        record.write(out)  # before the manifest that names its digest
    manifest = _assemble(cfg, out, params, params_digest, p, sides, merged, class_files, dim,
                         checks, None if choice is None else choice.as_dict(),
                         source=record.summary(), times=times)
    _cleanup(out, cfg, manifest)
    if echo:
        if console.verbose():
            print(f"simgraph preprocess: {times.line()}")
        print(summary(manifest))
    return manifest
