"""FedNPR's local objective (Wicaksana et al., "Non-parametric regularization for class imbalance federated
medical image classification", 2024): balanced softmax plus a non-parametric regulariser (NPR) that pulls each
feature towards the nearest of its class's K sub-cluster prototypes, found by Sinkhorn-Knopp.

A round at a site (prototypes never leave the site):
    features, labels = extract_features(model, unshuffled_training_loader, device)   # the downloaded model
    prototypes, mask = class_prototypes(features, labels, num_classes, k=4)
    with fednpr_objective(model, counts, prototypes, mask) as loss_fn:
        train_local(model, training_loader, settings, device, loss_fn=loss_fn)
    loss_fn.metrics()   # {"npr_grad_ratio": ...}: how hard NPR pulls the features against BSM

The regulariser is the one the authors ran, which the paper does not print: their training loop passes the
per-class max cosines through a LayerNorm over the classes before the cross-entropy (`npr_logits`
"layernorm"), and adds lambda to the loss instead of multiplying it, so their NPR term had weight 1 in every
run (their lambda grid changed a constant). Without the LayerNorm, Eq. 3 as printed (`npr_logits` "cosine")
at temperature 1 barely acts: class max-cosines lie within about 0.1 of each other, the NPR loss stays near
log C and its gradient is a few per cent of BSM's. Sinkhorn-Knopp really iterates here (their step never did,
leaving the hard assignment effectively random).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F

from fairfl.classification import LogitAdjustedCrossEntropy
from fairfl.models import forward_with_features, head_inputs, is_int_in

EPSILON = 0.05  # the paper's entropic regularisation (Sec. III-C1)
SINKHORN_ITERATIONS = 50  # see sinkhorn_knopp
CLUSTER_ROUNDS = 10  # assign-and-average passes of the sub-clustering
NUM_SUBCLUSTERS = 4  # K, the paper's best on Fed-ISIC2019 (Sec. IV-C)
NPR_WEIGHT = 1.0  # lambda: multiplies NPR (Eq. 5); 1 is the weight the authors' runs trained with (see above)
TEMPERATURE = 1.0  # Eq. 3 has none: exp(max cosine similarity)
NPR_LOGITS = ("layernorm", "cosine")  # see npr_logits; the first is the default
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's, which the authors' loop used


NPR_SETTINGS_BOUNDS = {"k": (1, 256), "iterations": (1, 10_000)}  # what a site accepts from the server's task
MAX_NPR_FACTOR = 1e6  # epsilon, temperature and weight above this make no sense and only overflow


def check_npr_settings(settings) -> str | None:
    """Why the server's FedNPR settings ({k, iterations, epsilon, temperature, weight, logits}) must not be used,
    or None. k and iterations are loop sizes (bounded: NPR_SETTINGS_BOUNDS), epsilon and temperature divide
    (finite, > 0), weight multiplies (finite, >= 0)."""
    if not isinstance(settings, dict):
        return f"must be an object, got {type(settings).__name__}"
    for key, (low, high) in NPR_SETTINGS_BOUNDS.items():
        if not is_int_in(settings.get(key), low, high):
            return f"{key} {settings.get(key)!r} is not an integer in [{low}, {high}]"
    for key, positive in (("epsilon", True), ("temperature", True), ("weight", False)):
        value = settings.get(key)
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or not (value > 0 if positive else value >= 0)
            or value > MAX_NPR_FACTOR
        ):
            return f"{key} {value!r} is not a finite number in {'(0' if positive else '[0'}, {MAX_NPR_FACTOR:g}]"
    if settings.get("logits") not in NPR_LOGITS:
        return f"logits {settings.get('logits')!r} is not one of {', '.join(NPR_LOGITS)}"
    return None


def balanced_softmax_loss(counts: Sequence[float]) -> LogitAdjustedCrossEntropy:
    """Balanced softmax (Ren et al., NeurIPS 2020; FedNPR Eq. 4), a loss module called (logits, target).

    BSM is cross-entropy on z + log(pi), pi the site's class prior: exactly the logit-adjusted loss at tau 1,
    so one implementation serves both. (Eq. 4 prints "+ pi"; the cited BSM adds log pi, which we follow.)
    A class the site lacks counts as `classification.ABSENT_CLASS_COUNT` (half an example) instead of
    log 0 = -inf: its logit is still shifted far below the present classes, so the loss barely touches it,
    as exact BSM would, but loss and gradients stay finite."""
    return LogitAdjustedCrossEntropy(counts, tau=1.0)


def sinkhorn_knopp(
    scores: torch.Tensor, epsilon: float = EPSILON, iterations: int = SINKHORN_ITERATIONS
) -> torch.Tensor:
    """The entropic optimal-transport plan Q [n, K] (float64) of n samples to K clusters with equal shares
    (Cuturi 2013; the equipartition of Asano et al. 2020 and SwAV): Q ~ exp(scores / epsilon), its rows and
    columns alternately rescaled to sum to 1/n and 1/K.

    Rows are rescaled last, so they sum to 1/n exactly and the columns approach 1/K as `iterations` grows.
    SwAV and ProtoSeg stop after 3, enough for batches of thousands of high-dimensional features; a class at
    a site can be a few dozen samples whose similarities to centres drawn from them spread widely, where 3
    leave column sums tens of per cent off 1/K. The default 50 brings those within a few per cent at
    negligible cost (n x K).
    Computed in the log domain in float64: scores / 0.05 reach +-20 for cosine similarities, and exp of
    those in float32 loses the small entries that the rescaling has to lift."""
    if scores.ndim != 2 or 0 in scores.shape:
        raise ValueError(f"scores must be a non-empty [n, K] matrix, got shape {tuple(scores.shape)}")
    if epsilon <= 0 or iterations < 1:
        raise ValueError(f"need epsilon > 0 and iterations >= 1, got {epsilon}, {iterations}")
    n, k = scores.shape
    log_q = scores.detach().to(torch.float64) / epsilon
    for _ in range(iterations):
        log_q = log_q - torch.logsumexp(log_q, dim=0, keepdim=True) - math.log(k)
        log_q = log_q - torch.logsumexp(log_q, dim=1, keepdim=True) - math.log(n)
    return log_q.exp()


def balanced_assignment(plan: torch.Tensor) -> torch.Tensor:
    """A hard assignment [n] (cluster indices) of a transport plan that keeps the equipartition exactly:
    every cluster gets floor(n / K) or ceil(n / K) samples (the paper's one-hot and equipartition constraints).

    The arg-max of a few-iteration plan is only roughly balanced, so the plan is rounded greedily instead:
    (sample, cluster) pairs in order of decreasing mass, each taken while the sample is free and the cluster
    has room. Rooms: floor(n / K) each, plus one more for the first n mod K clusters that fill up."""
    n, k = plan.shape
    base, extra = divmod(n, k)
    assignment = np.full(n, -1, dtype=np.int64)
    filled = np.zeros(k, dtype=np.int64)
    for flat in np.argsort(-plan.detach().cpu().numpy().reshape(-1), kind="stable"):
        sample, cluster = divmod(int(flat), k)
        if assignment[sample] >= 0:
            continue
        if filled[cluster] == base:
            if extra == 0:
                continue
            extra -= 1
        elif filled[cluster] > base:
            continue
        assignment[sample] = cluster
        filled[cluster] += 1
        n -= 1
        if n == 0:  # all placed
            break
    return torch.from_numpy(assignment)


def _subclusters(
    z: torch.Tensor, k: int, epsilon: float, iterations: int, rounds: int, rng: np.random.Generator
) -> torch.Tensor:
    """Unit-norm centres [min(k, n), d] of one class's unit features z [n, d]: from k random samples, repeat
    similarity -> Sinkhorn plan -> balanced hard assignment -> normalised means (Eq. 1-2). With n <= k every
    sample is its own centre."""
    if len(z) <= k:
        return z
    centres = z[torch.from_numpy(rng.choice(len(z), size=k, replace=False))]
    assignment = None
    for _ in range(rounds):
        new = balanced_assignment(sinkhorn_knopp(z @ centres.T, epsilon, iterations))
        if assignment is not None and torch.equal(new, assignment):
            break
        assignment = new
        sums = torch.zeros_like(centres).index_add_(0, assignment, z)
        centres = F.normalize(sums, dim=1)  # the mean's direction; every cluster is non-empty
    return centres


def class_prototypes(
    features: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int,
    k: int = NUM_SUBCLUSTERS,
    epsilon: float = EPSILON,
    iterations: int = SINKHORN_ITERATIONS,
    rounds: int = CLUSTER_ROUNDS,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(prototypes [C, K, d], mask [C, K]) of a site's features [N, d] and labels [N]: the unit-norm centres of
    K sub-clusters of each class's L2-normalised features (`_subclusters`; K = 1 gives the normalised class
    mean, the paper's single-cluster ablation).

    mask[c, j] says whether prototype j of class c exists: a class the site lacks has none (its row is zeros,
    and `npr_loss` leaves the class out); a class with n < K samples has n, its samples themselves. The
    initial centres of class c are drawn with numpy's default_rng([seed, c]), so the result is reproducible.
    Returned on the features' device and dtype."""
    if k < 1 or rounds < 1:
        raise ValueError(f"need k >= 1 and rounds >= 1, got {k}, {rounds}")
    z = F.normalize(features.detach().cpu().to(torch.float64), dim=1)  # small loops: the CPU is fine
    labels = labels.reshape(-1).long().cpu()
    if len(labels) != len(z):
        raise ValueError(f"{len(z)} features but {len(labels)} labels")
    prototypes = torch.zeros(num_classes, k, z.shape[1], dtype=torch.float64)
    mask = torch.zeros(num_classes, k, dtype=torch.bool)
    for c in range(num_classes):
        members = z[labels == c]
        if len(members):
            centres = _subclusters(members, k, epsilon, iterations, rounds, np.random.default_rng([seed, c]))
            prototypes[c, : len(centres)], mask[c, : len(centres)] = centres, True
    return prototypes.to(features.device, features.dtype), mask.to(features.device)


def npr_logits(best: torch.Tensor, form: str = NPR_LOGITS[0], temperature: float = TEMPERATURE) -> torch.Tensor:
    """NPR's logits from s [n, C], each sample's largest cosine similarity to each class's prototypes:

    - "layernorm": the authors' training loop, LayerNorm(s) / temperature: per sample, s minus its mean over the
      classes, divided by its standard deviation (biased, eps 1e-5). Their nn.LayerNorm is created afresh every
      batch and never given to the optimiser, so its affine weight and bias stay 1 and 0: no affine here.
      The max-cosines of a sample differ by about 0.1 between classes; this spreads them to unit variance.
    - "cosine": Eq. 3 as printed, s / temperature (a temperature below 1 plays the LayerNorm's part)."""
    if form == "layernorm":
        best = F.layer_norm(best, best.shape[-1:], eps=LAYER_NORM_EPS)
    elif form != "cosine":
        raise ValueError(f"npr_logits must be one of {NPR_LOGITS}, got {form!r}")
    return best / temperature


def npr_loss(
    features: torch.Tensor,
    target: torch.Tensor,
    prototypes: torch.Tensor,
    mask: torch.Tensor,
    temperature: float = TEMPERATURE,
    npr_form: str = NPR_LOGITS[0],
) -> torch.Tensor:
    """The non-parametric regulariser, FedNPR Eq. 3: cross-entropy over classes of npr_logits(s), s_c the
    largest cosine similarity of a sample's (L2-normalised) features to a prototype of class c.

    Eq. 3 has no temperature (the default 1); a smaller one (ProtoSeg and DNC use 0.1) sharpens the pull.
    Prototypes the mask marks absent are ignored, and classes with none are left out of the softmax (not
    given -inf, whose gradients NaN) and of the LayerNorm (the authors' normalised over all classes, absent
    ones with random prototypes); samples of such a class are left out of the mean. Zero (with a gradient
    graph) when no sample is left."""
    mask = mask.to(features.device)
    present = mask.any(dim=1)
    target = target.reshape(-1).long()
    keep = present[target]
    if not bool(keep.any()):
        return features.sum() * 0.0
    z = F.normalize(features[keep], dim=1)
    similarity = torch.einsum("nd,ckd->nck", z, prototypes[present].to(z))
    best = similarity.masked_fill(~mask[present], float("-inf")).amax(dim=2)
    column = torch.cumsum(present.long(), 0) - 1  # a present class's index among the present ones
    return F.cross_entropy(npr_logits(best, npr_form, temperature), column[target[keep]])


def fednpr_terms(
    logits: torch.Tensor,
    features: torch.Tensor,
    target: torch.Tensor,
    bsm: torch.nn.Module,
    prototypes: torch.Tensor,
    mask: torch.Tensor,
    lam: float = NPR_WEIGHT,
    temperature: float = TEMPERATURE,
    npr_form: str = NPR_LOGITS[0],
) -> tuple:
    """(bsm(logits, target), lam * npr_loss(features, ...)): FedNPR's local loss (Eq. 5) is their sum.
    lam 0 skips NPR (a zero second term)."""
    npr = lam * npr_loss(features, target, prototypes, mask, temperature, npr_form) if lam else features.sum() * 0.0
    return bsm(logits, target), npr


def gradient_ratio(numerator: torch.Tensor, denominator: torch.Tensor, wrt: torch.Tensor) -> float | None:
    """||d numerator / d wrt|| / ||d denominator / d wrt|| (Frobenius norms), the graph kept for the training
    step's backward; None when the denominator's gradient is zero or either is not finite."""
    gradients = (
        torch.autograd.grad(loss, wrt, retain_graph=True, allow_unused=True)[0] for loss in (numerator, denominator)
    )
    top, bottom = (0.0 if g is None else float(g.norm()) for g in gradients)
    ratio = top / bottom if bottom > 0.0 else float("nan")
    return ratio if math.isfinite(ratio) else None


class FedNPRObjective:
    """FedNPR's `loss_fn(logits, target)` (see fednpr_objective). Each call with gradients on also records how
    hard the NPR term pulls the features against BSM: ||d(lam NPR)/dz|| / ||d BSM/dz||, z the head's input of
    the batch (backward through the head and NPR only: cheap); `metrics()` gives their mean as npr_grad_ratio.
    A ratio near 0 means the regulariser does nothing."""

    def __init__(self, latest: list, counts, prototypes, mask, lam, temperature, npr_form):
        self._latest, self._bsm = latest, balanced_softmax_loss(counts)
        self._npr = dict(prototypes=prototypes, mask=mask, lam=lam, temperature=temperature, npr_form=npr_form)
        self.grad_ratios: list[float] = []

    def __call__(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        features = self._latest[0]
        # NPR in float32 whatever precision the forward pass ran in (amp); the ratio is taken at the head's input
        bsm, npr = fednpr_terms(logits, features.float(), target, self._bsm, **self._npr)
        if torch.is_grad_enabled() and features.requires_grad and npr.requires_grad:
            ratio = gradient_ratio(npr, bsm, features)
            if ratio is not None:
                self.grad_ratios.append(ratio)
        return bsm + npr

    def metrics(self) -> dict:
        return {"npr_grad_ratio": float(np.mean(self.grad_ratios))} if self.grad_ratios else {}


@contextmanager
def fednpr_objective(
    model: torch.nn.Module,
    counts: Sequence[float],
    prototypes: torch.Tensor,
    mask: torch.Tensor,
    lam: float = NPR_WEIGHT,
    temperature: float = TEMPERATURE,
    npr_form: str = NPR_LOGITS[0],
):
    """A FedNPRObjective, `loss_fn(logits, target)` for `training.train_local` and `sharpness.train_salt`, whose
    loops call loss_fn(model(x), y): while the context is open a hook on the model's head hands the features of
    the same forward pass to it. Other local terms combine outside it (FedProx: add the proximal loss of the
    model to this one)."""
    if npr_form not in NPR_LOGITS:
        raise ValueError(f"npr_logits must be one of {NPR_LOGITS}, got {npr_form!r}")
    with head_inputs(model) as latest:
        yield FedNPRObjective(latest, counts, prototypes, mask, lam, temperature, npr_form)


@torch.no_grad()
def extract_features(model: torch.nn.Module, loader, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(features [N, d], labels [N]) on the CPU: the head's input for every batch of `loader`, the model in
    eval mode (its training mode restored afterwards). For prototypes, pass the training split without
    augmentation or shuffling: the prototypes should describe the data, not one random view of it."""
    was_training = model.training
    model.to(device).eval()
    features, labels = [], []
    try:
        for batch in loader:
            batch_features, _ = forward_with_features(model, batch["image"].to(device))
            features.append(batch_features.float().cpu())
            labels.append(batch["label"].reshape(-1).long().cpu())
    finally:
        model.train(was_training)
    if not features:
        raise ValueError("the loader gave no batches")
    return torch.cat(features), torch.cat(labels)
