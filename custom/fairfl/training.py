"""Local training and evaluation loops (plain PyTorch + MONAI, no FLARE)."""

from __future__ import annotations

import contextlib
import math
import random
import zlib
from dataclasses import dataclass

import numpy as np
import torch
from monai.losses import DiceLoss
from monai.metrics import DiceMetric
from monai.networks.utils import one_hot

from fairfl.files import save_atomic
from fairfl.presets import ADAM_BETAS
from fairfl.uncertainty import case_influence_record, cluster_se, mean_influence

OPTIMIZERS = ("adam", "sgd")


@dataclass
class TrainSettings:
    """One round of local training. The paper's: Adam lr 1e-3, weight decay 1e-4, batch 8, one local epoch.

    local_steps > 0 trains a fixed number of optimiser steps instead of one epoch, so every site does the
    same amount of work per round whatever its dataset size (the Fed-LWR benchmark's "steps" setting).
    optimizer "sgd" (with `momentum`) is plain local SGD, as q-FedAvg's authors trained (its L = 1 / lr
    reads the local update as a sum of gradients only under SGD). `betas` are Adam's (PyTorch's default; Fed-LWR's
    authors ran (0.9, 0.99))."""

    lr: float = 1e-3
    weight_decay: float = 1e-4
    batch_size: int = 8
    local_epochs: int = 1
    local_steps: int = 0
    optimizer: str = "adam"
    momentum: float = 0.0
    betas: tuple[float, float] = ADAM_BETAS


def check_optimizer_settings(settings) -> str | None:
    """Why the server's optimiser settings ({"name", "momentum", "keep_state"} and, where sent, "betas") must not be
    used, or None."""
    if not isinstance(settings, dict):
        return f"must be an object, got {type(settings).__name__}"
    if settings.get("name") not in OPTIMIZERS:
        return f"name {settings.get('name')!r} is not one of {', '.join(OPTIMIZERS)}"
    momentum = settings.get("momentum")
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0.0 <= momentum < 1.0:
        return f"momentum {momentum!r} is not a number in [0, 1)"
    if not isinstance(settings.get("keep_state"), bool):
        return f"keep_state {settings.get('keep_state')!r} is not true or false"
    betas = settings.get("betas", ADAM_BETAS)
    if not (
        isinstance(betas, (list, tuple))
        and len(betas) == 2
        and all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0.0 <= b < 1.0 for b in betas)
    ):
        return f"betas {betas!r} are not two numbers in [0, 1)"
    return None


def make_optimizer(model: torch.nn.Module, settings: TrainSettings):
    """The local optimiser of `settings`: Adam (its betas) or SGD (momentum), with its lr and weight decay."""
    if settings.optimizer == "sgd":
        return torch.optim.SGD(
            model.parameters(), lr=settings.lr, momentum=settings.momentum, weight_decay=settings.weight_decay
        )
    if settings.optimizer != "adam":
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {settings.optimizer!r}")
    return torch.optim.Adam(
        model.parameters(), lr=settings.lr, betas=tuple(settings.betas), weight_decay=settings.weight_decay
    )


# what each optimiser keeps per parameter (SGD without momentum keeps None)
OPTIMIZER_STATE_KEYS = {"adam": {"step", "exp_avg", "exp_avg_sq"}, "sgd": {"momentum_buffer"}}


def optimizer_state(optimizer: torch.optim.Optimizer, name: str, round_num: int) -> dict:
    """What a site keeps of its optimiser after round `round_num`: the per-parameter state only (Adam's step and
    moments, SGD's momentum buffers), never the settings, which are the job's (`load_optimizer_state`)."""
    return {"round": round_num, "optimizer": name, "moments": optimizer.state_dict()["state"]}


def _moment_problem(name: str, key: str, value, parameter: torch.Tensor) -> str | None:
    if key == "step":
        step = (
            float(value)
            if isinstance(value, (int, float, torch.Tensor))
            and not isinstance(value, bool)
            and (not isinstance(value, torch.Tensor) or value.numel() == 1)
            else math.nan
        )
        return None if math.isfinite(step) and step >= 1 and step == int(step) else f"step {value!r}"
    if name == "sgd" and value is None:
        return None
    if not isinstance(value, torch.Tensor) or value.shape != parameter.shape or not value.is_floating_point():
        return f"{key} does not fit the parameter's shape {tuple(parameter.shape)}"
    if not bool(torch.isfinite(value).all()) or (key == "exp_avg_sq" and bool((value < 0).any())):
        return f"{key} holds NaN/Inf or a negative second moment"
    return None


def load_optimizer_state(optimizer: torch.optim.Optimizer, name: str, saved) -> str | None:
    """Put the per-parameter state `optimizer_state` saved into `optimizer` (of kind `name`), keeping the
    optimiser's own settings (lr, weight decay, betas: the job's, never the file's); why it cannot be used
    (another optimiser or network, a missing or extra entry, a step that is not a count, NaN/Inf, a negative
    second moment), or None once it is loaded. Nothing is loaded unless everything checks."""
    if not isinstance(saved, dict) or saved.get("optimizer") != name or not isinstance(saved.get("moments"), dict):
        return f"not a saved {name} state"
    params = [p for group in optimizer.param_groups for p in group["params"]]
    moments = saved["moments"]
    if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(params) for i in moments):
        return f"parameter indices {sorted(map(str, moments))[:5]} do not fit this network's {len(params)}"
    for i, entry in moments.items():
        if not isinstance(entry, dict) or set(entry) != OPTIMIZER_STATE_KEYS[name]:
            keys = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
            return f"parameter {i}: {keys} instead of {sorted(OPTIMIZER_STATE_KEYS[name])}"
        for key, value in entry.items():
            problem = _moment_problem(name, key, value, params[i])
            if problem:
                return f"parameter {i}: {problem}"
    state = optimizer.state_dict()
    state["state"] = {
        i: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in entry.items()}
        for i, entry in moments.items()
    }
    optimizer.load_state_dict(state)
    return None


def site_seed(seed: int, site: str) -> int:
    """A stable per-site seed (Python's hash() is salted per process, crc32 is not)."""
    return (seed * 1_000_003 + zlib.crc32(site.encode())) % (2**31)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def select_device(preference: str = "auto") -> torch.device:
    if preference == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(preference)


def configure_threads(num_threads: int) -> None:
    """Many FLARE clients share a few cores: one intra-op thread each avoids oversubscription."""
    if num_threads > 0:
        torch.set_num_threads(num_threads)


def mixed_precision(device, enabled: bool, float16: bool = True):
    """The context the forward passes of training, probes and evaluation run in: with `enabled` (the executor's `amp`),
    torch.autocast in float16 on CUDA (`float16`, where a `gradient_scaler` guards the backward pass or there is none)
    and bfloat16 otherwise (on CPU; on CUDA for passes whose gradients' norms are used unscaled: SAM/SALT, the
    sharpness probe), float32's range needing no scaler. Disabled: nothing changes (bit-identical float32).
    Losses are computed outside it on the float32 output, so their reductions stay float32."""
    if not enabled:
        return contextlib.nullcontext()
    kind = torch.device(device).type
    return torch.autocast(kind, dtype=torch.float16 if kind == "cuda" and float16 else torch.bfloat16)


def gradient_scaler(device, enabled: bool):
    """The loss scaler of float16 training (`mixed_precision` on CUDA); a pass-through elsewhere or when disabled."""
    return torch.amp.GradScaler("cuda", enabled=enabled and torch.device(device).type == "cuda")


def forward_loss(model, image, label, loss_fn, device, amp: bool, float16: bool = True) -> torch.Tensor:
    """loss_fn(model(image), label), the forward pass under `mixed_precision` and the loss on its float32 output."""
    with mixed_precision(device, amp, float16):
        output = model(image)
    return loss_fn(output.float() if amp else output, label)


def segmentation_loss() -> torch.nn.Module:
    return DiceLoss(to_onehot_y=True, softmax=True)


def train_local(
    model, loader, settings: TrainSettings, device, loss_fn=None, optimizer=None, amp=False, privacy=None
) -> dict:
    """Train in place for one round; returns the mean loss and the number of optimiser steps.

    optimizer: one built on `model` (`make_optimizer`), e.g. with the state of the site's previous round;
    None = a fresh one of `settings` (the optimiser state is reset every round: fairfl's default, not the papers').
    amp: forward passes in mixed precision (`mixed_precision`), float16 on CUDA with a `gradient_scaler`; the
    weights and the optimiser stay float32.
    privacy: a task's DP settings (fairfl.privacy.settings.PrivacySettings): the round is DP-SGD instead
    (fairfl.privacy.dp_sgd.train_private, in float32 whatever `amp`), which returns the site's privacy statement in
    place of the loss."""
    loss_fn = loss_fn or segmentation_loss()
    model.to(device).train()
    optimizer = optimizer or make_optimizer(model, settings)
    if privacy is not None:
        from fairfl.privacy.dp_sgd import train_private  # Opacus loads only for a private round

        return train_private(model, loader, settings, device, loss_fn, optimizer, privacy)
    scaler = gradient_scaler(device, amp)
    max_steps = settings.local_steps if settings.local_steps > 0 else settings.local_epochs * len(loader)
    steps, total = 0, 0.0
    while steps < max_steps:
        for batch in loader:
            image, label = batch["image"].to(device), batch["label"].to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = forward_loss(model, image, label, loss_fn, device, amp)
            scaler.scale(loss).backward()
            scaler.step(optimizer)  # skipped when float16 gradients overflowed; the scale then shrinks
            scaler.update()
            total += float(loss.detach())
            steps += 1
            if steps >= max_steps:
                break
    return {"train_loss": total / max(steps, 1), "steps": steps}


def region_masks(onehot: torch.Tensor, regions: dict) -> torch.Tensor:
    """[B, C, ...] one-hot -> [B, R, ...]: each region is the union of its classes (optic disc = rim + cup)."""
    return torch.stack([onehot[:, list(classes)].sum(dim=1).clamp(max=1) for classes in regions.values()], dim=1)


SURFACE_TOLERANCE_MM = 2.0  # surface Dice: a boundary voxel within 2 mm of the other surface counts as agreeing


def sliding_window(roi_size, overlap: float):
    """A predictor scoring a whole volume in windows of `roi_size` (MONAI's sliding_window_inference, Gaussian-weighted
    where windows overlap), as the network was trained on patches of that size."""
    from monai.inferers import sliding_window_inference

    def predict(model, image):
        return sliding_window_inference(image, tuple(roi_size), 4, model, overlap=overlap, mode="gaussian")

    return predict


@torch.no_grad()
def evaluate_dice(
    model, loader, num_classes: int, device, regions: dict | None = None, predict=None, case_influence=None
) -> dict:
    """Mean Dice over regions and images (MONAI DiceMetric); also one value per region when there are several.

    regions: {name: [class, ...]} scored as unions of classes (a dataset.json's `regions`, e.g. fundus
    {"disc": [1, 2], "cup": [2]}); default: every foreground class on its own, named class_1, class_2, ...
    Images whose ground truth has no foreground for a region are ignored for it (MONAI's ignore_empty), as
    is usual for slice-wise prostate evaluation. `predict(model, image)`: the logits (default `model(image)`; whole
    volumes: `sliding_window`). Volumes (batches that carry their "spacing") are also scored by their surfaces, in mm:
    `hd95` (the 95th percentile Hausdorff distance; a region predicted empty where the truth is not scores the
    volume's diagonal) and `surface_dice` (at SURFACE_TOLERANCE_MM), MONAI's metrics, each a mean over volumes and
    regions. `case_influence` (a dict): filled with {"dice": each patient's influence on the Dice as a site sends it,
    fairfl.uncertainty.case_influence_record} when the split gives one."""
    regions = regions or {f"class_{c}": [c] for c in range(1, num_classes)}
    model.to(device).eval()
    metric = DiceMetric(include_background=True, reduction="mean_batch", ignore_empty=True)
    surfaces: dict[str, list[float]] = {"hd95": [], "surface_dice": []}
    cases = []
    for batch in loader:
        image, label = batch["image"].to(device), batch["label"].to(device)
        logits = model(image) if predict is None else predict(model, image)
        pred = region_masks(one_hot(logits.argmax(dim=1, keepdim=True), num_classes), regions)
        truth = region_masks(one_hot(label.long(), num_classes), regions)
        metric(y_pred=pred, y=truth)
        if "spacing" in batch:
            for name, values in surface_scores(pred, truth, batch["spacing"]).items():
                surfaces[name] += values
        # patient ids as text: integer ids arrive collated into a tensor, whose elements would all differ
        cases += (
            [str(c.item() if isinstance(c, torch.Tensor) else c) for c in batch["case"]]
            if "case" in batch
            else [None] * image.shape[0]
        )
    per_region = [float(v) for v in metric.aggregate().cpu()]
    per_image = metric.get_buffer().cpu().numpy()  # [images, regions], NaN where a region has nothing to score
    metric.reset()
    finite = [v for v in per_region if math.isfinite(v)]
    # NaN when no test image has any foreground: there is nothing to score, and 0 would read as a failure
    result = {"dice": float(np.mean(finite)) if finite else float("nan")}
    # its standard error, patients as clusters (slices of one case are not independent), over the regions scored;
    # left out when the split has fewer than two cases to tell it
    clusters = [c if c is not None else f"image{i}" for i, c in enumerate(cases)]
    scored = [r for r, v in enumerate(per_region) if math.isfinite(v)]
    influence = mean_influence(per_image[:, scored], clusters) if scored else None
    error = None if influence is None else cluster_se(influence)
    if error is not None:
        result["dice_se"] = error
    record = case_influence_record(influence)
    if case_influence is not None and record is not None:
        case_influence["dice"] = record
    if len(regions) > 1:
        result.update({f"dice_{name}": v for name, v in zip(regions, per_region, strict=True)})
    result.update({name: float(np.mean(values)) for name, values in surfaces.items() if values})
    return result


def surface_scores(pred: torch.Tensor, truth: torch.Tensor, spacing: torch.Tensor) -> dict[str, list[float]]:
    """HD95 and surface Dice (mm; `evaluate_dice`) of each volume and region of one-hot [B, R, ...] masks whose truth
    has foreground; `spacing` [B, 3] in mm."""
    from monai.metrics import compute_hausdorff_distance, compute_surface_dice

    scores: dict[str, list[float]] = {"hd95": [], "surface_dice": []}
    for b in range(pred.shape[0]):
        voxel = [float(v) for v in spacing[b]]
        diagonal = math.dist([0.0] * len(voxel), [n * v for n, v in zip(pred.shape[2:], voxel, strict=True)])
        for r in range(pred.shape[1]):
            p, t = pred[b : b + 1, r : r + 1].cpu(), truth[b : b + 1, r : r + 1].cpu()
            if not t.any():
                continue  # nothing to find: as Dice's ignore_empty
            if not p.any():
                scores["hd95"].append(diagonal)
                scores["surface_dice"].append(0.0)
                continue
            hd = compute_hausdorff_distance(p, t, include_background=True, percentile=95, spacing=voxel)
            nsd = compute_surface_dice(p, t, [SURFACE_TOLERANCE_MM], include_background=True, spacing=voxel)
            scores["hd95"].append(float(hd))
            scores["surface_dice"].append(float(nsd))
    return scores


def save_model(model, path: str) -> None:
    """The model's state dict, saved atomically (`save_atomic`)."""
    save_atomic(model.state_dict(), path)


def load_tensors(path: str, file=None):
    """What `save_atomic` wrote: tensors and plain values only (torch.load weights_only=True), so a file holding
    any other pickled object is never run; that, or a truncated file, is a ValueError naming the file. `file`: the
    file `path` names, already open (binary)."""
    try:
        return torch.load(path if file is None else file, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(
            f"{path}: not a readable file of tensors and plain values "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        ) from e
