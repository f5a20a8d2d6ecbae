"""Multi-crop (issue 43 item 3): ``data.view_groups`` — views in groups, each with its own
crop size, crop scale and augmentation (BYOL's asymmetric blur / solarization), through the
model as one encoder call per crop size.

* the model: a batch of two sizes (a :class:`MultiCrop`) gives, in float64 and with
  BatchNorm in train mode, each size's views encoded on their own and concatenated back in
  view order — the embeddings, the EMA keys (CoNe: every view, per view), the loss, the
  gradients and BatchNorm's running statistics (one update per size);
* ``train.accumulate: 2`` with multi-crop gives the unchunked step (float64, BatchNorm in
  eval mode, as tests/training/test_accumulate.py);
* the config: an older stored config (no ``view_groups`` / ``solarize_p``) loads equal and
  resumes as the same run; a bad group is refused in one line naming the value and what is
  allowed; ``views`` is the groups' total; a convnet or a timm ViT that cannot take a
  group's size is refused before anything runs;
* ``simgraph preview`` shows each group, to scale; the run summary and the FLOP estimate
  count each group's views; README's SwAV- and BYOL-style examples load;
* bench/parity.py's plain multi-crop step is the pipeline's (float64);
* in process: a run with 2 × 16 px + 2 × 8 px views trains (finite loss), and resumed after
  epoch 1 it ends where the uninterrupted run ends, bit for bit.
"""

from __future__ import annotations

import copy
import csv
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from components.config import (
    LOSS_CONFIGS,
    ConfigError,
    ModelConfig,
    PretrainConfig,
    TrainConfig,
    from_dict,
    to_dict,
)
from components.data.multicrop import MultiCrop
from components.data.reader import Batch
from components.runs.resume import config_diff
from components.training.optim import build_optimizer, build_scheduler
from components.training.step import build_model, train_step
from tests.support.datasets import synthetic_dataset, tiny_run_config

C, E, B = 3, 6, 8
MODEL = ModelConfig(backbone="convnet", width=4, blocks=2, projector_hidden=16, projector_dim=8)
CPU = torch.device("cpu")
# 2 × 12 px, 3 × 8 px, then 1 × 12 px again: two sizes, three blocks (a size that returns
# later shares its encoder call with its first block).
LAYOUT = ((2, 12), (3, 8), (1, 12))


def _multicrop(seed: int = 0, b: int = B) -> Batch:
    g = torch.Generator().manual_seed(seed)
    blocks = tuple(torch.randn(b, n, 3, s, s, generator=g, dtype=torch.float64)
                   for n, s in LAYOUT)
    caps = torch.nn.functional.normalize(torch.randn(b, E, generator=g, dtype=torch.float64),
                                         dim=1)
    return Batch(images=MultiCrop(blocks), labels=torch.arange(b) % C,
                 sample_ids=torch.arange(b) + 10 * seed, captions=caps)


def _setup(name: str, **spec: Any) -> tuple[Any, Any]:
    loss_cfg = from_dict(LOSS_CONFIGS[name], spec)
    torch.manual_seed(0)
    model, ema = build_model(MODEL, loss_cfg, C, torch.eye(C) * 0.5 + 0.5, E)
    model.to(torch.float64)
    if ema is not None:
        ema.to(torch.float64)
    return model, ema


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _same_step(loss: torch.Tensor, model: torch.nn.Module, want: torch.Tensor,
               ref: torch.nn.Module) -> None:
    """The step's loss and every parameter gradient equal the reference's (float64)."""
    assert float(loss.detach()) == pytest.approx(float(want.detach()), rel=1e-12)
    got_g, want_g = _grads(model), _grads(ref)
    assert got_g and sorted(got_g) == sorted(want_g)
    for n in want_g:
        torch.testing.assert_close(got_g[n], want_g[n], rtol=1e-10, atol=1e-12, msg=n)


def _by_size(model: Any, encoder: torch.nn.Module, images: MultiCrop
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The reference: the 12 px views (blocks 0 and 2) in one encoder call, the 8 px views in
    another, each ``[B·V_s, 3, H, W]`` sample-major; the outputs put back in view order."""
    big = torch.cat([images.blocks[0], images.blocks[2]], dim=1)  # [B, 3, 3, 12, 12]
    small = images.blocks[1]  # [B, 3, 3, 8, 8]
    _, zb, lb = encoder(big.flatten(0, 1))
    _, zs, ls = encoder(small.flatten(0, 1))
    zb, zs = zb.view(B, 3, -1), zs.view(B, 3, -1)
    z = torch.cat([zb[:, :2], zs, zb[:, 2:]], dim=1)
    if lb is None:
        return z, None
    lb, ls = lb.view(B, 3, -1), ls.view(B, 3, -1)
    return z, torch.cat([lb[:, :2], ls, lb[:, 2:]], dim=1)


@pytest.mark.parametrize(("name", "spec"), [("supcon", {"bank_size": 40}),
                                            ("cone", {"bank_size": 48, "top_n": 4}),
                                            ("simclr", {})])
def test_multicrop_forward_is_each_size_encoded_alone_in_view_order(
        name: str, spec: dict[str, Any]) -> None:
    model, ema = _setup(name, **spec)
    ref, ref_ema = copy.deepcopy(model), copy.deepcopy(ema)
    batch = _multicrop()
    assert batch.images.shape == (B, 6)
    z, logits = model.encode(batch.images)
    assert z.shape == (B, 6, 8)
    want_z, want_logits = _by_size(ref, ref.encoder, batch.images)
    torch.testing.assert_close(z, want_z, rtol=1e-12, atol=1e-14)
    if want_logits is not None:
        assert logits is not None
        torch.testing.assert_close(logits, want_logits, rtol=1e-12, atol=1e-14)
    # channels_last (the GPU path's layout) gives the same embeddings
    last = copy.deepcopy(ref)
    last.channels_last = True
    torch.testing.assert_close(last.encode(batch.images)[0], want_z, rtol=1e-10, atol=1e-12)
    # BatchNorm: one running-statistics update per size, as the reference's two calls
    for (n, got), (_, want) in zip(model.encoder.named_buffers(), ref.encoder.named_buffers(),
                                   strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14, msg=n)

    # The step's loss and gradients (EMA keys through the same per-size calls).
    model, ema = _setup(name, **spec)
    ref, ref_ema = copy.deepcopy(model), copy.deepcopy(ema)
    loss, _ = model(batch.images, batch.labels, batch.sample_ids, batch.captions, ema)
    loss.backward()
    z, logits = _by_size(ref, ref.encoder, batch.images)
    ez = el = None
    if ref_ema is not None:
        with torch.no_grad():
            ez, el = _by_size(ref, ref_ema, batch.images)
    want, _ = ref.objective(ref.contrastive_batch(z, logits, ez, el, batch.labels,
                                                  batch.sample_ids, batch.captions))
    want.backward()
    _same_step(loss, model, want, ref)


def test_every_loss_takes_six_views_of_two_sizes() -> None:
    """No loss needs V = 2: each trains two steps on a 6-view multi-crop batch (the second
    with a bank that holds the first batch's keys), with a finite loss."""
    from tests.training.test_accumulate import LOSSES

    for key, raw in LOSSES.items():
        spec = dict(raw)
        model, ema = _setup(spec.pop("name", key), **spec)
        opt = build_optimizer(model, "sgd", 0.05, 0.9, 1e-4)
        sched = build_scheduler(opt, total_steps=10, warmup_steps=2)
        for step in range(2):
            metrics = train_step(model, ema, opt, sched, None, _multicrop(seed=step),
                                 train_cfg=TrainConfig(), device=CPU, step=step,
                                 total_steps=10, ema_momentum=0.99, where=f"step {step}")
            assert math.isfinite(metrics["loss"]), (key, step)


@pytest.mark.parametrize(("name", "spec"), [("supcon", {"bank_size": 40}),
                                            ("cone", {"bank_size": 48, "top_n": 4})])
def test_an_accumulated_multicrop_step_equals_the_unchunked_step(
        name: str, spec: dict[str, Any]) -> None:
    model, ema = _setup(name, **spec)
    model.encoder.eval()  # no batch-dependent layer: chunks give the whole batch's gradient
    twin, twin_ema = copy.deepcopy(model), copy.deepcopy(ema)
    runs = []
    for m, e, k in ((model, ema, 1), (twin, twin_ema, 2)):
        opt = build_optimizer(m, "sgd", 0.05, 0.9, 1e-4)
        sched = build_scheduler(opt, total_steps=10, warmup_steps=2)
        torch.manual_seed(0)
        steps = []
        for step in range(2):  # the second with the first batch's keys in the bank
            metrics = train_step(m, e, opt, sched, None, _multicrop(seed=step),
                                 train_cfg=TrainConfig(accumulate=k), device=CPU, step=step,
                                 total_steps=10, ema_momentum=0.99, where=f"step {step}")
            steps.append((metrics, _grads(m)))
        runs.append(steps)
    for (want_m, want_g), (got_m, got_g) in zip(*runs, strict=True):
        assert got_g and sorted(got_g) == sorted(want_g)
        for n in want_g:
            torch.testing.assert_close(got_g[n], want_g[n], rtol=1e-10, atol=1e-12, msg=n)
        assert got_m["loss"] == pytest.approx(want_m["loss"], rel=1e-12)


@pytest.mark.parametrize("name", ["cone", "supcon"])
def test_a_multicrop_step_reads_back_no_more_than_its_budget(name: str) -> None:
    """The per-size encoder calls and the reassembly are device work: the step keeps the
    objective's one read (tests/training/test_sync_audit.py's budget), chunked or not; the
    batched augmentation with solarization reads nothing back."""
    from components.data.augment import BatchedSimCLRAugment
    from tests.training.test_sync_audit import BUDGET, ReadbackCounter

    model, ema = _setup(name, **({"bank_size": 48, "top_n": 4} if name == "cone"
                                 else {"bank_size": 40}))
    opt = build_optimizer(model, "sgd", 0.05, 0.9, 1e-4)
    sched = build_scheduler(opt, total_steps=10, warmup_steps=2)
    for step, k in ((0, 1), (1, 1), (2, 2)):  # step 0 fills the banks; step 1 reads them
        with ReadbackCounter() as counter:
            train_step(model, ema, opt, sched, None, _multicrop(seed=step),
                       train_cfg=TrainConfig(accumulate=k), device=CPU, step=step,
                       total_steps=10, ema_momentum=0.99, where=f"step {step}")
        assert counter.count <= BUDGET[name], f"{name} step {step}: {dict(counter.where)}"
    augment = BatchedSimCLRAugment(solarize_p=0.5, generator=torch.Generator().manual_seed(0))
    images = torch.randint(0, 256, (8, 3, 16, 16), dtype=torch.uint8)
    for x in (images, images.float() / 255):
        with ReadbackCounter() as counter:
            augment(x)
        assert counter.count == 0, dict(counter.where)


# ------------------------------------------------------------------------------------ config

SWAV = [{"count": 2, "scale": [0.14, 1.0]},
        {"count": 6, "resolution": 8, "scale": [0.05, 0.14]}]


def _run_cfg(**over: Any) -> dict[str, Any]:
    return tiny_run_config(Path("/unused"), Path("/unused"), **over)


def test_a_stored_config_without_the_new_keys_loads_equal_and_is_the_same_run() -> None:
    cfg = from_dict(PretrainConfig, _run_cfg())
    old = to_dict(cfg)
    del old["data"]["view_groups"], old["data"]["augment"]["solarize_p"]  # before they existed
    assert from_dict(PretrainConfig, old) == cfg
    assert cfg.data.view_groups == [] and cfg.data.augment.solarize_p == 0.0
    assert cfg.data.groups() == [(2, cfg.data.augment)] and cfg.data.resolutions() == [16]
    assert config_diff(old, to_dict(cfg)) == []
    multi = from_dict(PretrainConfig, _run_cfg(data__view_groups=SWAV))
    assert config_diff(old, to_dict(multi)) == ["data.view_groups", "data.views"]


def test_view_groups_set_the_views_and_each_groups_augmentation() -> None:
    cfg = from_dict(PretrainConfig, _run_cfg(data__view_groups=SWAV))
    assert cfg.data.views == 8 and cfg.data.resolutions() == [16, 8]
    (n1, a1), (n2, a2) = cfg.data.groups()
    assert (n1, a1.resolution, a1.scale) == (2, 16, [0.14, 1.0])
    assert (n2, a2.resolution, a2.scale) == (6, 8, [0.05, 0.14])
    assert a2.jitter_p == cfg.data.augment.jitter_p  # not given: data.augment's
    # stored and loaded again: the same config (views stored as the total)
    assert from_dict(PretrainConfig, to_dict(cfg)) == cfg
    assert from_dict(PretrainConfig, _run_cfg(data__view_groups=SWAV, data__views=8)) == cfg
    byol = from_dict(PretrainConfig, _run_cfg(data__view_groups=[
        {"count": 1, "blur_p": 1.0, "solarize_p": 0.0},
        {"count": 1, "blur_p": 0.1, "solarize_p": 0.2}]))
    assert [(a.blur_p, a.solarize_p) for _, a in byol.data.groups()] == [(1.0, 0.0),
                                                                           (0.1, 0.2)]


@pytest.mark.parametrize(("groups", "message"), [
    ([{"count": 0}], r"data\.view_groups\[0\]\.count=0 is not allowed: it must be an "
                     r"integer >= 1"),
    ([{"count": 2}, {"count": 1, "resolution": 3}],
     r"data\.view_groups\[1\]\.resolution=3 is not allowed: it must be an integer >= 4"),
    ([{"count": 2, "scale": [0.5, 0.1]}],
     r"data\.view_groups\[0\]\.scale=\[0\.5, 0\.1\] is not allowed: give \[low, high\] with "
     r"0\.0 < low <= high <= 1\.0"),
    ([{"count": 2, "solarize_p": 1.5}],
     r"data\.view_groups\[0\]\.solarize_p=1\.5 is not allowed: it must lie in \[0\.0, 1\.0\]"),
    ([{"count": 2, "blur": 0.5}], r"unknown key data\.view_groups\[0\]\.blur for ViewGroup; "
                                  r"allowed keys: count, resolution, scale, flip_p"),
    ([{"count": 2}, 3], r"data\.view_groups\[1\] must be a mapping of ViewGroup fields"),
])
def test_a_bad_view_group_is_refused_in_one_line(groups: list[Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as e:
        from_dict(PretrainConfig, _run_cfg(data__view_groups=groups))
    assert "\n" not in str(e.value)


def test_views_other_than_the_groups_total_and_sizes_the_model_cannot_take_are_refused(
        ) -> None:
    with pytest.raises(ConfigError, match=r"data\.views=4 is not allowed with "
                                          r"data\.view_groups \(2 \+ 6 = 8 views\): leave "
                                          r"data\.views out or set it to 8"):
        from_dict(PretrainConfig, _run_cfg(data__view_groups=SWAV, data__views=4))
    with pytest.raises(ConfigError, match=r"model\.blocks=3 halves "
                                          r"data\.view_groups\[1\]\.resolution=6 3 times; "
                                          r"a 3-block convnet needs resolution >= 8"):
        from_dict(PretrainConfig, _run_cfg(data__view_groups=[{"count": 1},
                                                              {"count": 1, "resolution": 6}],
                                           model__blocks=3))
    vit = {"backbone": "timm/vit_tiny_patch16_224", "small_images": False}
    with pytest.raises(ConfigError, match=r"data\.view_groups\[1\]\.resolution=16 is not "
                                          r"allowed with model\.backbone=timm/vit_tiny_patch16"
                                          r"_224: it is built for data\.augment\.resolution=32"):
        from_dict(PretrainConfig, _run_cfg(
            model=vit, data__augment={"resolution": 32},
            data__view_groups=[{"count": 2}, {"count": 2, "resolution": 16}]))


def test_the_solarize_probability_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"data\.augment\.solarize_p=-0\.1 is not allowed"):
        from_dict(PretrainConfig, _run_cfg(data__augment={"resolution": 16,
                                                          "solarize_p": -0.1}))


# ------------------------------------------------------------------------ an in-process run


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 px images, 32 training images (2 steps of 16), 8 validation images."""
    return synthetic_dataset(tmp_path_factory.mktemp("multicrop") / "ds", train_per_class=8,
                             val_per_class=2)


def test_preview_shows_each_group_to_scale(dataset: Path, tmp_path: Path) -> None:
    """``simgraph preview`` with 2 × 16 px + 1 × 8 px views: one column per view, titled by
    group and size; the 8 px crop is drawn at half the 16 px one's size (to scale), the
    reader's first batch's view exactly, on grey."""
    import numpy as np
    import yaml
    from PIL import Image

    from components.data.reader import DatasetInfo, set_jit, train_views
    from components.training.step import seed_everything
    from pipelines import preview
    from pipelines.cli import main

    cfg = tiny_run_config(dataset, tmp_path / "runs", data__augment={
        "resolution": 16, "mean": [0.4, 0.5, 0.6], "std": [0.2, 0.25, 0.3]},
        data__view_groups=[{"count": 2}, {"count": 1, "resolution": 8, "solarize_p": 1.0}])
    path = tmp_path / "pretrain.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "grid.png"
    assert main(["preview", str(path), "--out", str(out), "--images", "3", "--tile", "32"]) == 0
    img = np.asarray(Image.open(out))
    step = 32 + preview.GAP
    assert img.shape == (preview.HEADER + 3 * step, 4 * step, 3)
    pc = from_dict(PretrainConfig, cfg)
    assert preview.view_titles(pc) == ["g1 16px", "g1 16px", "g2 8px"]
    assert "3 views: group 1: 2 at 16 px" in preview.describe_groups(pc)
    assert "group 2: 1 at 8 px (crop scale [0.08, 1.0]" in preview.describe_groups(pc)
    assert "solarize 1.0)" in preview.describe_groups(pc)
    set_jit(False)
    loader = train_views(pc, DatasetInfo.load(dataset), 0, 2, torch.device("cpu"), False)
    seed_everything(pc.train.seed, 0, 0)
    loader.set_epoch(0)
    first = next(iter(loader))
    small = preview.view_columns(first.images, pc.data.augment.mean,
                                 pc.data.augment.std)[2][0]  # [8, 8, 3]
    tile = img[preview.HEADER:preview.HEADER + 32, 3 * step:3 * step + 32]
    want = np.asarray(Image.fromarray(small).resize((16, 16), Image.Resampling.NEAREST))
    np.testing.assert_array_equal(tile[8:24, 8:24], want)
    assert (tile[:8] == 128).all() and (tile[24:] == 128).all()


def test_a_resumed_multicrop_run_ends_where_an_uninterrupted_one_does(
        dataset: Path, tmp_path: Path) -> None:
    """In process, ``data.jit: false``, 2 × 16 px + 2 × 8 px views (solarization on group 2):
    a 2-epoch run, then its epoch-2 checkpoint removed and the same command re-run — it
    resumes after epoch 1 and ends with the same weights, optimizer and scheduler state,
    memory bank and history (timings aside) as the uninterrupted run."""
    import shutil

    from components.runs.checkpoint import load_state
    from components.runs.checkpoints import latest_complete
    from components.runs.recipe import run_pretraining

    cfg = from_dict(PretrainConfig, tiny_run_config(
        dataset, tmp_path / "runs", train__epochs=2, knn__every_epochs=0,
        data__view_groups=[{"count": 2}, {"count": 2, "resolution": 8, "scale": [0.05, 0.4],
                                          "solarize_p": 0.5}],
        scaling={"num_workers": 1, "cpus_per_worker": 1.0, "host": "in_process"}))
    run_dir = tmp_path / "runs" / "run"

    def final() -> dict[str, Any]:
        best = latest_complete(run_dir)
        assert best is not None
        return load_state(best[1])

    run_pretraining(cfg, echo=False)
    straight = final()
    shutil.rmtree(run_dir / "epoch_00002")
    assert latest_complete(run_dir)[0] == 1  # type: ignore[index]
    run_pretraining(cfg, echo=False)
    a, b = straight, final()
    assert a["epoch"] == b["epoch"] == 2 and a["step"] == b["step"] == 4
    assert a["model"]["objective.bank.features"].abs().sum() > 0
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    for key in ("optimizer", "scheduler"):
        assert repr(a[key]) == repr(b[key]), key
    timing = {"samples_per_s", "data_wait", "time_s", "eval_s"}
    assert ([{k: v for k, v in r.items() if k not in timing} for r in a["history"]]
            == [{k: v for k, v in r.items() if k not in timing} for r in b["history"]])


def test_a_short_in_process_multicrop_run_trains(dataset: Path, tmp_path: Path) -> None:
    from components.runs.recipe import run_pretraining

    data = dataset  # 2 steps of 16
    cfg = tiny_run_config(data, tmp_path / "runs", knn__every_epochs=0, train__epochs=1,
                          data__view_groups=[{"count": 2, "blur_p": 1.0},
                                             {"count": 2, "resolution": 8,
                                              "scale": [0.05, 0.4], "solarize_p": 0.5}],
                          scaling={"num_workers": 1, "cpus_per_worker": 1.0,
                                   "host": "in_process"})
    run_pretraining(from_dict(PretrainConfig, cfg), echo=False)
    with open(tmp_path / "runs" / "run" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1 and math.isfinite(float(rows[0]["loss"]))


def test_the_run_summary_and_the_estimate_count_each_groups_views() -> None:
    """The summary names the groups; the FLOP estimate counts each view at its own size
    (the mean per view: a 8 px view of this convnet costs a quarter of a 16 px one)."""
    from components.runs.dataset_checks import RunFacts
    from components.runs.estimate import count_flops
    from components.runs.summary import run_summary

    facts = RunFacts(num_classes=4, caption_dim=0, dataset={}, knn=False, knn_note="",
                     needs_captions=False, splits={"train": 128})
    multi = from_dict(PretrainConfig, _run_cfg(data__view_groups=SWAV))
    assert "2 worker(s) x 16 = 32 global, 8 views (2 x 16 px + 6 x 8 px); " in run_summary(
        multi, facts, "/r")
    plain = from_dict(PretrainConfig, _run_cfg())
    assert "32 global, 2 views; " in run_summary(plain, facts, "/r")
    big = count_flops(plain)[0]
    small = count_flops(from_dict(PretrainConfig, _run_cfg(data__augment={"resolution": 8})))[0]
    assert count_flops(multi)[0] == pytest.approx((2 * big + 6 * small) / 8, rel=1e-9)
    assert small < big / 3


def test_the_readmes_swav_and_byol_examples_load() -> None:
    """The two ``data:`` examples of README.md's multi-crop paragraph are valid configs."""
    import re

    import yaml

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    part = text[text.index("**Multi-crop and per-view augmentation"):]
    block = re.search(r"```yaml\n(.*?)```", part, re.S)
    assert block is not None
    swav, byol = (from_dict(PretrainConfig, _run_cfg(data={"dataset": "/unused", **doc["data"]}))
                  for doc in yaml.safe_load_all(block.group(1)))
    assert swav.data.views == 8 and swav.data.resolutions() == [224, 96]
    assert [(n, a.resolution, a.scale) for n, a in swav.data.groups()] == [
        (2, 224, [0.14, 1.0]), (6, 96, [0.05, 0.14])]
    assert byol.data.views == 2 and byol.data.resolutions() == [224]
    assert [(a.blur_p, a.solarize_p) for _, a in byol.data.groups()] == [(1.0, 0.0),
                                                                           (0.1, 0.2)]


@pytest.mark.parametrize(("name", "spec"), [("supcon", {"bank_size": 40}),
                                            ("cone", {"bank_size": 48, "top_n": 4})])
def test_the_parity_benchs_plain_multicrop_step_is_the_pipelines(
        name: str, spec: dict[str, Any]) -> None:
    """bench/parity.py's plain loop, written out (one forward per size), gives the pipeline
    step's loss and gradients: its multi-crop row compares like with like."""
    from bench.parity import plain_step

    model, ema = _setup(name, **spec)
    plain, plain_ema = copy.deepcopy(model), copy.deepcopy(ema)
    batch = _multicrop()
    loss, _ = model(batch.images, batch.labels, batch.sample_ids, batch.captions, ema)
    loss.backward()
    want, _ = plain_step(plain, plain_ema, list(batch.images.blocks), batch.labels,
                         batch.sample_ids, batch.captions)
    want.backward()
    _same_step(loss, model, want, plain)


def test_the_online_probe_gets_every_views_backbone_features_in_view_order() -> None:
    """With multi-crop the probe's features are the backbone's ``h`` of every view, each size
    through its own call, row ``b·V + v`` — from the forward and from the gradient cache's
    first pass alike."""
    from components.training.accumulate import GradCache

    model, _ = _setup("simclr")
    model.eval()  # BatchNorm by running statistics: the same features from every call
    batch = _multicrop()
    big = torch.cat([batch.images.blocks[0], batch.images.blocks[2]], dim=1)
    with torch.no_grad():
        hb = model.encoder.backbone(big.flatten(0, 1)).view(B, 3, -1)
        hs = model.encoder.backbone(batch.images.blocks[1].flatten(0, 1)).view(B, 3, -1)
    want = torch.cat([hb[:, :2], hs, hb[:, 2:]], dim=1).flatten(0, 1)  # [B·6, F]
    model.keep_features = True
    model(batch.images, batch.labels, batch.sample_ids, batch.captions)
    torch.testing.assert_close(model.take_features(), want, rtol=1e-12, atol=1e-14)
    cache = GradCache(model, model, 2)
    cache.forward(batch, None)
    torch.testing.assert_close(model.take_features(), want, rtol=1e-12, atol=1e-14)
