"""Linear centred kernel alignment (CKA) between two networks' layer outputs, for Fed-LWR.

Eq. 2 of Fed-LWR (Kornblith et al., 2019), with Gram matrices K = U U^T and L = V V^T::

    CKA(K, L) = HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L)),   HSIC(K, L) = vec(K') . vec(L') / (n-1)^2

where K' = H K H is the centred Gram matrix. `linear_cka` computes it on full feature matrices.
`MinibatchCKA` is the minibatch form of Nguyen, Raghu & Kornblith (2021): the unbiased HSIC
estimator is averaged over minibatches, so memory does not grow with the number of samples
(the Fed-LWR authors' code does the same). `layerwise_cka` runs two models side by side and
measures it for every module that owns parameters, matched by module name (a layer is found by what it is,
not by its position among the state dict's keys).

Degenerate representations (constant over the samples, e.g. a dead layer) have zero HSIC with
everything, so Eq. 2 is 0/0 there. The value used instead is:
  * both sides constant -> 1.0: CKA is invariant to translation, so any constant representation
    is the zero representation; two of them are identical. In Fed-LWR this means "no detectable
    difference", so such a layer gets no extra weight.
  * one side constant -> 0.0: one side separates the samples and the other not at all; they
    share no structure.
The unbiased estimator can also fall slightly outside [0, 1]; results are clamped to [0, 1].
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping

import torch
from torch import nn

__all__ = ["linear_cka", "unbiased_hsic", "MinibatchCKA", "parameter_layers", "layerwise_cka"]

MIN_BATCH = 4  # the unbiased HSIC divides by n (n - 3)


def _shifted_features(x) -> torch.Tensor:
    """[n, ...] -> [n, D] float64, translated so that the first sample is the origin.

    CKA and both HSIC estimators are invariant to translating the features, so this changes
    nothing mathematically, but it removes the common offset before the Gram matmul (large
    offsets cost digits through cancellation) and makes constant features exactly zero, which
    is how degenerate inputs are recognised without a tolerance.
    """
    x = torch.as_tensor(x).detach()
    if x.dim() < 1:
        raise ValueError("features need a leading sample dimension")
    x = x.as_subclass(torch.Tensor).reshape(x.shape[0], -1).to(torch.float64)
    return x - x[:1]


class _GramWorkspace:
    """Gram matrices in float64 of minibatch features x [B, ...], translated as above.

    After the translation sample 0 is the origin, so its row and column of K are zero: only
    the (B-1) x (B-1) block K[1:, 1:] is computed, and `_with_origin` pads the zeros back on
    (once per stack of layers). The float64 copy goes into one reused buffer: allocating a fresh
    B x D float64 tensor per layer (and page-faulting it in) cost as much as the matmul.
    """

    CHUNK = 512  # columns per batched-matmul slice, see __call__

    def __init__(self):
        self._buffer = torch.empty(0, dtype=torch.float64)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):  # a forward hook may run under amp: Grams stay float64
            return self._gram(x)

    def _gram(self, x: torch.Tensor) -> torch.Tensor:
        x = x.detach().reshape(x.shape[0], -1)
        if type(x) is not torch.Tensor:  # MONAI MetaTensor etc.: plain ops, no metadata tracking
            x = x.as_subclass(torch.Tensor)
        rest = x[1:]
        if self._buffer.numel() < rest.numel() or self._buffer.device != x.device:
            self._buffer = torch.empty(rest.numel(), dtype=torch.float64, device=x.device)
        y = self._buffer[: rest.numel()].view(rest.shape)
        y.copy_(rest)
        y.sub_(x[0].to(torch.float64))  # float64 arithmetic (and a same-dtype op is faster)
        # Y Y^T with Y [B-1, D]: B is small and D large, a shape for which one dgemm call is slow
        # on CPU; a batched matmul over [D/512, B-1, 512] slices of columns, summed, was ~20%
        # faster and adds the slices in float64 pairwise-like, which is also more accurate.
        main = y.shape[1] - y.shape[1] % self.CHUNK
        if main < 2 * self.CHUNK:
            return y @ y.T
        chunks = y[:, :main].view(y.shape[0], -1, self.CHUNK).transpose(0, 1)
        gram = torch.bmm(chunks, chunks.transpose(1, 2)).sum(0)
        if main < y.shape[1]:
            tail = y[:, main:]
            gram += tail @ tail.T
        return gram


def _with_origin(blocks: torch.Tensor) -> torch.Tensor:
    """[..., B-1, B-1] Gram blocks -> [..., B, B] Gram matrices with sample 0's zero row/column."""
    return torch.nn.functional.pad(blocks, (1, 0, 1, 0))


def _cka_from_hsic(kl: float, kk: float, ll: float) -> float:
    """Eq. 2 from the three HSIC values, with the degenerate cases of the module docstring."""
    # kk, ll <= 0: no measurable variation (constant features give exactly 0; the unbiased
    # estimator may dip below 0 for nearly constant ones).
    if kk <= 0.0 and ll <= 0.0:
        return 1.0
    if kk <= 0.0 or ll <= 0.0:
        return 0.0
    value = kl / math.sqrt(kk * ll)
    if not math.isfinite(value):  # overflow of kk * ll; inputs are finite floats here
        value = kl / (math.sqrt(kk) * math.sqrt(ll))
    return min(max(value, 0.0), 1.0)


def linear_cka(x, y) -> float:
    """Linear CKA of Eq. 2 on full feature matrices x [n, ...] and y [n, ...] (biased HSIC).

    For tests and small inputs (everything in memory); `MinibatchCKA` is for data sets.
    """
    x, y = _shifted_features(x), _shifted_features(y)
    n = x.shape[0]
    if y.shape[0] != n:
        raise ValueError(f"x has {n} samples but y has {y.shape[0]}")
    if n < 2:
        raise ValueError("linear_cka needs at least 2 samples")
    xc, yc = x - x.mean(0), y - y.mean(0)  # H X and H Y, so that K' = H K H = xc xc^T
    if n * n <= x.shape[1] * y.shape[1]:
        k, l = xc @ xc.T, yc @ yc.T  # n x n centred Gram matrices, as written in Eq. 2

        def dot(a, b):  # vec(A) . vec(B)
            return float((a * b).sum())

        kl, kk, ll = dot(k, l), dot(k, k), dot(l, l)
    else:  # many samples: vec(K') . vec(L') = ||xc^T yc||_F^2 needs only d x d matrices

        def sq(a):
            return float(a.square().sum())

        kl, kk, ll = sq(xc.T @ yc), sq(xc.T @ xc), sq(yc.T @ yc)
    scale = (n - 1) ** 2  # HSIC = vec(K') . vec(L') / (n-1)^2; cancels in CKA, kept for Eq. 2
    return _cka_from_hsic(kl / scale, kk / scale, ll / scale)


def unbiased_hsic(k: torch.Tensor, l: torch.Tensor) -> torch.Tensor:
    """Unbiased HSIC estimator (Song et al., 2012) of symmetric Gram matrices [..., n, n], n >= 4.

    With K~, L~ the Gram matrices with their diagonals set to zero::

        HSIC_1 = [tr(K~ L~) + (1^T K~ 1)(1^T L~ 1) / ((n-1)(n-2)) - 2/(n-2) 1^T K~ L~ 1] / (n(n-3))

    Leading dimensions are batch dimensions (one estimate per matrix pair).
    """
    n = k.shape[-1]
    if n < MIN_BATCH:
        raise ValueError(f"unbiased HSIC needs n >= {MIN_BATCH}, got {n}")
    off_diag = 1.0 - torch.eye(n, dtype=k.dtype, device=k.device)
    k, l = k * off_diag, l * off_diag
    k_rows, l_rows = k.sum(-1), l.sum(-1)
    trace_kl = (k * l).sum((-2, -1))  # tr(K~ L~) = sum_ij K~_ij L~_ij for symmetric matrices
    sums = k_rows.sum(-1) * l_rows.sum(-1) / ((n - 1) * (n - 2))
    cross = 2.0 / (n - 2) * (k_rows * l_rows).sum(-1)  # 1^T K~ L~ 1 = (K~ 1) . (L~ 1)
    return (trace_kl + sums - cross) / (n * (n - 3))


class MinibatchCKA:
    """Minibatch linear CKA per layer (Nguyen et al., 2021)::

        CKA = sum_b HSIC_1(K_b, L_b) / sqrt(sum_b HSIC_1(K_b, K_b) * sum_b HSIC_1(L_b, L_b))

    Only three running sums per layer are kept, so memory does not grow with the data.
    Batches of fewer than 4 samples are skipped (the estimator is undefined there).
    """

    def __init__(self) -> None:
        self._sums: dict[str, list[float]] = {}  # name -> [sum HSIC(K,L), HSIC(K,K), HSIC(L,L)]

    def update(self, name: str, feats_a, feats_b) -> bool:
        """Add one minibatch of features [B, ...] of the two representations of layer `name`.

        Returns False (and changes nothing) when the batch has fewer than 4 samples.
        """
        a, b = torch.as_tensor(feats_a), torch.as_tensor(feats_b)
        if a.dim() < 1 or b.dim() < 1 or a.shape[0] != b.shape[0]:
            raise ValueError(
                f"layer {name!r}: feats_a {tuple(a.shape)} and feats_b {tuple(b.shape)} "
                "need the same number of samples in dimension 0"
            )
        if a.shape[0] < MIN_BATCH:
            return False
        gram = _GramWorkspace()
        self.update_grams([name], _with_origin(gram(a)[None]), _with_origin(gram(b)[None]))
        return True

    def update_grams(self, names: list[str], k: torch.Tensor, l: torch.Tensor) -> None:
        """Add one minibatch given as stacked Gram matrices k, l [len(names), B, B], B >= 4.

        All layers of a minibatch in one call: a few small tensor ops instead of a few per layer.
        """
        hsic = torch.stack([unbiased_hsic(k, l), unbiased_hsic(k, k), unbiased_hsic(l, l)], dim=1)
        for name, values in zip(names, hsic.tolist(), strict=True):
            sums = self._sums.setdefault(name, [0.0, 0.0, 0.0])
            for i, v in enumerate(values):
                sums[i] += v

    @property
    def names(self) -> list[str]:
        """Layers that received at least one minibatch."""
        return list(self._sums)

    def result(self) -> dict[str, float]:
        """CKA per layer, in [0, 1], never NaN (see the module docstring for constant features)."""
        return {name: _cka_from_hsic(*sums) for name, sums in self._sums.items()}


def parameter_layers(model: nn.Module) -> dict[str, list[str]]:
    """Map each module that directly owns state (parameters or persistent buffers) to its keys.

    Keys are module names from `named_modules()`, values the `state_dict()` keys the module
    owns, in state_dict order. Every state_dict key belongs to exactly one layer: the module
    named by the key without its last component (parameter and buffer names contain no dot).
    This is the mapping by name that Fed-LWR's aggregation uses.
    """
    modules = dict(model.named_modules(remove_duplicate=False))  # shared modules under every name
    layers: dict[str, list[str]] = {}
    for key in model.state_dict():
        owner = key.rpartition(".")[0]
        if owner not in modules:  # cannot happen for standard modules; guards custom state_dicts
            raise ValueError(f"state_dict key {key!r} has no owning module {owner!r}")
        layers.setdefault(owner, []).append(key)
    return layers


def _first_tensor(output, name: str) -> torch.Tensor:
    """A module's output, or the first tensor of a tuple/list output."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        for item in output:
            if isinstance(item, torch.Tensor):
                return item
    raise TypeError(f"layer {name!r} returned {type(output).__name__}, which holds no tensor")


def layerwise_cka(
    model_a: nn.Module,
    model_b: nn.Module,
    batches: Iterable,
    layer_names: Iterable[str] | None = None,
    device: str | torch.device = "cpu",
    max_volume_positions: int | None = None,
) -> dict[str, float]:
    """Minibatch linear CKA between the outputs of the same-named layers of two models.

    Args:
        model_a, model_b: the two networks (for Fed-LWR: a site's local model and the anchor).
            They are moved to `device` (in place, as `nn.Module.to` does) and run in eval mode
            under no_grad; their train/eval modes are restored afterwards.
        batches: iterable of input tensors [B, ...], or dicts holding them under "image".
            Batches with fewer than 4 samples are skipped.
        layer_names: module names (from `named_modules()`) to compare; default: every module
            that owns parameters or buffers, i.e. the keys of `parameter_layers(model_a)`.
        device: where the models run.
        max_volume_positions: a 3-D layer output [B, C, X, Y, Z] with more voxel positions than this is read at this
            many of them only, drawn at random once per layer and shape (seeded: the same for both models and every
            batch), so the features fed to the Gram matrix are C x max_volume_positions however large the volume.
            The Gram matrix is a sum over positions, so a uniform sample of them estimates it without bias up to a
            scale, which CKA ignores; CKA, a ratio of products of Gram matrices, comes out lower the fewer the
            positions (tests/methods/fedlwr/test_cka.py measures it against reading every position). None: every
            position.

    Returns:
        {layer name: CKA in [0, 1]}, in the order of `layer_names`.

    Each layer's output is reduced to its B x B Gram matrix inside the forward hook, so no
    activation is kept beyond the module that produced it. A layer must run exactly once per
    forward pass, and every layer must produce an output at least once.
    """
    if layer_names is None:
        layer_names = parameter_layers(model_a)
    elif isinstance(layer_names, str):
        layer_names = [layer_names]
    names = list(dict.fromkeys(layer_names))  # one hook per name, even if a name is repeated
    if not names:
        raise ValueError("no layers to compare")
    models = {"a": model_a, "b": model_b}
    grams: dict[str, dict[str, torch.Tensor]] = {"a": {}, "b": {}}
    now = {"side": "", "batch": 0}  # side in its forward pass (model_a may be model_b), batch size
    gram = _GramWorkspace()

    def make_hook(side: str, name: str):
        def hook(module, inputs, output):
            if now["side"] != side:
                return
            if name in grams[side]:
                raise ValueError(f"layer {name!r} ran more than once in one forward pass; its CKA is ambiguous")
            out = _first_tensor(output, name)
            if out.dim() == 0 or out.shape[0] != now["batch"]:
                raise ValueError(
                    f"layer {name!r}: output shape {tuple(out.shape)} does not start with the batch size {now['batch']}"
                )
            # Reduce the output to its Gram matrix right away: nothing of size D is kept.
            grams[side][name] = gram(sampled(name, out))

        return hook

    positions: dict[tuple, torch.Tensor] = {}  # (layer, spatial shape) -> the voxel positions read

    def sampled(name: str, out: torch.Tensor) -> torch.Tensor:
        if max_volume_positions is None or out.dim() != 5 or out.shape[2:].numel() <= max_volume_positions:
            return out
        key = (name, tuple(out.shape[2:]))
        if key not in positions:
            generator = torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))
            chosen = torch.randperm(out.shape[2:].numel(), generator=generator)[:max_volume_positions]
            positions[key] = chosen.to(out.device)
        return out.flatten(2).index_select(2, positions[key])

    handles, was_training = [], {side: m.training for side, m in models.items()}
    cka, used = MinibatchCKA(), 0
    try:
        for side, model in models.items():
            modules = dict(model.named_modules(remove_duplicate=False))
            missing = [n for n in names if n not in modules]
            if missing:
                raise KeyError(f"model_{side} has no module(s) named {missing}")
            handles += [modules[n].register_forward_hook(make_hook(side, n)) for n in names]
            model.to(device).eval()
        with torch.no_grad():
            for batch in batches:
                x = batch["image"] if isinstance(batch, Mapping) else batch
                x = torch.as_tensor(x).as_subclass(torch.Tensor).to(device)  # drop MONAI metadata
                if x.shape[0] < MIN_BATCH:
                    continue
                now["batch"], used = x.shape[0], used + 1
                for side, model in models.items():
                    grams[side].clear()
                    now["side"] = side
                    model(x)
                now["side"] = ""
                if grams["a"].keys() != grams["b"].keys():
                    odd = sorted(grams["a"].keys() ^ grams["b"].keys())
                    raise ValueError(f"layers {odd} produced an output in only one of the two models")
                seen = [n for n in names if n in grams["a"]]
                if seen:
                    cka.update_grams(
                        seen,
                        _with_origin(torch.stack([grams["a"][n] for n in seen])),
                        _with_origin(torch.stack([grams["b"][n] for n in seen])),
                    )
    finally:
        now["side"] = ""
        for handle in handles:
            handle.remove()
        for side, model in models.items():
            model.train(was_training[side])

    if not used:
        raise ValueError(f"no batch of at least {MIN_BATCH} samples; CKA was not measured")
    result = cka.result()
    never = [n for n in names if n not in result]
    if never:
        raise ValueError(f"layers {never} produced no output on any batch (not used in forward?)")
    return {n: result[n] for n in names}
