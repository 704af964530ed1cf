"""inject_ and FaultHandle: faulty forwards bit for bit, clean state, steering, bad input."""

import copy
import io

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
nn = torch.nn

from torch_helpers import bits_equal, core_faulty, hook_state, mlp, same_state, snapshot  # noqa: E402

import bitfault as bf  # noqa: E402
from bitfault.torch import DEFAULT_MODULES, FaultHandle, batch_map, inject_  # noqa: E402

SEED_FMT = bf.FixedPoint(32, 28, rounding="trunc")
ALL = ("weights", "biases", "activations")


def _spec(**kw):
    kw.setdefault("format", SEED_FMT)
    kw.setdefault("ber", 0.01)
    kw.setdefault("seed", 1)
    return bf.FaultSpec(**kw)


# ---- forward values ---------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", [SEED_FMT, bf.IntQuant(8), bf.IntQuant(4, symmetric=False),
                                 bf.Float("float32"), bf.Float("float16", ),
                                 bf.FixedPoint(8, 6, overflow="wrap")], ids=repr)
def test_mlp_forward_equals_core_bit_for_bit(fmt):
    model = mlp()
    spec = _spec(format=fmt, targets=ALL)
    handle = inject_(model, spec)
    x = torch.randn(8, 20)
    out = model(x)
    m = handle.maps
    h = F.linear(x, core_faulty(model[0].weight, spec, m["0.weight"]),
                 core_faulty(model[0].bias, spec, m["0.bias"]))
    h = torch.relu(core_faulty(h, spec, batch_map(m["0.output"], 8)))
    y = F.linear(h, core_faulty(model[2].weight, spec, m["2.weight"]),
                 core_faulty(model[2].bias, spec, m["2.bias"]))
    assert bits_equal(out, core_faulty(y, spec, batch_map(m["2.output"], 8)))


def test_conv_and_embedding_forward_equal_core():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
    spec = _spec(format=bf.IntQuant(8, per_channel=True), targets=("weights", "biases"))
    handle = inject_(model, spec)
    x = torch.randn(3, 1, 8, 8)
    m = handle.maps
    h = F.conv2d(x, core_faulty(model[0].weight, spec, m["0.weight"]),
                 core_faulty(model[0].bias, spec, m["0.bias"]))
    y = F.linear(torch.relu(h).flatten(1), core_faulty(model[3].weight, spec, m["3.weight"]),
                 core_faulty(model[3].bias, spec, m["3.bias"]))
    assert bits_equal(model(x), y)

    emb = nn.Embedding(30, 6)
    spec = _spec(format=bf.FixedPoint(16, 12), targets=("weights", "activations"), ber=0.05)
    handle = inject_(emb, spec)
    idx = torch.randint(0, 30, (4, 7))
    out = emb(idx)
    ref = F.embedding(idx, core_faulty(emb.weight, spec, handle.maps["weight"]))
    assert bits_equal(out, core_faulty(ref, spec, batch_map(handle.maps["output"], 4)))
    assert handle.maps["output"].shape == (7, 6)  # one sample: output.shape[1:]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("fmt", [SEED_FMT, bf.IntQuant(8), bf.Float("bfloat16")], ids=repr)
def test_parameter_dtypes(dtype, fmt):
    model = mlp().to(dtype)
    spec = _spec(format=fmt, targets=("weights", "biases"), ber=0.02)
    handle = inject_(model, spec)
    x = torch.randn(5, 20, dtype=dtype)
    m = handle.maps
    h = torch.relu(F.linear(x, core_faulty(model[0].weight, spec, m["0.weight"]),
                            core_faulty(model[0].bias, spec, m["0.bias"])))
    y = F.linear(h, core_faulty(model[2].weight, spec, m["2.weight"]),
                 core_faulty(model[2].bias, spec, m["2.bias"]))
    out = model(x)
    assert out.dtype == dtype and bits_equal(out, y)


def test_model_to_after_inject_follows_dtype_and_device():
    model = mlp()
    spec = _spec(format=bf.FixedPoint(16, 12), targets=("weights",))
    handle = inject_(model, spec)
    model.double()
    x = torch.randn(4, 20, dtype=torch.float64)
    w = core_faulty(model[0].weight, spec, handle.maps["0.weight"])
    ref = F.linear(torch.relu(F.linear(x, w, model[0].bias)),
                   core_faulty(model[2].weight, spec, handle.maps["2.weight"]), model[2].bias)
    assert bits_equal(model(x), ref)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_masks_move_with_the_model():
    model = mlp()
    spec = _spec(format=bf.IntQuant(8), targets=ALL)
    handle = inject_(model, spec)
    x = torch.randn(6, 20)
    on_cpu = model(x)
    model.cuda()
    on_gpu = model(x.cuda())
    assert torch.allclose(on_gpu.cpu(), on_cpu, atol=1e-5)
    assert {k[2].type for k in handle._faults} >= {"cuda"}
    w = model[0].weight
    faulty = bf.torch.inject_tensor(w, spec.format, spec.fault, handle.maps["0.weight"])
    assert faulty.is_cuda
    assert bits_equal(faulty.cpu(), core_faulty(w.cpu(), spec, handle.maps["0.weight"]))


def test_activation_intquant_scale_comes_from_the_whole_output():
    model = nn.Linear(10, 6)
    spec = _spec(format=bf.IntQuant(8), targets=("activations",), ber=0.05)
    handle = inject_(model, spec)
    x = torch.randn(7, 10)
    assert "output" not in handle.maps  # an activation map appears with the first output
    out = model(x)
    assert handle.maps["output"].shape == (6,)
    clean = F.linear(x, model.weight, model.bias)
    expected = bf.inject(clean.detach().numpy(), spec.format, spec.fault,
                         batch_map(handle.maps["output"], 7))
    assert bits_equal(out, torch.from_numpy(expected))


# ---- the model stays clean ---------------------------------------------------------------------

def test_default_filter_and_names():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(2, 3, 3), nn.Conv2d(2, 3, 3), nn.Conv3d(2, 3, 3),
                          nn.Embedding(5, 4), nn.Linear(3, 3), nn.LayerNorm(3), nn.ReLU())
    handle = inject_(model, _spec(targets=ALL))
    assert set(DEFAULT_MODULES) == {nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Embedding}
    assert handle.targets == ["0.weight", "0.bias", "1.weight", "1.bias", "2.weight", "2.bias",
                              "3.weight", "4.weight", "4.bias", "0.output", "1.output",
                              "2.output", "3.output", "4.output"]
    assert set(handle.maps) == {t for t in handle.targets if not t.endswith("output")}


def test_filter_fn_callable_and_glob():
    model = mlp()
    h = inject_(model, _spec(), filter_fn=lambda m, name: name == "2")
    assert h.targets == ["2.weight"]
    h.remove()
    h = inject_(model, _spec(targets=("weights", "biases")), filter_fn="0")
    assert h.targets == ["0.weight", "0.bias"]
    h.remove()
    ln = nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3))  # any parameter named *weight / *bias
    h = inject_(ln, _spec(), filter_fn=lambda m, name: isinstance(m, nn.LayerNorm))
    assert h.targets == ["1.weight"]


def test_weights_state_dict_and_hooks_stay_clean(rng):
    model = mlp()
    before, hooks = snapshot(model), hook_state(model)
    handle = inject_(model, _spec(targets=ALL))
    model(torch.randn(3, 20)).sum().backward()
    assert same_state(model, before)  # clean weights, unchanged keys
    assert all(isinstance(model[i].weight, nn.Parameter) for i in (0, 2))
    handle.remove()
    assert same_state(model, before) and hook_state(model) == hooks
    x = torch.randn(4, 20)
    assert bits_equal(model(x), mlp()(x))  # the clean forward again
    handle.remove()  # idempotent


def test_remove_after_training_keeps_the_trained_clean_weights():
    model = mlp()
    handle = inject_(model, _spec())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(8, 20)).pow(2).mean().backward()
        opt.step()
    trained = snapshot(model)
    handle.remove()
    assert same_state(model, trained)
    assert not same_state(mlp(), trained)


@pytest.mark.parametrize("fmt", [SEED_FMT, bf.IntQuant(8)], ids=repr)
def test_reused_buffers_never_overwrite_a_live_graph(fmt):
    """The kernels keep host scratch from forward to forward; what a forward handed out
    (and a graph kept alive saved) is never written again."""
    model = mlp()
    spec = _spec(format=fmt)
    handle = inject_(model, spec)
    x = torch.randn(8, 20)
    seen = []
    capture = model[0].register_forward_pre_hook(lambda mod, args: seen.append(mod.weight))
    out1 = model(x)  # graph 1 alive (saves the faulty weights)
    first = seen[-1].detach().clone()
    with torch.no_grad():
        model[0].weight.add_(0.5)  # another clean value: another faulty value
    out2 = model(x)
    assert bits_equal(seen[-2], first)  # forward 2 did not write into forward 1's tensors
    assert bits_equal(seen[-1], core_faulty(model[0].weight, spec, handle.maps["0.weight"]))
    out1.sum().backward()  # the saved tensors were not modified in place
    out2.sum().backward()
    seen.clear()
    for _ in range(3):  # nothing alive any more: reuse, still exact
        model(x).sum().backward()
        assert bits_equal(seen.pop(), core_faulty(model[0].weight, spec, handle.maps["0.weight"]))
    capture.remove()
    handle.remove()


def test_state_dict_round_trip():
    model = mlp()
    spec = _spec(targets=("weights", "biases"))
    handle = inject_(model, spec)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    fresh = nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 4))
    fresh.load_state_dict(torch.load(io.BytesIO(buf.getvalue())))
    assert same_state(fresh, snapshot(mlp()))  # what was saved is clean
    # loading into the injected model: the next forward faults the loaded weights
    other = copy.deepcopy(fresh)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(0.5)
    model.load_state_dict(other.state_dict())
    x = torch.randn(3, 20)
    w0 = core_faulty(model[0].weight, spec, handle.maps["0.weight"])
    b0 = core_faulty(model[0].bias, spec, handle.maps["0.bias"])
    w2 = core_faulty(model[2].weight, spec, handle.maps["2.weight"])
    b2 = core_faulty(model[2].bias, spec, handle.maps["2.bias"])
    assert bits_equal(model(x), F.linear(torch.relu(F.linear(x, w0, b0)), w2, b2))


def test_no_grad_eval_and_context_manager():
    model = mlp()
    x = torch.randn(4, 20)
    with inject_(model, _spec(targets=ALL)) as handle:
        assert isinstance(handle, FaultHandle)
        with torch.no_grad():
            y = model(x)
        assert y.grad_fn is None
        assert bits_equal(y, model(x))  # same values with autograd on
        assert not bits_equal(y, mlp()(x))
    assert hook_state(model) == hook_state(mlp())
    with pytest.raises(RuntimeError, match="removed"):
        handle.set_ber(0.1)


def test_submodule_called_on_its_own_is_faulted_too():
    model = mlp()
    spec = _spec()
    handle = inject_(model, spec)
    x = torch.randn(2, 20)
    expected = F.linear(x, core_faulty(model[0].weight, spec, handle.maps["0.weight"]),
                        model[0].bias)
    assert bits_equal(model[0](x), expected)
    assert "weight" not in model[0].__dict__


def test_tied_weights_share_one_map():
    emb = nn.Embedding(10, 4)
    out = nn.Linear(4, 10, bias=False)
    out.weight = emb.weight
    model = nn.ModuleDict({"emb": emb, "out": out})
    handle = inject_(model, _spec(ber=0.05))
    assert handle.targets == ["emb.weight"]
    idx = torch.arange(10)
    faulty = core_faulty(emb.weight, handle.spec, handle.maps["emb.weight"])
    assert bits_equal(model["emb"](idx), F.embedding(idx, faulty))
    assert bits_equal(model["out"](torch.eye(4)), F.linear(torch.eye(4), faulty))


# ---- steering ------------------------------------------------------------------------------------

def test_set_ber_is_nested():
    model = mlp(hidden=64)
    handle = inject_(model, _spec(ber=1e-3))
    low = handle.maps
    handle.set_ber(1e-2)
    high = handle.maps
    for name, m in low.items():
        hi_masks = dict(zip(high[name].indices.tolist(), high[name].masks.tolist(), strict=True))
        for i, mask in zip(m.indices.tolist(), m.masks.tolist(), strict=True):
            assert hi_masks[i] & mask == mask
    assert handle.n_faults > sum(m.n_faults for m in low.values())
    with pytest.raises(ValueError, match="ber"):
        handle.set_ber(2.0)
    assert handle.maps["0.weight"] == high["0.weight"]  # a refused rate changes nothing


def test_resample_step_maps_are_replayable():
    model = mlp()
    spec = _spec(persistence="transient", ber=0.02)
    handle = inject_(model, spec)
    m0 = handle.maps
    handle.resample(5)
    assert handle.step == 5
    assert handle.maps["0.weight"] == spec.map_for("0.weight", (16, 20), step=5)
    assert handle.maps["0.weight"] != m0["0.weight"]
    handle.resample(0)
    assert handle.maps == m0
    permanent = inject_(mlp(), _spec())
    with pytest.raises(ValueError, match="transient"):
        permanent.resample(1)
    with pytest.raises(ValueError, match="step"):
        handle.resample(-1)


def test_attach_resamples_after_each_optimizer_step():
    model = mlp()
    spec = _spec(persistence="transient", ber=0.02)
    handle = inject_(model, spec)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    handle.attach(opt)
    for k in range(1, 4):
        opt.zero_grad()
        model(torch.randn(2, 20)).sum().backward()
        opt.step()
        assert handle.step == k
        assert handle.maps["2.weight"] == spec.map_for("2.weight", (4, 16), step=k)
    handle.remove()
    opt.step()
    assert handle.step == 3  # the optimizer hook went with remove()
    with pytest.raises(ValueError, match="transient"):
        inject_(mlp(), _spec()).attach(opt)


def test_transient_steps_follow_weight_updates_without_attach():
    """No attach(): a forward after the parameters changed uses the next step's maps
    (optimizer steps, manual in-place updates, replaced tensors); gradient accumulation
    (no update between forwards) keeps the step."""
    spec = _spec(persistence="transient", ber=0.02)
    runs = []
    for _ in range(2):
        model = mlp()
        handle = inject_(model, spec)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        torch.manual_seed(3)
        losses = []
        for k in range(3):
            for _ in range(2):  # two micro-batches, one update
                loss = model(torch.randn(2, 20)).square().sum()
                assert handle.step == k
                assert handle.maps["2.weight"] == spec.map_for("2.weight", (4, 16), step=k)
                loss.backward()
                losses.append(loss.detach())
            opt.step()
            opt.zero_grad()
        runs.append(losses)
        model(torch.randn(1, 20))
        assert handle.step == 3
        with torch.no_grad():
            model[0].weight -= 0.01  # a manual update
        model(torch.randn(1, 20))
        assert handle.step == 4
        model[0].weight.data = model[0].weight.data.clone()  # a replaced tensor
        model(torch.randn(1, 20))
        model(torch.randn(1, 20))
        assert handle.step == 5
        handle.resample(9)  # an explicit step is kept, not counted again
        model(torch.randn(1, 20))
        assert handle.step == 9
    assert all(bits_equal(a, b) for a, b in zip(*runs, strict=True))


def test_transient_step_without_parameters_warns():
    spec = _spec(persistence="transient", ber=0.02, targets=("activations",))
    with pytest.warns(UserWarning, match=r"handle\.resample\(step\)"):
        inject_(nn.Sequential(nn.ReLU()), spec, filter_fn="0")


def test_forward_resampling_replays():
    spec = _spec(persistence="transient", resample="forward", targets=("weights", "activations"))
    x = torch.randn(3, 20)
    runs = []
    for _ in range(2):
        model = mlp()
        handle = inject_(model, spec)
        runs.append([model(x) for _ in range(3)])
        assert handle.step == 2
        assert handle.maps["0.output"] == spec.map_for("0.output", (16,), step=2)
    assert all(bits_equal(a, b) for a, b in zip(*runs, strict=True))
    assert not bits_equal(runs[0][0], runs[0][1])


def test_stats_count_faults_and_saturation():
    model = nn.Linear(8, 4)
    with torch.no_grad():
        model.weight[0, 0] = 100.0  # beyond FixedPoint(32, 28)'s +-8
    handle = inject_(model, _spec(ber=0.05, targets=("weights", "activations")), project=False)
    handle.track_activation_stats = True
    model(torch.randn(3, 8))
    stats = handle.stats()
    assert stats["weight"].faults == handle.maps["weight"].n_faults
    assert stats["weight"].saturated == 1
    assert stats["output"].faults == 3 * handle.maps["output"].n_faults
    assert "faulty bits" in repr(handle)


# ---- bad input: a clear error, the model untouched ----------------------------------------------

def _untouched(model, before, hooks):
    return same_state(model, before) and hook_state(model) == hooks


@pytest.mark.parametrize("case", [
    "nothing_matched", "map_shape", "unknown_map", "int_param", "axis", "count", "filter_type",
    "spec_type", "targets_nothing"])
def test_bad_input_is_refused_before_the_model_changes(case):
    model = mlp()
    before, hooks = snapshot(model), hook_state(model)
    fmt = SEED_FMT
    wrong = bf.FaultMap.random((3, 3), fmt, ber=0.1, seed=0)
    errors = {
        "nothing_matched": (ValueError, "matched no module",
                            lambda: inject_(model, _spec(), filter_fn=lambda m, n: False)),
        "map_shape": (ValueError, r"maps\['0.weight'\].*shape",
                      lambda: inject_(model, bf.FaultSpec(format=fmt, maps={"0.weight": wrong}))),
        "unknown_map": (ValueError, "fc9.weight",
                        lambda: inject_(model, bf.FaultSpec(
                            format=fmt, maps={"fc9.weight": wrong}))),
        "axis": (ValueError, "axis", lambda: inject_(model, _spec(
            format=bf.IntQuant(8, per_channel=3)))),
        "count": (ValueError, "count", lambda: inject_(model, bf.FaultSpec(
            format=fmt, count=10**9))),
        "filter_type": (TypeError, "filter_fn", lambda: inject_(model, _spec(), filter_fn=3)),
        "spec_type": (TypeError, "spec", lambda: inject_(model, "fixed point please")),
        "targets_nothing": (ValueError, "targets", lambda: inject_(
            model, _spec(), filter_fn=lambda m, n: isinstance(m, nn.ReLU))),
    }
    if case == "int_param":
        model[2].register_parameter("step_weight", nn.Parameter(
            torch.zeros(3, dtype=torch.int32), requires_grad=False))
        before, hooks = snapshot(model), hook_state(model)
        errors[case] = (TypeError, "2.step_weight.*int32", lambda: inject_(model, _spec()))
    exc, pattern, call = errors[case]
    with pytest.raises(exc, match=pattern):
        call()
    assert _untouched(model, before, hooks)
    inject_(model, _spec(), filter_fn="0").remove()  # and still usable


def test_second_injection_into_the_same_modules_is_refused():
    model = mlp()
    inject_(model, _spec())
    hooks = hook_state(model)
    with pytest.raises(ValueError, match="already has faults"):
        inject_(model, _spec(ber=0.1))
    assert hook_state(model) == hooks


def test_not_a_module_is_refused():
    with pytest.raises(TypeError, match="nn.Module"):
        inject_(lambda x: x, _spec())


def test_activation_map_that_does_not_fit_fails_at_forward_and_cleans_up():
    model = mlp()
    wrong = bf.FaultMap.random((5,), SEED_FMT, ber=0.5, seed=0, name="0.output")
    handle = inject_(model, bf.FaultSpec(format=SEED_FMT, maps={"0.output": wrong},
                                         targets=("weights", "activations")))
    with pytest.raises(ValueError, match=r"0.output.*shape"):
        model(torch.randn(2, 20))
    assert "weight" not in model[0].__dict__ and handle._shadowed == [] and handle._depth == 0
    handle.remove()
    assert hook_state(model) == hook_state(mlp())


def test_integer_activation_is_refused_at_forward():
    class Argmax(nn.Linear):
        def forward(self, x):
            return super().forward(x).argmax(-1)

    model = Argmax(4, 3)
    inject_(model, _spec(targets=("activations",)))
    with pytest.raises(TypeError, match="int64"):
        model(torch.randn(2, 4))


def test_a_deepcopy_is_faulted_alike_until_remove():
    model = mlp()
    handle = inject_(model, _spec(targets=("weights", "activations")))
    twin = copy.deepcopy(model)
    x = torch.randn(3, 20)
    assert bits_equal(twin(x), model(x))
    handle.remove()
    assert bits_equal(twin(x), mlp()(x))  # the copied hooks went inert
