"""bitfault.torch.inject_tensor and the kernels behind it: bit for bit bitfault.inject."""

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import bitfault as bf  # noqa: E402
from bitfault.torch import inject_tensor, seam  # noqa: E402
from bitfault.torch.seam import DeviceFaults, faulty_group  # noqa: E402


@pytest.fixture(autouse=True, params=["numba", "torch"])
def kernels(request, monkeypatch):
    """Every test here runs twice on the CPU: through the compiled one-pass kernels and
    through the PyTorch paths (what runs without Numba, and on other devices)."""
    if request.param == "numba" and not seam.numba_available():
        pytest.skip("Numba is not installed (or BITFAULT_NUMBA=0)")
    if request.param == "torch":
        monkeypatch.setattr(seam, "numba_available", lambda: False)
    return request.param

FORMATS = [
    bf.FixedPoint(32, 28, rounding="trunc"), bf.FixedPoint(32, 28), bf.FixedPoint(16, 8),
    bf.FixedPoint(8, 4, overflow="wrap"), bf.FixedPoint(12, 12), bf.FixedPoint(25, 20),
    bf.FixedPoint(32, 0), bf.IntQuant(8), bf.IntQuant(8, symmetric=False),
    bf.IntQuant(4, per_channel=True), bf.IntQuant(8, codes="unsigned"),
    bf.IntQuant(8, symmetric=False, per_channel=1, rounding="trunc"),
    bf.IntQuant(16, symmetric=False, codes="signed"), bf.Float("float32"), bf.Float("float16"),
    bf.Float("bfloat16"), bf.Float("float8_e4m3fn"), bf.Float("float8_e4m3fn", "nan"),
    bf.Float("float8_e5m2"), bf.Float("float8_e5m2", "nan"), bf.Float("float6_e2m3fn"),
    bf.Float("float6_e3m2fn"), bf.Float("float4_e2m1fn"), bf.Float("float8_e8m0fnu"),
    bf.Float("float8_e8m0fnu", "nan"),
]
FAULTS = [bf.BitFlip(), bf.StuckAt(0), bf.StuckAt(1)]
EDGES = [0.0, -0.0, np.nan, np.inf, -np.inf, 1e-30, -1e-30, 7.999999, 8.0, -8.0, 1e6, -1e6,
         2.0**-28, -(2.0**-28), 3 * 2.0**-29, -3 * 2.0**-29, 0.5, -0.5, 65504.0, 1e-8, -1e-8]


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize])


def _values(rng, shape, dtype, edges=True, finite=False):
    n = int(np.prod(shape))
    v = rng.standard_normal(n) * np.exp2(rng.integers(-12, 6, n))
    if edges:
        v[:len(EDGES)] = EDGES
        rng.shuffle(v)
    if finite:
        v = np.clip(np.nan_to_num(v, nan=0.5, posinf=2.0, neginf=-2.0), -6e4, 6e4)
    with np.errstate(over="ignore"):
        return v.astype(dtype).reshape(shape)


@pytest.mark.parametrize("fmt", FORMATS, ids=repr)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_inject_matches_core_bit_for_bit(fmt, dtype):
    rng = np.random.default_rng(abs(hash((repr(fmt), dtype.__name__))) % 2**32)
    for fault, finite in itertools.product(FAULTS, (True, False)):
        if isinstance(fmt, bf.IntQuant) and not finite:
            continue  # the core refuses NaN/inf for IntQuant; see the next test
        x = _values(rng, (37, 29), dtype, finite=finite)
        fmap = bf.FaultMap.random(x.shape, fmt, ber=0.05, seed=int(rng.integers(1000)), name="t")
        with np.errstate(all="ignore"):
            expected = bf.inject(x, fmt, fault, fmap)
        got = inject_tensor(torch.from_numpy(x.copy()), fmt, fault, fmap).numpy()
        assert got.dtype == expected.dtype
        assert np.array_equal(_bits(got), _bits(expected)), (fault, finite)


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2", "float4_e2m1fn",
                                  "float8_e8m0fnu"])
def test_small_float_overflow_error_raises_the_core_error(name):
    fmt = bf.Float(name, "error")
    x = np.ones((3, 4), np.float32)
    fmap = bf.FaultMap.random(x.shape, fmt, ber=0.1, seed=0)
    got = inject_tensor(torch.from_numpy(x), fmt, bf.BitFlip(), fmap).numpy()
    assert np.array_equal(_bits(got), _bits(bf.inject(x, fmt, bf.BitFlip(), fmap)))
    x[1, 2] = -1.0 if name == "float8_e8m0fnu" else 1e30  # E8M0 stores no negative value
    with pytest.raises(ValueError) as core:
        bf.inject(x, fmt, bf.BitFlip(), fmap)
    with pytest.raises(ValueError, match=r"index \(1, 2\)") as got:
        inject_tensor(torch.from_numpy(x), fmt, bf.BitFlip(), fmap)
    assert str(got.value) == str(core.value)


def test_int_quant_refuses_non_finite_like_the_core():
    x = torch.tensor([[1.0, float("nan")], [0.5, 0.25]])
    fmap = bf.FaultMap.random((2, 2), bf.IntQuant(8), ber=0.1, seed=0)
    with pytest.raises(ValueError, match="not finite"):
        inject_tensor(x, bf.IntQuant(8), bf.BitFlip(), fmap)


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f.bits <= 32], ids=repr)
def test_group_pass_over_typical_weights_matches_core(fmt):
    """Flat float32 fast paths: in range (int32 words) and with a saturating value."""
    rng = np.random.default_rng(7)
    for fault in [*FAULTS, bf.BitFlip(bits="msb")]:
        for big in (False, True):
            xs = [(rng.standard_normal(s) * 0.05).astype(np.float32)
                  for s in [(50, 30), (7, 3), (3, 4, 5)]]
            if big:
                xs[1][3, 1] = 1e9
            maps = [bf.FaultMap.random(x.shape, fmt, ber=0.02, seed=i, name=f"t{i}")
                    for i, x in enumerate(xs)]
            faults = DeviceFaults.build(maps, fault.eligible_mask(fmt), "cpu")
            outs = faulty_group([torch.from_numpy(x) for x in xs], fmt, fault, faults)
            for x, fmap, out in zip(xs, maps, outs, strict=True):
                expected = bf.inject(x, fmt, fault, fmap)
                assert np.array_equal(_bits(out.numpy()), _bits(expected)), (fault, big)


@pytest.mark.parametrize("fmt", [bf.IntQuant(8), bf.IntQuant(8, symmetric=False),
                                 bf.IntQuant(8, per_channel=True),
                                 bf.IntQuant(4, symmetric=False, per_channel=True)], ids=repr)
def test_int_quant_zero_and_tiny_slices_use_the_eps_scale_like_the_core(fmt):
    x = (np.random.default_rng(5).standard_normal((6, 9)) * 0.1).astype(np.float32)
    x[1] = 0.0
    x[4] = 1e-9
    tensors = [x, np.zeros((6, 9), np.float32), np.full((3, 9), -1e-10, np.float32)]
    for i, arr in enumerate(tensors):
        fmap = bf.FaultMap.random(arr.shape, fmt, ber=0.3, seed=i, name="z")
        expected = bf.inject(arr, fmt, bf.BitFlip(), fmap)
        got = inject_tensor(torch.from_numpy(arr.copy()), fmt, bf.BitFlip(), fmap).numpy()
        faults = DeviceFaults.build([fmap], bf.BitFlip().eligible_mask(fmt), "cpu")
        grouped = faulty_group([torch.from_numpy(arr)], fmt, bf.BitFlip(), faults)[0].numpy()
        assert np.array_equal(_bits(got), _bits(expected))
        assert np.array_equal(_bits(grouped), _bits(expected))
        if not arr.any():
            assert np.abs(got).max() <= 255 * fmt.min_scale


@pytest.mark.parametrize("fmt", FORMATS, ids=repr)
def test_bfloat16_is_float32_rounded_back(fmt):
    rng = np.random.default_rng(3)
    x = torch.from_numpy(_values(rng, (40, 25), np.float32, finite=True)).to(torch.bfloat16)
    fmap = bf.FaultMap.random((40, 25), fmt, ber=0.05, seed=3, name="b")
    got = inject_tensor(x, fmt, bf.BitFlip(), fmap)
    expected = torch.from_numpy(bf.inject(x.float().numpy(), fmt, bf.BitFlip(), fmap))
    assert got.dtype == torch.bfloat16
    assert torch.equal(got.view(torch.int16), expected.to(torch.bfloat16).view(torch.int16))


def test_inject_checks_its_arguments():
    fmt, fault = bf.FixedPoint(16, 8), bf.BitFlip()
    fmap = bf.FaultMap.random((4, 4), fmt, ber=0.1, seed=0)
    with pytest.raises(TypeError, match="floating tensor"):
        inject_tensor(torch.zeros(4, 4, dtype=torch.int32), fmt, fault, fmap)
    with pytest.raises(ValueError, match="shape"):
        inject_tensor(torch.zeros(4, 5), fmt, fault, fmap)
    with pytest.raises(TypeError, match="torch.Tensor"):
        inject_tensor(np.zeros((4, 4), np.float32), fmt, fault, fmap)
    wide = bf.FaultMap.random((4, 4), bf.FixedPoint(32, 8), ber=0.5, seed=0)
    with pytest.raises(ValueError, match="above bit 15"):
        inject_tensor(torch.zeros(4, 4), fmt, fault, wide)


def test_inject_leaves_its_input_alone():
    x = torch.randn(64, 64)
    before = x.clone()
    fmap = bf.FaultMap.random((64, 64), bf.FixedPoint(32, 28), ber=0.01, seed=0)
    inject_tensor(x, bf.FixedPoint(32, 28), bf.BitFlip(), fmap)
    assert torch.equal(x, before)

