"""CKA (Fed-LWR Eq. 2), the unbiased HSIC estimator, minibatch CKA and the layer hooks."""

import copy
import itertools
import pickle

import numpy as np
import pytest
import torch
from torch import nn

from fairfl.methods.fedlwr.cka import MinibatchCKA, layerwise_cka, linear_cka, parameter_layers, unbiased_hsic


def _rng(seed=0):
    return np.random.default_rng(seed)


def _orthogonal(d, rng):
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    return q


def _eq2_numpy(u, v):
    """Fed-LWR Eq. 2 written out: K = U U^T, L = V V^T, K' = HKH, HSIC = vec(K').vec(L')/(n-1)^2."""
    n = u.shape[0]
    k, l = u @ u.T, v @ v.T
    h = np.eye(n) - np.ones((n, n)) / n
    kc, lc = h @ k @ h, h @ l @ h

    def hsic(a, b):
        return a.reshape(-1) @ b.reshape(-1) / (n - 1) ** 2

    return hsic(kc, lc) / np.sqrt(hsic(kc, kc) * hsic(lc, lc))


def _unbiased_hsic_bruteforce(k, l):
    """Song et al. (2012) Thm. 3: the U-statistic over ordered 4-tuples of distinct indices."""
    n = k.shape[0]
    total = 0.0
    for t, u, v, w in itertools.permutations(range(n), 4):
        total += k[t, u] * l[t, u] + k[t, u] * l[v, w] - 2 * k[t, u] * l[t, v]
    return total / (n * (n - 1) * (n - 2) * (n - 3))


def _correlated(n, rng, d1=12, d2=9, noise=0.5):
    x = rng.standard_normal((n, d1))
    y = x @ rng.standard_normal((d1, d2)) + noise * rng.standard_normal((n, d2))
    return x, y


# --- linear_cka (full, Eq. 2) -------------------------------------------------------------------


def test_linear_cka_matches_eq2_written_out():
    rng = _rng(1)
    # Both code paths: n x n Gram matrices (n^2 <= d1 d2) and d1 x d2 cross-covariances.
    for n, d1, d2 in [(6, 3, 5), (10, 7, 4), (15, 20, 2), (6, 20, 30), (9, 81, 1)]:
        u, v = rng.standard_normal((n, d1)), rng.standard_normal((n, d2)) + 3.0
        assert linear_cka(u, v) == pytest.approx(_eq2_numpy(u, v), abs=1e-12)
    u, v = _correlated(30, rng)
    assert linear_cka(torch.tensor(u), torch.tensor(v)) == pytest.approx(_eq2_numpy(u, v), abs=1e-12)


def test_linear_cka_identical_and_invariances():
    rng = _rng(2)
    x, y = _correlated(40, rng)
    assert linear_cka(x, x) == pytest.approx(1.0, abs=1e-12)
    base = linear_cka(x, y)
    assert 0.2 < base < 0.999
    q = _orthogonal(x.shape[1], rng)
    assert linear_cka(x @ q, y) == pytest.approx(base, abs=1e-12)  # orthogonal transform
    assert linear_cka(7.5 * x, 0.01 * y) == pytest.approx(base, abs=1e-12)  # isotropic scaling
    assert linear_cka(x + 100.0, y - 3.0) == pytest.approx(base, abs=1e-10)  # translation


def test_linear_cka_accepts_any_feature_shape():
    x = torch.randn(8, 3, 4, 4)
    assert linear_cka(x, x.reshape(8, -1)) == pytest.approx(1.0, abs=1e-12)


def test_linear_cka_degenerate_inputs():
    x = torch.randn(10, 5)
    const = torch.full((10, 5), 3.0)
    assert linear_cka(const, torch.zeros(10, 2)) == 1.0  # both constant: the same (zero) representation
    assert linear_cka(const, const) == 1.0
    assert linear_cka(x, const) == 0.0  # one side carries no sample structure
    assert linear_cka(torch.zeros(10, 5), x) == 0.0
    with pytest.raises(ValueError):
        linear_cka(x, x[:9])


# --- unbiased HSIC ------------------------------------------------------------------------------


def test_unbiased_hsic_matches_u_statistic():
    rng = _rng(3)
    for n in (4, 5, 7):
        x, y = rng.standard_normal((n, 3)), rng.standard_normal((n, 4)) + 1.0
        k, l = x @ x.T, y @ y.T
        got = unbiased_hsic(torch.tensor(k), torch.tensor(l)).item()
        assert got == pytest.approx(_unbiased_hsic_bruteforce(k, l), rel=1e-10, abs=1e-12)


def test_unbiased_hsic_is_batched_and_translation_invariant():
    x, y = torch.randn(3, 8, 5, dtype=torch.float64), torch.randn(3, 8, 6, dtype=torch.float64)
    k, l = x @ x.transpose(1, 2), y @ y.transpose(1, 2)
    batched = unbiased_hsic(k, l)
    assert batched.shape == (3,)
    for i in range(3):
        assert batched[i].item() == pytest.approx(unbiased_hsic(k[i], l[i]).item(), rel=1e-12)
    xs = x[0] + 50.0  # linear-kernel HSIC does not see a common offset
    assert unbiased_hsic(xs @ xs.T, l[0]).item() == pytest.approx(batched[0].item(), rel=1e-8)
    with pytest.raises(ValueError):
        unbiased_hsic(k[0, :3, :3], l[0, :3, :3])


# --- MinibatchCKA -------------------------------------------------------------------------------


def _minibatch(x, y, batch=50, name="layer"):
    m = MinibatchCKA()
    for i in range(0, len(x), batch):
        m.update(name, torch.as_tensor(x[i : i + batch]), torch.as_tensor(y[i : i + batch]))
    return m.result()[name]


def test_minibatch_identical_and_invariances():
    rng = _rng(4)
    x, y = _correlated(400, rng)
    assert _minibatch(x, x) == pytest.approx(1.0, abs=1e-12)
    base = _minibatch(x, y)
    q = _orthogonal(x.shape[1], rng)
    # Per batch the Gram matrices are unchanged by Q and scaled by c^2: exact up to rounding.
    assert _minibatch(x @ q, y) == pytest.approx(base, abs=1e-10)
    assert _minibatch(3.0 * x, 0.2 * y) == pytest.approx(base, abs=1e-10)
    assert _minibatch(x - 20.0, y + 5.0) == pytest.approx(base, abs=1e-9)


def test_minibatch_approximates_full_cka_on_large_n():
    rng = _rng(5)
    x, y = _correlated(6000, rng, noise=1.5)
    full = linear_cka(x, y)
    assert 0.3 < full < 0.95
    assert _minibatch(x, y, batch=64) == pytest.approx(full, abs=0.02)
    assert _minibatch(x, y, batch=8) == pytest.approx(full, abs=0.03)


def test_minibatch_state_is_scalars_only():
    rng = _rng(6)
    m = MinibatchCKA()
    m.update("a", torch.randn(8, 3, 5, 5), torch.randn(8, 7))
    size_after_one = len(pickle.dumps(m))
    for _ in range(200):
        m.update("a", torch.randn(8, 3, 5, 5), torch.randn(8, 7))
    assert len(pickle.dumps(m)) == size_after_one  # nothing grows with the number of samples
    tensors = [v for v in vars(m).values() if isinstance(v, torch.Tensor)]
    assert not tensors
    assert all(isinstance(v, float) for sums in m._sums.values() for v in sums)
    assert 0.0 <= m.result()["a"] <= 1.0
    del rng


def test_minibatch_degenerate_inputs_stay_finite():
    m = MinibatchCKA()
    x = torch.randn(8, 6)
    assert m.update("small", x[:3], x[:3]) is False  # < 4 samples: skipped
    assert "small" not in m.result()
    for _ in range(3):
        m.update("both_const", torch.full((8, 6), 2.0), torch.zeros(8, 3))
        m.update("a_const", torch.ones(8, 6), torch.randn(8, 4))
        m.update("b_zero", torch.randn(8, 4), torch.zeros(8, 4))
        m.update("tiny_n", torch.randn(4, 4), torch.randn(4, 4))  # noisy, may go negative
    out = m.result()
    assert out["both_const"] == 1.0 and out["a_const"] == 0.0 and out["b_zero"] == 0.0
    assert all(0.0 <= v <= 1.0 for v in out.values())
    # Independent small batches push the unbiased estimate below 0 often: clamped, not NaN.
    torch.manual_seed(0)
    values = []
    for _ in range(50):
        mm = MinibatchCKA()
        mm.update("x", torch.randn(4, 2), torch.randn(4, 2))
        values.append(mm.result()["x"])
    assert all(0.0 <= v <= 1.0 for v in values) and min(values) == 0.0
    with pytest.raises(ValueError):
        m.update("mismatch", torch.randn(8, 2), torch.randn(6, 2))


# --- parameter_layers and layerwise_cka on MONAI's UNet -----------------------------------------


def _unet():
    from monai.networks.nets import UNet

    torch.manual_seed(0)
    return UNet(
        spatial_dims=2,
        in_channels=1,
        out_channels=2,
        channels=(16, 32, 64, 128, 256),
        strides=(2, 2, 2, 2),
        num_res_units=2,
    )


@pytest.fixture(scope="module")
def unet():
    return _unet()


def test_parameter_layers_cover_unet_state_dict_once(unet):
    layers = parameter_layers(unet)
    keys = [k for ks in layers.values() for k in ks]
    assert sorted(keys) == sorted(unet.state_dict())
    assert len(keys) == len(set(keys))
    modules = dict(unet.named_modules())
    kinds = {type(modules[name]).__name__ for name in layers}
    assert kinds == {"Conv2d", "ConvTranspose2d", "PReLU"}  # instance norms own no state here
    for name, ks in layers.items():
        own = [f"{name}.{p}" for p, _ in modules[name].named_parameters(recurse=False)]
        own += [f"{name}.{b}" for b, _ in modules[name].named_buffers(recurse=False)]
        assert sorted(ks) == sorted(own)


def test_parameter_layers_include_batchnorm_buffers():
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1))
    layers = parameter_layers(model)
    assert list(layers) == ["0", "1", "3"]
    assert layers["1"] == ["1.weight", "1.bias", "1.running_mean", "1.running_var", "1.num_batches_tracked"]


def test_each_unet_layer_runs_once_per_forward(unet):
    calls = {name: 0 for name in parameter_layers(unet)}
    modules = dict(unet.named_modules())
    handles = [modules[n].register_forward_hook(lambda *a, n=n: calls.__setitem__(n, calls[n] + 1)) for n in calls]
    try:
        with torch.no_grad():
            unet.eval()(torch.randn(2, 1, 32, 32))
    finally:
        for h in handles:
            h.remove()
    assert set(calls.values()) == {1}


def _batches(n_batches=3, size=8, hw=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(size, 1, hw, hw, generator=g) for _ in range(n_batches)]


def test_layerwise_cka_self_is_one_and_cleans_up(unet):
    unet.train()
    batches = _batches()
    out = layerwise_cka(unet, unet, [{"image": b} for b in batches])
    assert list(out) == list(parameter_layers(unet))
    assert all(v == pytest.approx(1.0, abs=1e-9) for v in out.values())
    assert unet.training  # mode restored
    assert all(not m._forward_hooks for m in unet.modules())  # hooks removed


def test_layerwise_cka_perturbed_copy_is_lower_on_deep_layers(unet):
    other = copy.deepcopy(unet)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(1.0 + 0.2 * torch.randn_like(p))
    out = layerwise_cka(unet, other, _batches())
    assert all(0.0 <= v <= 1.0 for v in out.values())
    deep = [n for n in out if n.startswith("model.1.submodule.1.submodule.1")]
    assert len(deep) >= 10
    assert all(out[n] < 0.99 for n in deep)
    assert max(out.values()) < 1.0 - 1e-6
    # Same models copied: the identical comparison still gives 1 (CKA does not depend on identity).
    again = layerwise_cka(other, copy.deepcopy(other), _batches(2), layer_names=deep)
    assert list(again) == deep and all(v == pytest.approx(1.0, abs=1e-9) for v in again.values())


def test_layerwise_cka_removes_hooks_on_error(unet):
    def failing():
        yield torch.randn(4, 1, 32, 32)
        raise RuntimeError("data loader broke")

    with pytest.raises(RuntimeError, match="data loader broke"):
        layerwise_cka(unet, unet, failing())
    assert all(not m._forward_hooks for m in unet.modules())


class _Branchy(nn.Module):
    """A layer that never runs, a layer with a tuple output, and a shared (twice-run) layer."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(5, 3, batch_first=True)
        self.head = nn.Linear(3, 2)
        self.unused = nn.Linear(3, 3)
        self.twice = nn.Linear(2, 2)

    def forward(self, x, use_twice=False):
        out, _ = self.lstm(x)
        y = self.head(out[:, -1])
        return self.twice(self.twice(y)) if use_twice else y


def test_layerwise_cka_errors_and_tuple_outputs():
    torch.manual_seed(0)
    model = _Branchy()
    batches = [torch.randn(6, 4, 5) for _ in range(2)]
    out = layerwise_cka(model, copy.deepcopy(model), batches, layer_names=["lstm", "head"])
    assert out == {"lstm": pytest.approx(1.0, abs=1e-9), "head": pytest.approx(1.0, abs=1e-9)}
    with pytest.raises(ValueError, match="unused"):
        layerwise_cka(model, model, batches)  # default layers include the never-run ones
    with pytest.raises(ValueError, match="at least 4"):
        layerwise_cka(model, model, [torch.randn(3, 4, 5)], layer_names=["head"])
    with pytest.raises(KeyError):
        layerwise_cka(model, model, batches, layer_names=["nope"])

    class Twice(_Branchy):
        def forward(self, x):
            return super().forward(x, use_twice=True)

    with pytest.raises(ValueError, match="more than once"):
        layerwise_cka(Twice(), Twice(), batches, layer_names=["twice"])


def test_3d_layers_are_read_at_a_sample_of_voxel_positions_the_same_in_both_models(monkeypatch):
    """Fed-LWR on volumes: a 3-D layer's output [B, C, X, Y, Z] is read at most at max_volume_positions voxels, drawn
    once per layer and the same for both models (a model against itself: CKA exactly 1), so the Gram matrix is fed
    C x positions features however large the volume. The sample estimates each Gram matrix without bias, but CKA, a
    ratio of products of them, comes out lower the fewer the positions (their sampling noise inflates the
    denominator): on smooth inputs (images are, noise is not) a quarter of the positions stays within 0.06 of the
    full CKA, and never above it by more than rounding."""
    import torch.nn.functional as F

    from fairfl.methods.fedlwr import cka as cka_module
    from fairfl.models import build_model

    spec = {"name": "unet", "in_channels": 1, "num_classes": 2, "spatial_dims": 3, "channels": [4, 8], "strides": [2]}
    torch.manual_seed(0)
    local, anchor = build_model(spec), build_model(spec)
    noise = torch.Generator().manual_seed(1)
    batches = [
        F.interpolate(torch.randn(16, 1, 4, 4, 4, generator=noise), size=(16, 16, 16), mode="trilinear")
        for _ in range(2)
    ]
    widths = []
    gram = cka_module._GramWorkspace.__call__
    monkeypatch.setattr(
        cka_module._GramWorkspace, "__call__", lambda self, x: widths.append(x[0].numel()) or gram(self, x)
    )
    sampled = layerwise_cka(local, anchor, batches, max_volume_positions=1024)
    assert max(widths) <= 8 * 1024  # the widest layer has 8 channels
    widths.clear()
    full = layerwise_cka(local, anchor, batches)
    assert max(widths) == 2 * 16**3  # every voxel of the last layer's output (2 channels at 16^3)
    assert sampled.keys() == full.keys()
    assert all(-0.06 < sampled[k] - full[k] < 1e-3 for k in full), {k: sampled[k] - full[k] for k in full}
    assert layerwise_cka(local, anchor, batches, max_volume_positions=16**3) == full  # no fewer positions: unchanged
    assert all(v == pytest.approx(1.0) for v in layerwise_cka(local, local, batches, max_volume_positions=64).values())
