"""The 3-D path (fairfl.data.volumes, the volume loaders, sliding-window scoring and surface metrics): what would catch
it being subtly wrong. A site that stores its axes flipped or its slices thicker must give the network the same
anatomy; a label must stay on its image through every transform; a whole volume scored by sliding window must be
what the network says of it; HD95 and surface Dice must be distances in mm, checked against a computation by hand."""

import json

import nibabel as nib
import numpy as np
import pytest
import torch

from fairfl.data.datalist import load_dataset_info
from fairfl.data.loaders import make_loader
from fairfl.data.volumes import VolumeSettings
from fairfl.errors import DataError
from fairfl.training import evaluate_dice, sliding_window, surface_scores

SHAPE = (40, 36, 20)  # x, y, z voxels at SPACING mm
SPACING = (1.5, 1.5, 3.0)


def asymmetric_case():
    """An image and mask (numpy, x, y, z) whose object is asymmetric along every axis (a flip would show), and whose
    intensity marks the object (so image and label can be compared after any transform)."""
    x, y, z = np.meshgrid(*(np.arange(n) for n in SHAPE), indexing="ij")
    mask = ((x - 14) ** 2 / 64 + (y - 20) ** 2 / 36 + (z - 8) ** 2 / 9 < 1) | ((x > 22) & (x < 30) & (y < 8) & (z > 12))
    rng = np.random.default_rng(0)
    image = (300.0 * mask + rng.normal(0, 20, SHAPE)).astype(np.float32)
    return image, mask.astype(np.uint8)


def write_case(folder, name, image, mask, affine):
    for kind, array in (("image", image), ("label", mask)):
        nib.save(nib.Nifti1Image(np.ascontiguousarray(array), affine), folder / f"{name}_{kind}.nii.gz")
    return {"image": f"{name}_image.nii.gz", "label": f"{name}_label.nii.gz", "case": name}


def stored_variants(folder):
    """The same case stored three ways, as different sites' converters store it: as is (RAS), with its x and z axes
    flipped (the affine saying so), and with its axes transposed to (z, y, x)."""
    image, mask = asymmetric_case()
    ras = np.diag([*SPACING, 1.0])
    flipped = ras.copy()
    flipped[0, 0], flipped[2, 2] = -SPACING[0], -SPACING[2]
    flipped[0, 3], flipped[2, 3] = SPACING[0] * (SHAPE[0] - 1), SPACING[2] * (SHAPE[2] - 1)
    transposed = np.zeros((4, 4))
    transposed[0, 2], transposed[1, 1], transposed[2, 0], transposed[3, 3] = SPACING[0], SPACING[1], SPACING[2], 1
    return [
        write_case(folder, "ras", image, mask, ras),
        write_case(folder, "flipped", image[::-1, :, ::-1], mask[::-1, :, ::-1], flipped),
        write_case(folder, "transposed", image.transpose(2, 1, 0), mask.transpose(2, 1, 0), transposed),
    ]


def whole(entries, root, spacing=None):
    settings = VolumeSettings(patch_size=(32, 32, 16), spacing=spacing)
    absolute = [{**e, "image": str(root / e["image"]), "label": str(root / e["label"])} for e in entries]
    return list(make_loader(absolute, 64, 2, 1, train=False, seed=0, volume=settings, whole=True))


def test_a_site_s_axis_order_and_direction_change_nothing_the_network_sees(tmp_path):
    batches = whole(stored_variants(tmp_path), tmp_path)
    reference = batches[0]
    assert reference["image"].shape[2:] == SHAPE
    for batch in batches[1:]:
        assert torch.equal(batch["label"], reference["label"])
        assert torch.allclose(batch["image"], reference["image"], atol=1e-5)
        assert torch.allclose(batch["spacing"], torch.tensor([SPACING]))


def test_resampling_keeps_the_label_on_its_image_and_the_spacing_recorded(tmp_path):
    (batch,) = whole(stored_variants(tmp_path)[1:2], tmp_path, spacing=(3.0, 3.0, 3.0))
    image, label = batch["image"][0, 0], batch["label"][0, 0]
    assert image.shape == (20, 18, 20) and torch.allclose(batch["spacing"], torch.tensor([[3.0, 3.0, 3.0]]))
    assert set(label.unique().tolist()) == {0, 1}  # nearest: classes stay classes
    # the object is bright: inside the mask the image is high, outside low (after [0, 1] percentile scaling)
    assert image[label == 1].mean() > 0.6 > 0.3 > image[label == 0].mean()


def test_training_patches_are_half_on_the_foreground_and_of_the_patch_size(tmp_path):
    entries = stored_variants(tmp_path)[:1]
    absolute = [{**e, "image": str(tmp_path / e["image"]), "label": str(tmp_path / e["label"])} for e in entries]
    settings = VolumeSettings(patch_size=(16, 16, 16), patches_per_volume=32)
    loader = make_loader(absolute, 64, 2, 1, train=True, seed=0, volume=settings, augmentation=[])
    batch = next(iter(loader))
    assert batch["image"].shape == (32, 1, 16, 16, 16) and batch["label"].shape == (32, 1, 16, 16, 16)
    # RandCropByPosNegLabeld, pos 1 neg 1: each centre on the object with probability 1/2 (a uniform crop: 3%)
    assert 8 <= int(batch["label"][:, 0, 8, 8, 8].sum()) <= 24


def test_a_dataset_json_of_another_task_is_refused_naming_it(tmp_path):
    (tmp_path / "dataset.json").write_text(json.dumps({"task": "segmentation", "num_classes": 2, "spatial_dims": 3}))
    assert (
        load_dataset_info(tmp_path, "site-1", 2, task="segmentation", spatial_dims=3)["declared"]["spatial_dims"] == 3
    )
    with pytest.raises(DataError, match=r"site-1.*dataset.json.*spatial_dims 3 \(the job's: 2\)"):
        load_dataset_info(tmp_path, "site-1", 2, task="segmentation", spatial_dims=2)
    with pytest.raises(DataError, match=r"num_classes 2 \(the job's: 4\)"):
        load_dataset_info(tmp_path, "site-1", 4, task="segmentation", spatial_dims=3)


class Oracle(torch.nn.Module):
    """Logits that reproduce a fixed mask at the position of every window: what a perfect network would say."""

    def __init__(self, mask: torch.Tensor):
        super().__init__()
        self.mask = mask  # [1, 1, X, Y, Z] of the whole volume
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def forward(self, image):
        # the sliding window feeds crops; the oracle reads the crop's position off the image, which is an index map
        index = image[:, 0].long()
        flat = self.mask.flatten()[index.flatten()].reshape(index.shape).float()
        return torch.stack([1 - flat, flat], dim=1) * 10


def test_sliding_window_scoring_of_a_whole_volume_is_exact_for_a_perfect_network():
    mask = torch.zeros(1, 1, 40, 36, 20)
    mask[..., 10:20, 8:30, 4:12] = 1
    index = torch.arange(mask.numel(), dtype=torch.float32).reshape(mask.shape)  # each voxel its own flat index
    loader = [{"image": index, "label": mask.long(), "spacing": torch.tensor([SPACING])}]
    scores = evaluate_dice(Oracle(mask), loader, 2, "cpu", predict=sliding_window((16, 16, 8), 0.25))
    assert scores["dice"] == pytest.approx(1.0) and scores["hd95"] == pytest.approx(0.0)
    assert scores["surface_dice"] == pytest.approx(1.0)


def test_hd95_and_surface_dice_are_millimetres_against_a_computation_by_hand():
    """Two boxes, the prediction shifted by 3 voxels along z (3 mm voxels: 9 mm): every boundary point of the shifted
    faces is 9 mm off, so the 95th percentile distance is 9 mm, and at 2 mm tolerance only the boundary points that
    both boxes share count for the surface Dice."""
    truth = torch.zeros(1, 1, 30, 30, 30)
    truth[..., 5:20, 5:20, 5:20] = 1
    pred = torch.zeros_like(truth)
    pred[..., 5:20, 5:20, 8:23] = 1
    scores = surface_scores(pred, truth, torch.tensor([[1.0, 1.0, 3.0]]))
    assert scores["hd95"] == [pytest.approx(9.0)]
    assert 0.0 < scores["surface_dice"][0] < 1.0
    empty = surface_scores(torch.zeros_like(truth), truth, torch.tensor([[1.0, 1.0, 3.0]]))
    diagonal = float(np.linalg.norm([30.0, 30.0, 90.0]))
    assert empty == {"hd95": [pytest.approx(diagonal)], "surface_dice": [0.0]}  # predicted empty: the worst
    assert surface_scores(pred, torch.zeros_like(truth), torch.tensor([[1.0, 1.0, 3.0]])) == {
        "hd95": [],
        "surface_dice": [],
    }  # nothing to find: not scored


@pytest.mark.parametrize("task", ["segmentation", "classification"])
def test_a_bundle_s_preprocessing_replaces_the_volumes_own_for_either_task(tmp_path, task):
    """A MONAI bundle's transforms (fairfl.bundle) take the place of the CT window or MR percentiles for volumes of
    either task, never silently dropped: here one that scales intensities to [0, 7] instead of [0, 1]."""
    (entry,) = stored_variants(tmp_path)[:1]
    absolute = {"image": str(tmp_path / entry["image"]), "label": str(tmp_path / entry["label"])}
    if task == "classification":
        absolute["label"] = 1
    scale = [{"name": "ScaleIntensityd", "args": {"keys": "image", "minv": 0.0, "maxv": 7.0}}]
    settings = VolumeSettings(patch_size=(16, 16, 16))
    for preprocessing, top in ((None, 1.0), (scale, 7.0)):
        loader = make_loader(
            [absolute], 64, 2, 1, train=False, seed=0, task=task, volume=settings, preprocessing=preprocessing
        )
        image = next(iter(loader))["image"]
        # a patch or a resize may miss the brightest voxel: within the range, near its top
        assert 0.8 * top < float(image.max()) <= top + 1e-4, (task, preprocessing, float(image.max()))
