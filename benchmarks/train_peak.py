"""Peak memory of a site's local training step (the default U-Net, Adam, Dice + cross-entropy) at one image size and
batch size, to compare with the CKA probe's (benchmarks/cka_cost.py --batch-sizes): the probe should not raise a
site's peak above its training's.

    PYTHONPATH=custom python benchmarks/train_peak.py 384 8 > benchmarks/results/train_peak_384px_b8.json

Prints one JSON line: the resident memory before training and its peak during two steps, in MiB (Linux /proc)."""

import argparse
import json

import torch

from fairfl.models import DEFAULT_UNET, build_model
from fairfl.training import segmentation_loss


def resident_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("image_size", type=int)
    parser.add_argument("batch_size", type=int)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = build_model(DEFAULT_UNET)
    optimizer, loss_fn = torch.optim.Adam(model.parameters(), 1e-3), segmentation_loss()
    images = torch.randn(args.batch_size, 1, args.image_size, args.image_size)
    masks = (torch.rand(args.batch_size, 1, args.image_size, args.image_size) > 0.5).long()
    with open("/proc/self/clear_refs", "w") as f:  # reset the peak (VmHWM) to the current resident size
        f.write("5")
    before = resident_kib("VmRSS")
    for _ in range(2):
        optimizer.zero_grad()
        loss_fn(model(images), masks).backward()
        optimizer.step()
    print(
        json.dumps(
            {
                "image_size": args.image_size,
                "batch_size": args.batch_size,
                "torch": torch.__version__,
                "before_mib": round(before / 1024, 1),
                "peak_mib": round(resident_kib("VmHWM") / 1024, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
