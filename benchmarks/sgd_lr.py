"""Which learning rate makes plain local SGD train the default U-Net as far as the papers' Adam (lr 1e-3) does: the
lr of the q-FedAvg (SGD) benchmark arm and its FedAvg (SGD) baseline (fairfl.benchmark METHODS), chosen on one
site's own training, never on a federated result.

Each optimiser trains a fresh U-Net (same seed) for 8 epochs on one prostate site of the built-in data (64 px, batch
8, weight decay 1e-4, the job's augmentation) and is scored by Dice on the site's test split.

    PYTHONPATH=custom python benchmarks/sgd_lr.py > benchmarks/results/sgd_lr.json
"""

import json
import time

import torch

from fairfl.data.builtin import ensure_builtin
from fairfl.data.datalist import load_datalist
from fairfl.data.loaders import make_loader
from fairfl.models import DEFAULT_UNET, build_model
from fairfl.presets import TASK_DEFAULTS
from fairfl.training import TrainSettings, evaluate_dice, train_local

CANDIDATES = [("adam", 1e-3), ("sgd", 0.01), ("sgd", 0.1), ("sgd", 0.5)]
SITES, EPOCHS = ("site-1", "site-4"), 8


def main():
    torch.set_num_threads(1)
    root = ensure_builtin("prostate", image_size=64, size_scale=TASK_DEFAULTS["segmentation"]["synthetic_size_scale"])
    spec = DEFAULT_UNET  # the fedavg / qfedavg jobs' network
    rows = []
    for site in SITES:
        data = load_datalist(root, site)
        for optimizer, lr in CANDIDATES:
            torch.manual_seed(0)
            model = build_model(spec)
            train = make_loader(data["training"], 64, 2, 8, train=True, seed=0, site=site)
            test = make_loader(data["testing"], 64, 2, 8, train=False, seed=0, site=site)
            started = time.time()
            for _ in range(EPOCHS):
                stats = train_local(
                    model, train, TrainSettings(lr=lr, weight_decay=1e-4, optimizer=optimizer), torch.device("cpu")
                )
            rows.append(
                {
                    "site": site,
                    "optimizer": optimizer,
                    "lr": lr,
                    "epochs": EPOCHS,
                    "final_train_loss": round(stats["train_loss"], 4),
                    "test_dice": round(100 * evaluate_dice(model, test, 2, torch.device("cpu"))["dice"], 2),
                    "seconds": round(time.time() - started, 1),
                }
            )
    print(json.dumps({"torch": torch.__version__, "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
