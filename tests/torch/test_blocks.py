"""The PyTorch adapter on block formats: every plane faulted, bit for bit the NumPy core.

The reference is ``bitfault.inject`` / ``StoredArray`` (the core, tested against the
formats' specifications and libraries in tests/formats): ``inject_tensor``, ``inject_``
(weights, activations, permanent and transient maps), ``quantised_weights``, ``fit`` and
``TorchEvaluator`` must give its bits exactly (compared as int32 / int16 / int64 views).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from torch_helpers import bits_equal, core_faulty  # noqa: E402

import bitfault as bf  # noqa: E402
import blockfmt  # noqa: E402
from bitfault.errors import ArgumentError  # noqa: E402
from bitfault.formats import GGUF, MX, NVFP4, GroupwiseInt  # noqa: E402
from bitfault.torch import inject_, inject_tensor, quantised_weights  # noqa: E402
from bitfault.torch.kernels import blocks as block_ops  # noqa: E402
from bitfault.torch.seam import DeviceFaults, faulty_group  # noqa: E402

MX_ELEMENTS = ("float8_e4m3fn", "float8_e5m2", "float6_e2m3fn", "float6_e3m2fn",
               "float4_e2m1fn", "int8")
FORMATS = [*(MX(e) for e in MX_ELEMENTS), NVFP4(), GGUF("q8_0"), GGUF("q4_0"),
           GGUF("q4_1"), GroupwiseInt(4, 32), GroupwiseInt(3, 16, symmetric=False),
           blockfmt.Toy()]
IDS = [f"{type(f).__name__}-{getattr(f, 'element', getattr(f, 'type', ''))}"
       f"{getattr(f, 'bits', '')}" for f in FORMATS]
FAULTS = [bf.BitFlip(), bf.StuckAt(0), bf.StuckAt(1)]
# per-plane rates: codes only, scales only (every other plane), all planes alike, mixed
RATES = [{"codes": 0.02}, "others", 0.03, "mixed"]


def _rates(fmt, which):
    others = [p for p in fmt.plane_names if p != "codes"]
    if which == "others":
        return dict.fromkeys(others, 0.2)
    if which == "mixed":
        return {"codes": 0.01, **dict.fromkeys(others, 0.05)}
    return which


def _data(shape, seed):
    """Values over many magnitudes, a zero block, negative zeros, ties of magnitude."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape) * rng.choice([1e-3, 1.0, 300.0], size=shape)
    x = x.astype(np.float32)
    flat = x.reshape(-1)
    flat[:40] = 0.0
    flat[5:9] = -0.0
    flat[50:52] = [2.5, -2.5]
    return x


def _same(got: torch.Tensor, want: np.ndarray) -> bool:
    return bits_equal(got, torch.from_numpy(np.ascontiguousarray(want)))


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_inject_tensor_equals_the_core_in_every_plane(fmt):
    cases = [((6, 70), -1), ((6, 70), 0), ((3, 37, 4), 1), ((2, 64), -1)]
    for (shape, axis), seed in zip(cases, range(4), strict=True):
        f = dataclasses.replace(fmt, axis=axis)
        x = _data(shape, seed)
        for fault in FAULTS:
            for which in RATES:
                fmap = bf.FaultMap.random(shape, f, ber=_rates(f, which), seed=seed, name="w")
                got = inject_tensor(torch.from_numpy(x), f, fault, fmap)
                assert _same(got, bf.inject(x, f, fault, fmap)), (f, shape, fault, which)


def _explicit(fmt, shape, codes=(), planes=None):
    """A map with the given (flat index, mask) faults per plane."""
    shapes = fmt.plane_shapes(shape)
    pm = {p: bf.FaultMap(shapes[p], [i for i, _ in f], [m for _, m in f], f"w:{p}")
          for p, f in (planes or {}).items()}
    return bf.FaultMap(shape, [i for i, _ in codes], [m for _, m in codes], "w", planes=pm)


@pytest.mark.parametrize("fmt", [MX("float8_e4m3fn"), MX("int8"), NVFP4(), GGUF("q4_1"),
                                 GroupwiseInt(8, 32, symmetric=False)])
def test_nan_and_inf_words_decode_as_the_core_decodes_them(fmt):
    """Every bit of a scale word stuck at 1 (E8M0 0xFF and E4M3 0x7F: NaN; fp16: NaN), its
    exponent bits set (fp16 inf), element codes stuck at their NaN patterns, the NVFP4
    tensor scale made inf, NaN, negative and one."""
    shape = (4, 64)
    x = _data(shape, 7)
    width = {p.name: p.format.word_mask for p in fmt.planes}
    planes = {p: [(0, width[p]), (1, 0x7F & width[p]), (3, 0x7C00 & width[p] or 0x7E)]
              for p in fmt.plane_names if p not in ("codes", "tensor_scale")}
    codes = [(0, 0x7F & width["codes"]), (70, width["codes"]), (200, 0x78 & width["codes"])]
    cases = [_explicit(fmt, shape, codes, planes)]
    if isinstance(fmt, NVFP4):
        cases += [_explicit(fmt, shape, [(3, 0xF)], {"tensor_scale": [(0, m)]})
                  for m in (0x7F800000, 0x7FC00001, 0x80000000, 0x3F800000)]
        cases.append(_explicit(fmt, shape, codes, {**planes, "tensor_scale": [(0, 0x7FA00000)]}))
    for fmap in cases:
        for fault in (bf.StuckAt(1), bf.BitFlip()):
            want = bf.inject(x, fmt, fault, fmap)
            assert _same(inject_tensor(torch.from_numpy(x), fmt, fault, fmap), want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("fmt", [MX("float4_e2m1fn"), NVFP4(), GGUF("q8_0"),
                                 GroupwiseInt(4, 32)])
def test_other_dtypes_go_through_float32_as_the_core_does(fmt, dtype):
    x = torch.from_numpy(_data((5, 96), 3)).to(dtype)
    fmap = bf.FaultMap.random((5, 96), fmt, ber=0.05, seed=1, name="w")
    spec = bf.FaultSpec(format=fmt, maps={"w": fmap})
    got = inject_tensor(x, fmt, bf.BitFlip(), fmap)
    assert got.dtype == dtype
    assert bits_equal(got, core_faulty(x, spec, fmap))


def test_a_format_without_a_native_kernel_runs_the_core_on_the_host():
    @dataclasses.dataclass(frozen=True)
    class MyMX(MX):  # a subclass may change the arithmetic: never the MX kernel
        pass

    for fmt in (blockfmt.Toy(axis=0), MyMX("float4_e2m1fn", axis=-1)):
        assert not block_ops.native(fmt)
        x = _data((8, 40), 2)
        fmap = bf.FaultMap.random(x.shape, fmt, ber=0.05, seed=3, name="w")
        assert _same(inject_tensor(torch.from_numpy(x), fmt, bf.BitFlip(), fmap),
                     bf.inject(x, fmt, bf.BitFlip(), fmap))
    assert all(block_ops.native(f) for f in FORMATS[:-1])


def test_block_positions_name_the_words_storedblocks_faults():
    """Independently of the kernels: each fault's block-form position holds the word the
    core's tensor form has at the fault's index."""
    fmt = GGUF("q4_1", axis=1)
    x = _data((3, 70, 2), 4)
    fmap = bf.FaultMap.random(x.shape, fmt, ber=0.05, seed=0, name="w")
    lay = fmt.layout(x.shape)
    words = fmt.encode(x)
    block = fmt.to_block_form(lay, words)
    for plane, (pos, masks) in block_ops.block_positions(fmap, fmt, bf.BitFlip(), lay).items():
        pmap = fmap.plane(plane)
        assert np.array_equal(masks, pmap.masks.astype(np.int64))
        tensor_form = np.asarray(words[plane]).reshape(-1)[pmap.indices]
        width = fmt.plane(plane).format.bits
        assert np.array_equal(block[plane].reshape(-1)[pos],
                              tensor_form.astype(np.int64) & ((1 << width) - 1))


def test_bad_input_raises_the_cores_errors():
    x = torch.zeros(4, 32)
    x[1, 3] = float("nan")
    fmt = MX("float8_e4m3fn")
    with pytest.raises(ValueError, match="NaN or infinite"):
        inject_tensor(x, fmt, bf.BitFlip(), bf.FaultMap.empty((4, 32)))
    big = torch.full((2, 32), 1e6)
    with pytest.raises(ArgumentError, match="float16"):
        inject_tensor(big, GroupwiseInt(4, 32), bf.BitFlip(), bf.FaultMap.empty((2, 32)))
    with pytest.raises(ArgumentError, match="axis"):
        inject_tensor(torch.zeros(4), MX(axis=1), bf.BitFlip(), bf.FaultMap.empty((4,)))
    faults = DeviceFaults.build([bf.FaultMap.empty((4, 32))], 0xFF, "cpu")
    with pytest.raises(ValueError, match="DeviceFaults.of"):
        faulty_group([torch.zeros(4, 32)], fmt, bf.BitFlip(), faults)


# ---- inject_ on models -----------------------------------------------------------------------

def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(40, 48), nn.ReLU(), nn.Linear(48, 10))


def _cnn():
    torch.manual_seed(1)
    return nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Conv2d(8, 16, 3), nn.Flatten(),
                         nn.Linear(16 * 4 * 4, 10))


def _capture(model):
    """The weights each Linear/Conv sees in its forward, by parameter name."""
    seen, hooks = {}, []
    for name, m in model.named_modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            hooks.append(m.register_forward_pre_hook(
                lambda mod, args, name=name: seen.update(
                    {f"{name}.weight": mod.weight.detach().clone(),
                     f"{name}.bias": mod.bias.detach().clone()})))
    return seen, hooks


@pytest.mark.parametrize("fmt", [MX("float4_e2m1fn"), NVFP4(), GGUF("q4_1"),
                                 GroupwiseInt(4, 32, symmetric=False)])
def test_inject_puts_the_cores_faulty_weights_into_mlp_and_cnn(fmt):
    for model, x in ((_mlp(), torch.randn(5, 40)), (_cnn(), torch.randn(2, 1, 8, 8))):
        spec = bf.FaultSpec(format=fmt, ber={"codes": 0.02, "scale": 0.02}, seed=4,
                            targets="weights+biases")
        clean = {n: p.detach().clone() for n, p in model.named_parameters()}
        seen, hooks = _capture(model)
        with inject_(model, spec) as handle:
            model(x)
            assert set(seen) == set(handle.maps)
            for name, w in seen.items():
                assert bits_equal(w, core_faulty(clean[name], spec, handle.maps[name])), name
        for h in hooks:
            h.remove()


def test_transient_maps_are_the_specs_maps_of_each_step():
    fmt = MX("float4_e2m1fn")
    model = _mlp()
    spec = bf.FaultSpec(format=fmt, ber={"codes": 0.01, "scale": 0.1}, seed=2,
                        persistence="transient",  # low scale bits: the weights stay finite
                        fault=bf.BitFlip(bits=["codes", "scale.0", "scale.1"]))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen, hooks = _capture(model)
    with inject_(model, spec) as handle:
        for step in range(3):
            clean = {n: p.detach().clone() for n, p in model.named_parameters()}
            opt.zero_grad()
            model(torch.randn(8, 40)).square().mean().backward()
            assert handle.step == step
            for name in ("0.weight", "2.weight"):
                want = spec.map_for(name, tuple(clean[name].shape), step)
                assert handle.maps[name] == want and want.planes["scale"].n_faults
                assert bits_equal(seen[name], core_faulty(clean[name], spec, want))
            assert model[0].weight.grad is not None and model[0].weight.grad.abs().sum() > 0
            opt.step()
    for h in hooks:
        h.remove()


def test_activation_targets_fault_every_plane_of_the_batch():
    fmt = NVFP4()
    model = _mlp()
    spec = bf.FaultSpec(format=fmt, ber={"codes": 0.05, "scale": 0.1, "tensor_scale": 0.2},
                        seed=1, targets="activations")
    x = torch.randn(6, 40)
    clean_out = model[0](x).detach()
    with inject_(model, spec, filter_fn=["0"]) as handle:
        outputs = []
        hook = model[0].register_forward_hook(lambda m, a, out: outputs.append(out.detach()))
        model(x)
        hook.remove()
        fmap = handle.maps["0.output"]
    from bitfault.torch.handle import batch_map
    assert bits_equal(outputs[0], core_faulty(clean_out, spec, batch_map(fmap, 6)))
    with pytest.raises(ArgumentError, match="negative axis"):
        inject_(model, spec.replace(format=NVFP4(axis=1)), filter_fn=["0"])


def test_explicit_plane_maps_by_name_reach_inject_():
    fmt = GGUF("q8_0")
    model = _mlp()
    shapes = fmt.plane_shapes((48, 40))
    maps = {"0.weight:scale": bf.FaultMap(shapes["scale"], [3], [1 << 14], "0.weight:scale")}
    spec = bf.FaultSpec(format=fmt, maps=maps)
    seen, hooks = _capture(model)
    clean = model[0].weight.detach().clone()
    with inject_(model, spec) as handle:
        model(torch.randn(2, 40))
        assert handle.maps["0.weight"].planes["scale"] == maps["0.weight:scale"]
        assert bits_equal(seen["0.weight"], core_faulty(clean, spec, handle.maps["0.weight"]))
        assert not bits_equal(seen["0.weight"], inject_tensor(
            clean, fmt, bf.BitFlip(), bf.FaultMap.empty((48, 40))))
    for h in hooks:
        h.remove()


def test_quantised_weights_equal_the_core_and_pass_the_gradient_everywhere():
    fmt = GroupwiseInt(4, 32)
    model = _mlp()
    maps = {"0.weight": bf.FaultMap.random((48, 40), fmt, ber=0.05, seed=0, name="0.weight")}
    q = quantised_weights(model, fmt, maps)
    spec = bf.FaultSpec(format=fmt, maps=maps)
    assert bits_equal(q["0.weight"], core_faulty(model[0].weight, spec, maps["0.weight"]))
    (q["0.weight"].sum() + q["2.weight"].sum()).backward()
    assert torch.equal(model[0].weight.grad, torch.ones_like(model[0].weight))
    assert bf.formats.gradient_bounds(fmt) is None


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2", "float6_e2m3fn",
                                  "float6_e3m2fn", "float4_e2m1fn", "float8_e8m0fnu"])
def test_small_float_tensors_take_the_cores_rounding_table(name):
    """Float small formats on float32 share the block kernels' table encode."""
    fmt = bf.Float(name)
    x = _data((30, 50), 5) * np.float32(0.01)
    x.reshape(-1)[60:66] = [np.nan, np.inf, -np.inf, 1e38, -1e-40, 448.0]
    for fault in FAULTS:
        fmap = bf.FaultMap.random(x.shape, fmt, ber=0.05, seed=1, name="w")
        assert _same(inject_tensor(torch.from_numpy(x), fmt, fault, fmap),
                     bf.inject(x, fmt, fault, fmap))
