"""IntQuant against PyTorch's own quantisation, bit for bit: the scale and zero point of
torch.ao's min/max observers, the codes ``torch.quantize_per_tensor`` /
``torch.quantize_per_channel`` store, and fake quantisation's values."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.ao.quantization import MinMaxObserver, PerChannelMinMaxObserver  # noqa: E402

import bitfault as bf  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # quantize_* is deprecated

F32_TINY = float(np.finfo(np.float32).smallest_subnormal)


def _torch_dtype(fmt: bf.IntQuant) -> torch.dtype:
    if fmt.bits > 8:
        return torch.qint32
    return torch.qint8 if fmt.symmetric else torch.quint8


def _observer(fmt: bf.IntQuant, axis: int | None):
    """torch.ao's observer for ``fmt``'s code range (symmetric: -(2**(b-1)-1)..2**(b-1)-1)."""
    lo, hi = fmt.code_range
    if axis is None:
        scheme = torch.per_tensor_symmetric if fmt.symmetric else torch.per_tensor_affine
        return MinMaxObserver(dtype=_torch_dtype(fmt), qscheme=scheme, quant_min=lo,
                              quant_max=hi)
    scheme = torch.per_channel_symmetric if fmt.symmetric else torch.per_channel_affine
    return PerChannelMinMaxObserver(ch_axis=axis, dtype=_torch_dtype(fmt), qscheme=scheme,
                                    quant_min=lo, quant_max=hi)


def _tensor(rng: np.random.Generator, shape: tuple[int, ...], kind: int) -> np.ndarray:
    """Random float32 values over many magnitudes, with zeros and a subnormal mixed in."""
    x = rng.normal(0, 1, shape) * 10.0 ** rng.uniform(-6, 3, (shape[0],) + (1,) * (len(shape) - 1))
    if kind % 2:
        x = x + rng.uniform(-1, 3) * np.abs(x).max()  # off-centre: asymmetric zero points
    x = x.astype(np.float32)
    flat = x.reshape(-1)
    flat[rng.integers(0, flat.size, 3)] = [0.0, -0.0, F32_TINY]
    return x


def _with_ties(fmt: bf.IntQuant, axis: int | None, x: np.ndarray,
               rng: np.random.Generator) -> np.ndarray:
    """``x`` with half its values moved to k + 1/2 steps of torch's scale (code ties) and
    one float32 ulp either side, each channel's extremes (so its scale) kept."""
    scale, zero = _torch_qparams(fmt, axis, x)
    y = np.moveaxis(x.copy(), 0 if axis is None else axis, 0)
    if axis is None:
        y = y.reshape(1, -1)
    rows = y.reshape(y.shape[0], -1)
    s = scale.numpy().astype(np.float64).reshape(-1, 1)
    z = zero.numpy().astype(np.float64).reshape(-1, 1)
    lo, hi = fmt.code_range
    k = rng.integers(lo, hi, rows.shape) + 0.5
    ties = ((k - z) * s).astype(np.float32)
    nudge = rng.integers(-1, 2, rows.shape)
    ties = np.where(nudge > 0, np.nextafter(ties, np.float32(np.inf)),
                    np.where(nudge < 0, np.nextafter(ties, np.float32(-np.inf)), ties))
    mn, mx = rows.min(axis=1, keepdims=True), rows.max(axis=1, keepdims=True)
    pick = rng.random(rows.shape) < 0.5
    pick[:, :2] = False
    out = np.where(pick, np.clip(ties, mn, mx), rows)
    out[:, 0], out[:, 1] = mn[:, 0], mx[:, 0]
    out = out.reshape(y.shape)
    if axis is None:
        return out.reshape(x.shape)
    return np.ascontiguousarray(np.moveaxis(out, 0, axis))


FORMATS = [bf.IntQuant(8), bf.IntQuant(8, symmetric=False), bf.IntQuant(4),
           bf.IntQuant(4, symmetric=False), bf.IntQuant(2, symmetric=False), bf.IntQuant(16),
           bf.IntQuant(16, symmetric=False)]


def _cases(n_seeds: int):
    for fmt in FORMATS:
        for axis in (None, 0, 1):
            for seed in range(n_seeds):
                yield fmt, axis, seed


def _with_axis(fmt: bf.IntQuant, axis: int | None) -> bf.IntQuant:
    return bf.IntQuant(fmt.bits, symmetric=fmt.symmetric,
                       per_channel=False if axis is None else axis)


def _torch_qparams(fmt: bf.IntQuant, axis: int | None, x: np.ndarray):
    obs = _observer(fmt, axis)
    obs(torch.from_numpy(x))
    scale, zero = obs.calculate_qparams()
    return scale, zero


def _torch_codes(fmt: bf.IntQuant, axis: int | None, x: np.ndarray, scale, zero) -> np.ndarray:
    xt = torch.from_numpy(x)
    if axis is None:
        q = torch.quantize_per_tensor(xt, float(scale), int(zero), _torch_dtype(fmt))
    else:
        q = torch.quantize_per_channel(xt, scale.double(), zero, axis, _torch_dtype(fmt))
    lo, hi = fmt.code_range  # torch clamps to its dtype's range, bitfault to the code range
    return np.clip(q.int_repr().numpy().astype(np.int64), lo, hi)


def _codes(fmt: bf.IntQuant, words: np.ndarray) -> np.ndarray:
    """The codes q (before the layout's offset) of words."""
    w = words.astype(np.int64) & fmt.word_mask
    if fmt.codes == "signed":
        w = np.where(w >= 1 << (fmt.bits - 1), w - (1 << fmt.bits), w)
    return w - fmt.code_offset


@pytest.mark.parametrize("fmt,axis,seed", list(_cases(12)))
def test_scale_zero_point_and_codes_equal_torch(fmt, axis, seed):
    fmt = _with_axis(fmt, axis)
    rng = np.random.default_rng(seed)
    x = _tensor(rng, (6, 37), seed)
    if seed % 2:
        x = _with_ties(fmt, axis, x, rng)
    if axis is not None and seed % 3 == 0:
        np.moveaxis(x, axis, 0)[1] = 0.0  # an all-zero channel: scale float32 eps
    t_scale, t_zero = _torch_qparams(fmt, axis, x)
    params = fmt.calibrate(x)
    assert params.scale.dtype == np.float32
    assert params.scale.ravel().view(np.uint32).tolist() == \
        t_scale.numpy().astype(np.float32).view(np.uint32).tolist()
    assert params.zero_point.ravel().tolist() == t_zero.numpy().ravel().tolist()
    if axis is not None and seed % 3 == 0:
        assert params.scale.ravel()[1] == np.float32(fmt.min_scale)
    words = fmt.encode(x, params)
    expected = _torch_codes(fmt, axis, x, t_scale, t_zero)
    assert np.array_equal(_codes(fmt, words), expected)


def test_the_tie_cases_are_exercised():
    """The cases above hit the values where adding the zero point before or after rounding,
    and in one rounding or two, give different codes (else they could not tell them apart)."""
    seen = set()
    for fmt, axis, seed in _cases(12):
        if fmt.symmetric or fmt.bits > 8 or seed % 2 == 0:
            continue
        fmt = _with_axis(fmt, axis)
        rng = np.random.default_rng(seed)
        x = _with_ties(fmt, axis, _tensor(rng, (6, 37), seed), rng)
        params = fmt.calibrate(x)
        inv = np.float32(1) / params.scale
        after = np.rint(x * inv) + params.zero_point
        two = np.rint(x * inv + params.zero_point.astype(np.float32))
        ours = _codes(fmt, fmt.encode(x, params))
        lo, hi = fmt.code_range
        if (np.clip(after, lo, hi) != ours).any():
            seen.add(("after", fmt.zero_point_add))
        if (np.clip(two, lo, hi) != ours).any():
            seen.add(("two roundings", fmt.zero_point_add))
    assert {("after", "fused"), ("two roundings", "fused"), ("after", "float32")} <= seen


@pytest.mark.parametrize("fmt,axis,seed", [c for c in _cases(6) if c[0].bits <= 8])
def test_fault_free_decode_equals_fake_quantisation(fmt, axis, seed):
    fmt = _with_axis(fmt, axis)
    rng = np.random.default_rng(100 + seed)
    x = _tensor(rng, (5, 29), seed)
    if seed % 2:
        x = _with_ties(fmt, axis, x, rng)
    t_scale, t_zero = _torch_qparams(fmt, axis, x)
    lo, hi = fmt.code_range
    xt = torch.from_numpy(x)
    if axis is None:
        fake = torch.fake_quantize_per_tensor_affine(xt, float(t_scale), int(t_zero), lo, hi)
        q = torch.quantize_per_tensor(xt, float(t_scale), int(t_zero), _torch_dtype(fmt))
    else:
        fake = torch.fake_quantize_per_channel_affine(xt, t_scale, t_zero.int(), axis, lo, hi)
        q = torch.quantize_per_channel(xt, t_scale.double(), t_zero, axis, _torch_dtype(fmt))
    words, params = fmt.quantize(x)
    ours = fmt.decode(words, params)
    fake = fake.numpy()
    if fmt.symmetric:  # zero point 0: fake quantisation's codes are quantize_*'s
        assert np.array_equal(ours.view(np.uint32), fake.view(np.uint32))
        return
    # asymmetric: fake quantisation adds the zero point after rounding, quantize_* before
    # (torch's own two paths differ at exact ties); bitfault stores quantize_*'s codes and
    # decodes them as torch's dequantize does
    codes = np.clip(q.int_repr().numpy().astype(np.int64), lo, hi)
    shape = [1] * x.ndim
    if axis is not None:
        shape[axis] = -1
    s64 = t_scale.numpy().astype(np.float64).reshape(shape)
    deq = ((codes - t_zero.numpy().reshape(shape)) * s64).astype(np.float32)
    if fmt.bits == 8:  # no clamping needed: the formula is torch's dequantize
        assert np.array_equal(deq.view(np.uint32), q.dequantize().numpy().view(np.uint32))
    assert np.array_equal(ours.view(np.uint32), deq.view(np.uint32))
    same = fake == deq
    assert np.array_equal(ours[same].view(np.uint32), fake[same].view(np.uint32))
    assert same.mean() > 0.5


def test_float64_and_float16_input_are_quantised_as_float32():
    rng = np.random.default_rng(7)
    x = rng.normal(0, 1, (4, 9))
    for fmt in (bf.IntQuant(8), bf.IntQuant(8, symmetric=False, per_channel=True)):
        for arr in (x, x.astype(np.float16)):
            words, params = fmt.quantize(arr)
            words32, params32 = fmt.quantize(arr.astype(np.float32))
            assert np.array_equal(words, words32)
            assert np.array_equal(params.scale, params32.scale)
            back = fmt.decode(words, params, dtype=np.float64)
            assert np.array_equal(back.astype(np.float32), fmt.decode(words, params))


def test_decode_is_one_rounding_of_the_exact_product():
    """float16 output: (q - z) * s rounded once into float16, not through float32."""
    fmt = bf.IntQuant(8, symmetric=False)
    x = np.linspace(-1.3, 2.9, 200, dtype=np.float32)
    words, params = fmt.quantize(x)
    q = _codes(fmt, words) - params.zero_point
    exact = q.astype(np.float64) * np.float64(params.scale)
    assert np.array_equal(fmt.decode(words, params, dtype=np.float16), exact.astype(np.float16))
    assert np.array_equal(fmt.decode(words, params, dtype=np.float64), exact)


@pytest.mark.parametrize("kernel", ["numba", "torch"])
@pytest.mark.parametrize("fmt", [*FORMATS, bf.IntQuant(8, codes="unsigned"),
                                 bf.IntQuant(30, symmetric=False)], ids=repr)
@pytest.mark.parametrize("axis", [None, 0])
def test_torch_kernels_equal_the_core_at_ties(kernel, fmt, axis, monkeypatch):
    """The compiled kernel, the float32 fast path and the generic ops on tie-heavy tensors:
    the core's codes (so torch's), faulted and decoded bit for bit as ``bitfault.inject``."""
    from bitfault.torch import inject_tensor, seam
    from bitfault.torch.seam import DeviceFaults, faulty_group

    if kernel == "numba" and not seam.numba_available():
        pytest.skip("Numba is not installed (or BITFAULT_NUMBA=0)")
    if kernel == "torch":
        monkeypatch.setattr(seam, "numba_available", lambda: False)
    fmt = _with_axis(fmt, axis)
    fault = bf.BitFlip()
    for seed in range(4):
        rng = np.random.default_rng(seed)
        xs = [_tensor(rng, shape, seed) for shape in [(8, 40), (3, 17)]]
        if fmt.bits <= 16:  # torch's observer for the ties
            xs = [_with_ties(fmt, axis, x, rng) for x in xs]
        maps = [bf.FaultMap.random(x.shape, fmt, ber=0.03, seed=seed, name=f"t{i}")
                for i, x in enumerate(xs)]
        faults = DeviceFaults.build(maps, fault.eligible_mask(fmt), "cpu")
        outs = faulty_group([torch.from_numpy(x) for x in xs], fmt, fault, faults)
        for x, fmap, out in zip(xs, maps, outs, strict=True):
            expected = bf.inject(x, fmt, fault, fmap)
            assert np.array_equal(out.numpy().view(np.uint32), expected.view(np.uint32))
            x64 = x.astype(np.float64)
            got = inject_tensor(torch.from_numpy(x64), fmt, fault, fmap).numpy()
            assert np.array_equal(got.view(np.uint64),
                                  bf.inject(x64, fmt, fault, fmap).view(np.uint64))
