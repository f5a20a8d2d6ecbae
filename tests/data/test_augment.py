"""SimCLR augmentations (components.data.augment) against torchvision.transforms.v2.functional.

Tolerances
----------
* uint8, numba kernels and batched torch functions: max |diff| ≤ 1, and at most 1% of the
  values (or 3, for tiny images) differ at all. Both sides evaluate the same float32
  formulas in the same order (including torch's fused multiply-add in ``_blend``), and on
  this CPU brightness/contrast/saturation/hue/grayscale come out bit-identical; the slack
  covers last-bit float32 differences that flip a uint8 truncation or rounding by one when
  the exact value sits on an integer boundary: blur (two separable passes vs torchvision's
  single 2-D convolution, ~0.002% of values), the contrast mean (summation order), and
  builds of torch whose vector kernels do not fuse ``a + alpha * b``. Hue shares the bound:
  same float32 HSV formulas and ``x * 255.999`` truncation as torchvision.
* float32 batched functions: 1e-5 absolute (float32 rounding; hue 1e-5 as well, the HSV
  formulas being identical).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as TF
from ffcv.pipeline.compiler import Compiler

from components.data.augment import (
    BatchedSimCLRAugment,
    RandomColorJitter,
    RandomGrayscale,
    batched_adjust_brightness,
    batched_adjust_contrast,
    batched_adjust_hue,
    batched_adjust_saturation,
    batched_color_jitter,
    batched_gaussian_blur,
    batched_grayscale,
    batched_solarize,
    blur_kernel_size,
)
from components.data.augment import ffcv_ops as A

SIZES = [(1, 1), (5, 7), (32, 32), (17, 40)]
FACTORS = [0.0, 0.35, 1.0, 1.4, 2.7]
HUES = [-0.5, -0.3, -0.1, 0.0, 0.05, 0.25, 0.5]


def _rand_hwc(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + 31 * h + w).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _chw(img: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(img).permute(2, 0, 1).contiguous()


def _hwc(t: torch.Tensor) -> np.ndarray:
    return t.permute(1, 2, 0).contiguous().numpy()


def _assert_u8_close(got: np.ndarray, ref: np.ndarray) -> None:
    assert got.shape == ref.shape and got.dtype == ref.dtype == np.uint8
    diff = np.abs(got.astype(np.int16) - ref.astype(np.int16))
    assert diff.max() <= 1, f"max |diff| = {diff.max()}"
    n_diff = int((diff != 0).sum())
    assert n_diff <= max(3, diff.size // 100), f"{n_diff} of {diff.size} values differ"


# --------------------------------------------------------------------------------------------
# numba kernels vs torchvision
# --------------------------------------------------------------------------------------------

KERNELS: dict[str, tuple[Callable[..., None], Callable[..., torch.Tensor], list[float]]] = {
    "brightness": (A._adjust_brightness, TF.adjust_brightness, FACTORS),
    "contrast": (A._adjust_contrast, TF.adjust_contrast, FACTORS),
    "saturation": (A._adjust_saturation, TF.adjust_saturation, FACTORS),
    "hue": (A._adjust_hue, TF.adjust_hue, HUES),
}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", list(KERNELS))
def test_color_kernels_match_torchvision(name: str, size: tuple[int, int]) -> None:
    kernel, reference, factors = KERNELS[name]
    img = _rand_hwc(*size)
    for factor in factors:
        out = np.empty_like(img)
        kernel(img, out, factor)
        _assert_u8_close(out, _hwc(reference(_chw(img), factor)))
        inplace = img.copy()
        kernel(inplace, inplace, factor)  # in place gives the same result
        np.testing.assert_array_equal(inplace, out)


def test_hue_kernel_on_grey_and_saturated_pixels() -> None:
    # Edge cases of the HSV conversion: grey (max == min), pure primaries, black/white.
    vals = np.array([0, 1, 127, 128, 254, 255], dtype=np.uint8)
    img = np.stack(np.meshgrid(vals, vals, vals, indexing="ij"), axis=-1).reshape(36, 6, 3)
    for shift in HUES:
        out = np.empty_like(img)
        A._adjust_hue(img, out, shift)
        _assert_u8_close(out, _hwc(TF.adjust_hue(_chw(img), shift)))


@pytest.mark.parametrize("size", SIZES)
def test_grayscale_kernel_matches_torchvision(size: tuple[int, int]) -> None:
    img = _rand_hwc(*size)
    out = np.empty_like(img)
    A._to_grayscale(img, out)
    ref = _hwc(TF.rgb_to_grayscale(_chw(img), num_output_channels=3))
    np.testing.assert_array_equal(out, ref)  # one multiply-add chain, truncated: exact
    assert (out[..., 0] == out[..., 1]).all() and (out[..., 1] == out[..., 2]).all()


def test_blur_kernel_size_rule() -> None:
    # SimCLR's reference: k = side // 10, made odd; at least 3.
    assert blur_kernel_size(224) == 23
    assert blur_kernel_size(96) == 9
    assert blur_kernel_size(32) == 3
    assert blur_kernel_size(1) == 3
    assert blur_kernel_size(64, 0.25) == 17


# --------------------------------------------------------------------------------------------
# batched torch functions vs torchvision per sample
# --------------------------------------------------------------------------------------------

B, H, W = 6, 17, 23


@pytest.fixture(params=["uint8", "float32"])
def batch(request: pytest.FixtureRequest) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (B, 3, H, W), generator=g, dtype=torch.uint8)
    # A grey and a constant sample exercise the max == min branches.
    x[1] = x[1, :1]
    x[2] = 200
    return x if request.param == "uint8" else x.float() / 255.0


def _assert_batched_close(got: torch.Tensor, ref: torch.Tensor) -> None:
    assert got.dtype == ref.dtype and got.shape == ref.shape
    if ref.dtype == torch.uint8:
        _assert_u8_close(got.numpy(), ref.numpy())
    else:
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("fn", "reference", "factors"),
    [
        (batched_adjust_brightness, TF.adjust_brightness, [0.0, 0.35, 1.0, 1.4, 2.7, 0.8]),
        (batched_adjust_contrast, TF.adjust_contrast, [0.0, 0.35, 1.0, 1.4, 2.7, 0.8]),
        (batched_adjust_saturation, TF.adjust_saturation, [0.0, 0.35, 1.0, 1.4, 2.7, 0.8]),
        (batched_adjust_hue, TF.adjust_hue, [-0.5, -0.3, 0.0, 0.05, 0.25, 0.5]),
    ],
    ids=["brightness", "contrast", "saturation", "hue"],
)
def test_batched_color_functions_match_torchvision(
    batch: torch.Tensor,
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    reference: Callable[..., torch.Tensor],
    factors: list[float],
) -> None:
    before = batch.clone()
    got = fn(batch, torch.tensor(factors))
    torch.testing.assert_close(batch, before, atol=0, rtol=0)  # input untouched
    ref = torch.stack([reference(batch[i], f) for i, f in enumerate(factors)])
    _assert_batched_close(got, ref)


def test_batched_color_jitter_chains_in_fixed_order(batch: torch.Tensor) -> None:
    b = torch.tensor([0.6, 1.3, 1.0, 0.9, 1.4, 0.7])
    c = torch.tensor([1.2, 0.6, 1.0, 1.4, 0.8, 0.9])
    s = torch.tensor([0.0, 1.4, 1.0, 0.7, 1.1, 0.6])
    h = torch.tensor([0.1, -0.1, 0.0, 0.05, -0.02, 0.08])
    apply = torch.tensor([True, True, True, False, True, False])
    got = batched_color_jitter(batch, b, c, s, h, apply=apply)
    for i in range(B):
        ref = batch[i]
        if apply[i]:
            ref = TF.adjust_brightness(ref, float(b[i]))
            ref = TF.adjust_contrast(ref, float(c[i]))
            ref = TF.adjust_saturation(ref, float(s[i]))
            ref = TF.adjust_hue(ref, float(h[i]))
        _assert_batched_close(got[i], ref)
    assert torch.equal(batched_color_jitter(batch), batch)  # nothing to do


def test_batched_grayscale_matches_torchvision(batch: torch.Tensor) -> None:
    apply = torch.tensor([True, False, True, True, False, True])
    got = batched_grayscale(batch, apply=apply)
    for i in range(B):
        ref = TF.rgb_to_grayscale(batch[i], num_output_channels=3) if apply[i] else batch[i]
        _assert_batched_close(got[i], ref)


@pytest.mark.parametrize("kernel_size", [(3, 3), (5, 3), (9, 7)])
def test_batched_blur_matches_torchvision(
    batch: torch.Tensor, kernel_size: tuple[int, int]
) -> None:
    sigma = torch.tensor([0.1, 0.5, 1.0, 1.5, 2.0, 0.8])
    apply = torch.tensor([True, True, True, True, False, True])
    got = batched_gaussian_blur(batch, sigma, kernel_size, apply=apply)
    for i in range(B):
        ref = batch[i]
        if apply[i]:
            ref = TF.gaussian_blur(ref, list(kernel_size), [float(sigma[i])] * 2)
        _assert_batched_close(got[i], ref)


def test_numba_and_torch_paths_agree() -> None:
    img = _rand_hwc(20, 24, seed=5)
    x = _chw(img)[None]
    for fn, kernel, f in [
        (batched_adjust_contrast, A._adjust_contrast, 1.3),
        (batched_adjust_hue, A._adjust_hue, -0.2),
    ]:
        out = np.empty_like(img)
        kernel(img, out, f)
        _assert_u8_close(out, _hwc(fn(x, torch.tensor([f]))[0]))


# --------------------------------------------------------------------------------------------
# Solarization (BYOL)
# --------------------------------------------------------------------------------------------


def test_batched_solarize_matches_torchvision_exactly(batch: torch.Tensor) -> None:
    """Every sample solarized (``apply`` all True, or no mask) is torchvision's ``solarize``
    bit for bit: threshold 128 on uint8, 128 / 255 on float (the same pixels), and a few
    others; none (mask all False) is the input; a per-sample mask picks per sample."""
    uint8 = batch.dtype == torch.uint8
    default = 128 if uint8 else 128 / 255
    want = TF.solarize(batch, threshold=default)
    assert torch.equal(batched_solarize(batch), want)
    assert torch.equal(batched_solarize(batch, apply=torch.ones(B, dtype=torch.bool)), want)
    assert torch.equal(batched_solarize(batch, apply=torch.zeros(B, dtype=torch.bool)), batch)
    for t in ((0, 1, 127, 200, 255) if uint8 else (0.0, 0.25, 0.5, 1.0)):
        assert torch.equal(batched_solarize(batch, threshold=t), TF.solarize(batch, t)), t
    mask = torch.tensor([True, False] * (B // 2))
    got = batched_solarize(batch, apply=mask)
    assert torch.equal(got[mask], want[mask]) and torch.equal(got[~mask], batch[~mask])
    assert not torch.equal(want, batch)  # the test images do have pixels >= 128
    with pytest.raises(ValueError, match="threshold=256 is not allowed"):
        batched_solarize(batch.to(torch.uint8), threshold=256)


def test_module_solarize_probability() -> None:
    """``solarize_p`` 1 solarizes every sample (after the blur, as BYOL), 0 none and draws
    nothing (the RNG moves as before solarization existed), a fraction about that share."""
    x = torch.randint(0, 256, (400, 3, 4, 4), dtype=torch.uint8,
                      generator=torch.Generator().manual_seed(0))
    off = dict(jitter_p=0.0, grayscale_p=0.0)
    assert torch.equal(BatchedSimCLRAugment(**off, blur_p=0.0, solarize_p=1.0)(x),
                       TF.solarize(x, 128))
    blur = BatchedSimCLRAugment(**off, blur_p=1.0, generator=torch.Generator().manual_seed(1))
    both = BatchedSimCLRAugment(**off, blur_p=1.0, solarize_p=1.0,
                                generator=torch.Generator().manual_seed(1))
    assert torch.equal(both(x), TF.solarize(blur(x), 128))
    torch.manual_seed(5)
    BatchedSimCLRAugment(**off, blur_p=0.0, solarize_p=0.0)(x)
    after = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(after, torch.rand(3))
    half = BatchedSimCLRAugment(**off, blur_p=0.0, solarize_p=0.2,
                                generator=torch.Generator().manual_seed(2))(x)
    changed = (half != x).flatten(1).any(1).float().mean().item()
    assert 0.12 < changed < 0.28


# --------------------------------------------------------------------------------------------
# BatchedSimCLRAugment
# --------------------------------------------------------------------------------------------


def test_module_probability_zero_is_identity(batch: torch.Tensor) -> None:
    aug = BatchedSimCLRAugment(jitter_p=0.0, grayscale_p=0.0, blur_p=0.0)
    assert torch.equal(aug(batch), batch)


def test_module_shapes_dtypes_and_reproducibility(batch: torch.Tensor) -> None:
    x = batch.repeat(4, 1, 1, 1)  # 24 samples, 4 copies of each image
    aug = BatchedSimCLRAugment(generator=torch.Generator().manual_seed(3))
    out = aug(x)
    assert out.shape == x.shape and out.dtype == x.dtype and not out.requires_grad
    if x.is_floating_point():
        assert out.min() >= 0 and out.max() <= 1
    again = BatchedSimCLRAugment(generator=torch.Generator().manual_seed(3))(x)
    assert torch.equal(out, again)
    # Per-sample randomness: copies of the same image come out differently.
    assert not torch.equal(out[0], out[B]) or not torch.equal(out[0], out[2 * B])


def test_module_per_sample_parameters_differ() -> None:
    x = torch.randint(0, 256, (1, 3, 16, 16), dtype=torch.uint8).expand(32, 3, 16, 16)
    aug = BatchedSimCLRAugment(jitter_p=1.0, grayscale_p=0.0, blur_p=0.0)
    out = aug(x).reshape(32, -1)
    assert len({tuple(r.tolist()) for r in out}) == 32


def test_module_grayscale_and_blur_always() -> None:
    x = torch.rand(8, 3, 40, 40)
    out = BatchedSimCLRAugment(jitter_p=0.0, grayscale_p=1.0, blur_p=1.0)(x)
    assert torch.equal(out[:, 0], out[:, 1]) and torch.equal(out[:, 1], out[:, 2])
    # Blur with k = 5 (10% of 40, odd): smoother than the grayscale input.
    gray = batched_grayscale(x)
    assert out.diff(dim=-1).abs().mean() < gray.diff(dim=-1).abs().mean()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_module_on_cuda_matches_cpu_functions() -> None:
    x = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8)
    xc = x.cuda()
    f = torch.linspace(0.5, 1.5, 16)
    h = torch.linspace(-0.4, 0.4, 16)
    s = torch.linspace(0.1, 2.0, 16)
    for fn, arg in [(batched_adjust_contrast, f), (batched_adjust_hue, h)]:
        _assert_u8_close(fn(xc, arg.cuda()).cpu().numpy(), fn(x, arg).numpy())
    got = batched_gaussian_blur(xc.float() / 255, s.cuda(), 3).cpu()
    torch.testing.assert_close(got, batched_gaussian_blur(x.float() / 255, s, 3), atol=1e-5,
                               rtol=0)
    gen = torch.Generator(device="cuda").manual_seed(0)
    out = BatchedSimCLRAugment(generator=gen)(xc)
    assert out.is_cuda and out.dtype == torch.uint8 and out.shape == x.shape


def test_batched_input_errors() -> None:
    x = torch.zeros(2, 3, 4, 4, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"\[B, 3, H, W\]"):
        batched_grayscale(torch.zeros(3, 4, 4))
    with pytest.raises(TypeError, match="uint8 or floating"):
        batched_grayscale(torch.zeros(2, 3, 4, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"shape \[B\]"):
        batched_adjust_brightness(x, torch.ones(3))
    with pytest.raises(ValueError, match="hue shifts"):
        batched_adjust_hue(x, torch.tensor([0.1, 0.6]))
    with pytest.raises(ValueError, match="odd"):
        batched_gaussian_blur(x, torch.ones(2), 4)
    with pytest.raises(ValueError, match="sigma"):
        batched_gaussian_blur(x, torch.tensor([1.0, 0.0]), 3)


# --------------------------------------------------------------------------------------------
# Constructor validation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: RandomColorJitter(brightness=-0.1),
         r"brightness=-0\.1 is not allowed: it must be a finite number >= 0"),
        (lambda: RandomColorJitter(contrast=float("inf")), r"contrast=inf is not allowed"),
        (lambda: RandomColorJitter(saturation=float("nan")), r"saturation=nan is not allowed"),
        (lambda: RandomColorJitter(hue=0.6),
         r"hue=0\.6 is not allowed: it must lie in \[0\.0, 0\.5\]"),
        (lambda: RandomColorJitter(hue=-0.1), r"hue=-0\.1 is not allowed"),
        (lambda: RandomColorJitter(p=1.5), r"p=1\.5 is not allowed: it must lie in \[0\.0, 1\.0\]"),
        (lambda: RandomGrayscale(p=-0.2), r"p=-0\.2 is not allowed"),
        (lambda: BatchedSimCLRAugment(sigma=(0.0, 1.0)),
         r"sigma\[0\]=0\.0 is not allowed: it must be a finite number > 0"),
        (lambda: BatchedSimCLRAugment(sigma=(2.0, 1.0)), r"sigma=\(2\.0, 1\.0\) .*0 < min <= max"),
        (lambda: BatchedSimCLRAugment(sigma=(1.0,)), r"\(min, max\) pair"),  # type: ignore[arg-type]
        (lambda: BatchedSimCLRAugment(kernel_fraction=0), r"kernel_fraction=0 .*\(0\.0, 1\.0\]"),
        (lambda: BatchedSimCLRAugment(kernel_fraction=1.5), r"kernel_fraction=1\.5 is not allowed"),
        (lambda: BatchedSimCLRAugment(jitter_p=-1), r"jitter_p=-1 is not allowed"),
        (lambda: BatchedSimCLRAugment(grayscale_p=3), r"grayscale_p=3 is not allowed"),
        (lambda: BatchedSimCLRAugment(blur_p=1.01), r"blur_p=1\.01 is not allowed"),
        (lambda: BatchedSimCLRAugment(hue=0.51), r"hue=0\.51 is not allowed"),
        (lambda: BatchedSimCLRAugment(sigma=(-1.0, 2.0)), r"sigma"),
        (lambda: BatchedSimCLRAugment(kernel_fraction=-0.1), r"kernel_fraction"),
    ],
)
def test_constructor_validation(make: Callable[[], object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def test_constructor_refuses_non_numbers_and_takes_numpy_scalars() -> None:
    # components.checks: one message shape, bools and strings are not numbers
    with pytest.raises(ValueError, match="brightness='0.4' is not allowed: it must be a "
                                         "finite number >= 0"):
        RandomColorJitter(brightness="0.4")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="p=True is not allowed"):
        RandomGrayscale(p=True)
    ok = RandomColorJitter(brightness=0, contrast=1, saturation=np.float32(2.5),
                           hue=np.float64(0.5), p=np.int64(1))
    assert (ok.brightness, ok.saturation, ok.hue, ok.p) == (0.0, 2.5, 0.5, 1.0)


# --------------------------------------------------------------------------------------------
# FFCV operations inside a Loader
# --------------------------------------------------------------------------------------------

N_IMAGES, SIDE = 16, 32


@pytest.fixture(scope="module")
def beton(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    import functools

    import ffcv.writer
    from ffcv.fields import IntField, RGBImageField
    from tqdm import tqdm

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (N_IMAGES, SIDE, SIDE, 3), dtype=np.uint8)
    path = tmp_path_factory.mktemp("augment") / "tiny.beton"
    ffcv.writer.tqdm = functools.partial(tqdm, disable=True)  # type: ignore[attr-defined]
    writer = ffcv.writer.DatasetWriter(
        str(path), {"image": RGBImageField(write_mode="raw"), "label": IntField()},
        num_workers=1,
    )
    writer.from_indexed_dataset([(images[i], i) for i in range(N_IMAGES)])
    return path, images


@pytest.fixture
def ffcv_state() -> Iterator[None]:
    """Restore FFCV's compiler switch and thread counts (the Loader changes them)."""
    enabled, threads, torch_threads = Compiler.is_enabled, Compiler.num_threads, (
        torch.get_num_threads()
    )
    yield
    Compiler.set_enabled(enabled)
    Compiler.set_num_threads(threads)
    torch.set_num_threads(torch_threads)


def _load(path: Path, ops: list, batch_size: int = 5, num_workers: int = 1) -> tuple:
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.rgb_image import SimpleRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import ToTensor, ToTorchImage

    loader = Loader(
        str(path), batch_size=batch_size, num_workers=num_workers, order=OrderOption.SEQUENTIAL,
        drop_last=False,
        pipelines={
            "image": [SimpleRGBImageDecoder(), *ops, ToTensor(), ToTorchImage()],
            "label": [IntDecoder(), ToTensor()],
        },
    )
    images, labels = [], []
    for img, lab in loader:
        assert img.dtype == torch.uint8 and img.shape[1:] == (3, SIDE, SIDE)
        assert img.shape[0] <= batch_size
        images.append(img.clone())
        labels.append(lab.clone().view(-1))
    return torch.cat(images), torch.cat(labels)


@pytest.fixture
def no_jit(ffcv_state: None) -> None:
    Compiler.set_enabled(False)


def test_ffcv_ops_with_p0_leave_images_unchanged(beton: tuple, no_jit: None) -> None:
    path, images = beton
    ops = [RandomColorJitter(p=0.0), RandomGrayscale(p=0.0)]
    got, labels = _load(path, ops)
    assert got.shape == (N_IMAGES, 3, SIDE, SIDE)  # 5 + 5 + 5 + 1: partial last batch
    assert labels.tolist() == list(range(N_IMAGES))
    assert torch.equal(got, torch.from_numpy(images).permute(0, 3, 1, 2))


def test_ffcv_grayscale_p1_gives_equal_channels(beton: tuple, no_jit: None) -> None:
    path, images = beton
    got, _ = _load(path, [RandomColorJitter(p=0.0), RandomGrayscale(p=1.0)])
    assert torch.equal(got[:, 0], got[:, 1]) and torch.equal(got[:, 1], got[:, 2])
    ref = TF.rgb_to_grayscale(torch.from_numpy(images).permute(0, 3, 1, 2), 3)
    assert torch.equal(got, ref)


def test_ffcv_full_simclr_pipeline(beton: tuple, no_jit: None) -> None:
    path, images = beton
    np.random.seed(0)
    ops = [RandomColorJitter(p=1.0), RandomGrayscale(p=0.5)]
    got, _ = _load(path, ops)
    src = torch.from_numpy(images).permute(0, 3, 1, 2)
    assert got.shape == src.shape
    changed = (got != src).flatten(1).any(dim=1)
    assert changed.all()  # every image jittered (p=1, continuous factors)
    # Jitter with all magnitudes 0 is the identity even at p=1.
    same, _ = _load(path, [RandomColorJitter(brightness=0, contrast=0, saturation=0, hue=0, p=1.0)])
    assert torch.equal(same, src)


def test_ffcv_ops_reject_tensors(beton: tuple, no_jit: None) -> None:
    from ffcv.fields.rgb_image import SimpleRGBImageDecoder
    from ffcv.loader import Loader
    from ffcv.transforms import ToTensor

    path, _ = beton
    with pytest.raises(TypeError, match="RandomGrayscale needs uint8"):
        loader = Loader(str(path), batch_size=4, num_workers=1,
                        pipelines={"image": [SimpleRGBImageDecoder(), ToTensor(),
                                             RandomGrayscale()]})
        next(iter(loader))
