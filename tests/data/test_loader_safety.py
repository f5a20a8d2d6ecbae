"""No FFCV loader can hang its consumer, devices are always indexed and follow the resources a
stage was given, and a batch of one image keeps its batch dimension (issue 40, defects 1, 2).

The loader-thread tests use the real ``torch.cuda.set_device``: on this CPU-only machine it
raises inside FFCV's thread exactly as it does on a GPU machine for ``torch.device("cuda")``
(no index), which is what left ``simgraph evaluate`` / ``embed`` / a sweep's confirmation
waiting forever on FFCV's output queue. Every consumer here runs in a helper thread joined
with a deadline, so a regression fails the test instead of hanging the suite.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from components.config import AugmentConfig
from components.data.devices import resolve_device
from components.data.loader_thread import STALL_TIMEOUT_ENV
from components.data.reader import ViewLoader
from components.data.reader_errors import LoaderError, LoaderStalledError, ReaderSettingError
from components.data.shards import page_size_for, write_shard

AUG = AugmentConfig(resolution=8, jitter_p=0.0, grayscale_p=0.0, blur_p=0.0)
FIRST_ID = 1000


pytestmark = pytest.mark.usefixtures("no_jit")


class _Betons:
    """Split files of n images each (label ``i % 3``, sample id ``FIRST_ID + i``), written
    once per n."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files: dict[int, Path] = {}

    def __call__(self, n: int) -> Path:
        if n not in self.files:
            rng = np.random.default_rng(n)
            path = self.root / f"n{n}.beton"
            write_shard(path, [rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
                               for _ in range(n)],
                        np.arange(n) % 3, np.arange(n) + FIRST_ID,
                        rng.standard_normal((n, 4)).astype(np.float16), write_mode="raw",
                        jpeg_quality=90, page_size=page_size_for(8, 8))
            self.files[n] = path
        return self.files[n]


@pytest.fixture(scope="module")
def betons(tmp_path_factory: pytest.TempPathFactory) -> _Betons:
    return _Betons(tmp_path_factory.mktemp("betons"))


def _drain(it: Any, within: float) -> tuple[list[Any], BaseException | None, float]:
    """Consume ``it`` in a helper thread: (items, the error it raised, seconds). Fails the test
    when the consumer is still waiting after ``within`` seconds (a hang)."""
    got: list[Any] = []
    error: list[BaseException] = []

    def consume() -> None:
        try:
            for x in it:
                got.append(x)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            error.append(e)

    t = threading.Thread(target=consume, daemon=True)
    start = time.monotonic()
    t.start()
    t.join(within)
    assert not t.is_alive(), f"the loader's consumer still waits after {within} s: a hang"
    return got, (error[0] if error else None), time.monotonic() - start


# ---------------------------------------------------------------------------------------------
# Defect 2: a batch of one image.


def _split_sizes(batch: int, world: int) -> list[int]:
    """Every split size up to two batches per rank where some rank's share leaves exactly one
    image after its last full batch (share ≡ 1 mod batch)."""
    shares = [1, batch + 1, 2 * batch + 1]
    if world == 1:
        return shares
    return sorted({n for s in shares[:2] for n in (world * s - 1, world * s, world * s + 1)
                   if n >= world})


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("batch", [1, 3, 4])
@pytest.mark.parametrize("mode", ["eval", "train", "train-keep-last"])
def test_a_batch_of_one_image_keeps_its_batch_dimension(betons: _Betons, mode: str, batch: int,
                                                         world: int) -> None:
    """Labels and sample ids are ``[B]`` for every batch, B = 1 included, on every rank of
    train and evaluation loaders, and every image is read once (``torch.cat`` of the labels
    is what feature extraction does)."""
    for n in _split_sizes(batch, world):
        seen: list[int] = []
        for rank in range(world):
            loader = ViewLoader(betons(n), batch_size=batch, views=1 if mode == "eval" else 2,
                                augment=AUG, train=mode != "eval", rank=rank, world_size=world,
                                num_workers=1, seed=1,
                                drop_last=False if mode == "train-keep-last" else None)
            batches, error, _ = _drain(loader, 60)
            assert error is None, f"n={n} rank {rank}: {error!r}"
            for b in batches:
                size = b.images.shape[0]
                assert b.labels.shape == (size,), (n, rank, tuple(b.labels.shape))
                assert b.sample_ids.shape == (size,), (n, rank, tuple(b.sample_ids.shape))
                assert b.labels.dtype == b.sample_ids.dtype == torch.int64
                if mode == "train":  # drop_last: full batches only
                    assert size == batch
            if batches:
                labels = torch.cat([b.labels for b in batches])
                ids = torch.cat([b.sample_ids for b in batches])
                assert torch.equal(labels, (ids - FIRST_ID) % 3)
                seen += ids.tolist()
        if mode == "train":
            assert len(seen) == len(set(seen)) == n // (world * batch) * world * batch
        else:  # every image exactly once, the lone last one included
            assert sorted(seen) == list(range(FIRST_ID, FIRST_ID + n)), (n, sorted(seen))


def test_evaluation_and_embedding_of_splits_with_a_lone_last_image(tmp_path: Path) -> None:
    """The user-visible crash: kNN scoring (the sweep's confirmation rule) and ``embed`` of
    splits of 33 images with batch 16 (2 full batches + 1 image) ran into ``torch.cat`` /
    ``np.concatenate`` of a 0-d label tensor."""
    from components.export.embed import embed_dataset
    from components.runs.run_dir import load_run
    from components.runs.scoring import split_knn_hits
    from tests.support.datasets import run_with_checkpoint, synthetic_dataset

    ds = synthetic_dataset(tmp_path / "ds", classes=3, train_per_class=11, val_per_class=11)
    run = run_with_checkpoint(ds, tmp_path / "runs", "lone")  # data.batch_size 16
    hits = split_knn_hits(str(run), "val", device="cpu", jit=False)
    assert hits.shape == (33,)
    loaded = load_run(str(run))
    cfg = loaded.config
    e = embed_dataset(loaded.encoder(), ds, cfg.data.augment, split="val",
                      batch_size=16, num_workers=1, device=torch.device("cpu"), jit=False)
    ids = np.asarray(e.sample_ids).tolist()
    assert len(e) == len(ids) == len(set(ids)) == 33


# ---------------------------------------------------------------------------------------------
# Defect 1 (b): no loader can hang its consumer.


@pytest.mark.parametrize("thread_device", [
    "cuda",  # raises on every machine: no index
    pytest.param("cuda:0", marks=pytest.mark.skipif(torch.cuda.is_available(),
                                                    reason="cuda:0 is a real device here")),
])
def test_a_failing_loader_thread_raises_in_the_consumer(betons: _Betons,
                                                         thread_device: str) -> None:
    """FFCV's thread calls the real ``torch.cuda.set_device``; what it raises reaches the
    consumer as a :class:`LoaderError` naming the split file, with the thread's traceback
    text, within seconds (it used to leave the consumer waiting forever)."""
    path = betons(7)
    loader = ViewLoader(path, batch_size=3, train=False, augment=AUG, num_workers=1)
    # The thread's device as a CUDA reader sets it (ViewLoader refuses an unindexed device
    # itself, see below: this is the thread's own failure path).
    loader.loader.thread_device = torch.device(thread_device)
    batches, error, seconds = _drain(loader, 60)
    assert batches == [] and isinstance(error, LoaderError), repr(error)
    text = str(error)
    assert str(path) in text and "set_device" in text and "Traceback" in text, text
    want = "specified index" if thread_device == "cuda" else "NVIDIA driver"
    assert want in text, text
    assert isinstance(error.__cause__, (ValueError, RuntimeError))
    assert seconds < 30


def test_a_failure_mid_epoch_raises_after_the_good_batches(betons: _Betons,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    loader = ViewLoader(betons(10), batch_size=3, train=False, augment=AUG, num_workers=1)
    iterator = type(loader.loader).iterator_class
    real = iterator.run_pipeline

    def fail_third(self: Any, b_ix: int, *args: Any) -> Any:
        if b_ix == 2:
            raise OSError("disk went away while decoding batch 2")
        return real(self, b_ix, *args)

    monkeypatch.setattr(iterator, "run_pipeline", fail_third)
    batches, error, _ = _drain(loader, 60)
    assert len(batches) == 2 and isinstance(error, LoaderError), (len(batches), error)
    assert "disk went away" in str(error) and "fail_third" in str(error)  # the traceback
    assert isinstance(error.__cause__, OSError)


def test_a_stalled_loader_fails_within_its_timeout(betons: _Betons,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = betons(10)
    loader = ViewLoader(path, batch_size=3, train=False, augment=AUG, num_workers=1,
                        stall_timeout=1.0)
    iterator = type(loader.loader).iterator_class
    real, release = iterator.run_pipeline, threading.Event()

    def stall_second(self: Any, b_ix: int, *args: Any) -> Any:
        if b_ix == 1:
            release.wait(120)
        return real(self, b_ix, *args)

    monkeypatch.setattr(iterator, "run_pipeline", stall_second)
    try:
        batches, error, seconds = _drain(loader, 60)
    finally:
        release.set()
    assert len(batches) == 1 and isinstance(error, LoaderStalledError), (len(batches), error)
    text = str(error)
    assert str(path) in text and STALL_TIMEOUT_ENV in text and "1 s" in text, text
    assert 1.0 <= seconds < 10


def test_the_stall_timeout_is_configurable(betons: _Betons,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    path = betons(4)
    monkeypatch.delenv(STALL_TIMEOUT_ENV, raising=False)
    assert ViewLoader(path, batch_size=2, train=False, augment=AUG).stall_timeout == 300.0
    monkeypatch.setenv(STALL_TIMEOUT_ENV, "2.5")
    assert ViewLoader(path, batch_size=2, train=False, augment=AUG).stall_timeout == 2.5
    assert ViewLoader(path, batch_size=2, train=False, augment=AUG,
                      stall_timeout=7).stall_timeout == 7.0
    for bad in ("soon", "0", "-3", "nan"):
        monkeypatch.setenv(STALL_TIMEOUT_ENV, bad)
        with pytest.raises(ReaderSettingError, match=f"{STALL_TIMEOUT_ENV}={bad}"):
            ViewLoader(path, batch_size=2, train=False, augment=AUG)


def test_stopping_early_ends_the_thread(betons: _Betons) -> None:
    """A consumer that stops early (break) still ends FFCV's thread, as before."""
    loader = ViewLoader(betons(10), batch_size=2, train=False, augment=AUG, num_workers=1)
    it = iter(loader)
    next(it)
    it.close()  # type: ignore[attr-defined]
    batches, error, _ = _drain(loader, 60)  # and the loader reads a full epoch again
    assert error is None and sum(len(b.labels) for b in batches) == 10


def test_more_decoding_threads_than_this_machine_allows_are_capped(
        betons: _Betons, capsys: pytest.CaptureFixture[str]) -> None:
    """``data.num_workers`` above numba's thread limit (the machine's CPUs) was a numba
    traceback ("The number of threads must be between 1 and 2") in training, and made a run
    trained on a bigger machine impossible to evaluate or embed here (no option lowers it):
    the reader decodes with as many threads as it may, saying so once."""
    import numba

    limit = int(numba.config.NUMBA_NUM_THREADS)
    loader = ViewLoader(betons(10), batch_size=2, train=False, augment=AUG,
                        num_workers=limit + 62)
    batches, error, _ = _drain(loader, 120)
    assert error is None and sum(len(b.labels) for b in batches) == 10
    err = capsys.readouterr().err
    assert f"data.num_workers={limit + 62}" in err and f"using {limit}" in err


# ---------------------------------------------------------------------------------------------
# Defect 1 (a): devices are always indexed and follow the stage's resources.


def test_evaluation_loaders_drain_the_device_between_batches(
        betons: _Betons, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 40 defect 5: an evaluation loop has no host read per batch, so on CUDA the
    consumer's stream is drained before each next batch (FFCV would otherwise refill a pinned
    or device slot that a pending copy or kernel still reads). Training loaders are not
    (the step's one read per step keeps the GPU within a step). On CPU: the flag, and the
    drain called after each batch's work, before the next batch is taken."""
    calls: list[int] = []
    monkeypatch.setattr(ViewLoader, "_drain", lambda self: calls.append(1))
    ev = ViewLoader(betons(10), batch_size=3, train=False, augment=AUG, num_workers=1)
    tr = ViewLoader(betons(10), batch_size=3, views=2, train=True, augment=AUG, num_workers=1)
    assert not ev._drain_between_batches and not tr._drain_between_batches  # CPU: nothing
    ev._drain_between_batches = True  # what a cuda:N evaluation loader sets
    assert len(list(ev)) == 4 and len(calls) == 4  # after each batch, before the next pull
    calls.clear()
    assert len(list(tr)) == 3 and calls == []


@pytest.mark.parametrize("device", ["cuda", torch.device("cuda")])
def test_an_unindexed_cuda_device_is_refused_by_the_reader(betons: _Betons, device: Any) -> None:
    with pytest.raises(ReaderSettingError, match=r"'cuda'.*cuda:0"):
        ViewLoader(betons(4), batch_size=2, train=False, augment=AUG, device=device)


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_resolve_device_outside_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_cuda(monkeypatch, 0)
    assert resolve_device(None) == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ReaderSettingError, match=r"--device cuda:0.*--device cpu"):
        resolve_device("cuda:0")
    _fake_cuda(monkeypatch, 2)
    assert resolve_device(None) == torch.device("cuda", 0)
    assert resolve_device("cuda") == torch.device("cuda", 0)  # always indexed
    assert resolve_device(torch.device("cuda")) == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ReaderSettingError, match=r"cuda:2.*2 CUDA device"):
        resolve_device("cuda:2")
    for bad in ("gpu", "cuda:x", "mps:0"):
        with pytest.raises(ReaderSettingError, match="cpu or cuda:N"):
            resolve_device(bad)


def test_the_evaluate_and_embed_commands_take_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--device`` reaches the stages (and a bad one is refused before any loading)."""
    from pipelines import cli, embed, evaluate

    got: dict[str, Any] = {}
    monkeypatch.setattr(evaluate, "main", lambda *a, **k: got.update(evaluate=k) or 0)
    monkeypatch.setattr(embed, "main", lambda *a, **k: got.update(embed=k) or 0)
    assert cli.main(["evaluate", "r", "--device", "cuda:1"]) == 0
    assert cli.main(["embed", "r", "--data", "d", "--out", "o.parquet", "--device", "cpu"]) == 0
    assert got["evaluate"]["device"] == "cuda:1" and got["embed"]["device"] == "cpu"


@pytest.fixture(scope="module")
def ray_with_a_gpu() -> Iterator[None]:
    """A local Ray that advertises one (logical) GPU: a task asking for it is given GPU 0."""
    import ray

    ray.init(num_cpus=2, num_gpus=1, object_store_memory=1 << 29, include_dashboard=False,
             log_to_driver=False)
    yield
    ray.shutdown()


def _in_task(run_dir: str | None, gpus_torch_sees: int) -> str:
    """In a Ray task on a node where torch sees ``gpus_torch_sees`` GPUs (Ray 2.60 no longer
    hides them from CPU-only tasks): the device a stage picks, or the confirmation's scoring."""
    import ffcv.loader.epoch_iterator  # noqa: F401  (FFCV's CUDA switch: the real, CPU one)
    import torch

    torch.cuda.is_available = lambda: gpus_torch_sees > 0  # type: ignore[assignment]
    torch.cuda.device_count = lambda: gpus_torch_sees  # type: ignore[assignment]
    from components.data.devices import resolve_device

    if run_dir is None:
        return str(resolve_device(None))
    from components.runs.scoring import split_knn_hits

    return f"{len(split_knn_hits(run_dir, 'val', jit=False))} hits"


@pytest.mark.slow
def test_a_ray_task_takes_the_device_of_its_resources(ray_with_a_gpu: None,
                                                      tmp_path: Path) -> None:
    """A CPU-only task reads on the CPU although torch sees a GPU; a task given a GPU reads on
    cuda:0 (Ray's CUDA_VISIBLE_DEVICES); the confirmation's scoring, called as a sweep calls
    it (no device), runs in a CPU-only task on a GPU node."""
    import ray

    from tests.support.datasets import run_with_checkpoint, synthetic_dataset

    task = ray.remote(_in_task)
    cpu_only = task.options(num_cpus=1, num_gpus=0, max_retries=0)
    with_gpu = task.options(num_cpus=1, num_gpus=1, max_retries=0)
    assert ray.get(cpu_only.remote(None, 1), timeout=120) == "cpu"
    assert ray.get(with_gpu.remote(None, 1), timeout=120) == "cuda:0"
    ds = synthetic_dataset(tmp_path / "ds", classes=3, train_per_class=11, val_per_class=3)
    run = run_with_checkpoint(ds, tmp_path / "runs", "confirm")
    assert ray.get(cpu_only.remote(str(run), 1), timeout=300) == "9 hits"
