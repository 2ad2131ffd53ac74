"""A method's sample of the training split read from the training loader's cache (fairfl.data.loaders.SampleOfCache,
Fed-LWR's CKA sample): the same items in the same order as when they are decoded from disk, for 2-D segmentation,
classification and 3-D volumes, whatever the datalist's order; nothing decoded again; and the training batches
unchanged by the sample having been read."""

import random

import pytest
import torch

import fairfl.data.loaders as loaders
from fairfl.data.builtin import ensure_builtin
from fairfl.data.datalist import load_datalist
from fairfl.data.loaders import SampleOfCache, make_loader
from fairfl.data.volumes import VolumeSettings
from tests.data.test_volumes import stored_variants


def _batches(loader, seed):
    """Every batch of one pass with the loader re-seeded as the executor re-seeds it each round."""
    loader.generator.manual_seed(seed)
    loader.dataset.transform.set_random_state(seed=seed)
    return [{k: v.clone() for k, v in batch.items() if isinstance(v, torch.Tensor)} for batch in loader]


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def _cases(cache_dir, tmp_path):
    prostate = ensure_builtin("prostate", image_size=32, seed=0, num_sites=2, size_scale=0.5)
    skin = ensure_builtin("skin", image_size=32, seed=0, num_sites=4, size_scale=0.05)
    volume_entries = stored_variants(tmp_path)
    volume_entries = [
        {**e, "image": str(tmp_path / e["image"]), "label": str(tmp_path / e["label"])} for e in volume_entries
    ]
    return {
        "segmentation": (load_datalist(prostate, "site-1", num_classes=2)["training"], {}),
        "classification": (
            load_datalist(skin, "site-1", num_classes=8, task="classification")["training"],
            {"task": "classification", "in_channels": 3, "num_classes": 8},
        ),
        "volumes": (volume_entries, {"volume": VolumeSettings(patch_size=(16, 16, 8), patches_per_volume=2)}),
    }


@pytest.mark.parametrize("kind", ["segmentation", "classification", "volumes"])
def test_a_sample_read_from_the_training_cache_is_the_sample_read_from_disk(cache_dir, tmp_path, kind):
    entries, options = _cases(cache_dir, tmp_path)[kind]
    options = {"num_classes": 2, **options}
    training = make_loader(entries, 32, batch_size=4, train=True, seed=1, **options)
    first = _batches(training, 5)
    shuffled = list(entries)
    random.Random(3).shuffle(shuffled)  # the sample must not depend on the datalist's order
    sampled = dict(train=False, seed=1, max_samples=5, **options)
    from_disk = make_loader(entries, 32, batch_size=2, **sampled)
    from_cache = make_loader(shuffled, 32, batch_size=2, decoded=training.dataset, **sampled)
    assert isinstance(from_cache.dataset, SampleOfCache)
    for seed in (7, 8):  # a fresh sample each round, the same one both ways
        _same(_batches(from_cache, seed), _batches(from_disk, seed))
    _same(_batches(training, 5), first)  # reading the sample changed nothing training reads


def test_a_sample_from_the_cache_decodes_nothing(cache_dir, tmp_path, monkeypatch):
    entries, _ = _cases(cache_dir, tmp_path)["segmentation"]
    training = make_loader(entries, 32, 2, 4, train=True, seed=1)
    sample = make_loader(entries, 32, 2, 2, train=False, seed=1, max_samples=5, decoded=training.dataset)

    def no_decoding(self, data):
        raise AssertionError(f"decoded {data} again")

    monkeypatch.setattr(loaders.LoadCheckedd, "__call__", no_decoding)
    assert sum(len(batch["image"]) for batch in sample) == 5


def test_a_cache_of_other_entries_is_refused(cache_dir, tmp_path):
    entries, _ = _cases(cache_dir, tmp_path)["segmentation"]
    training = make_loader(entries[:-1], 32, 2, 4, train=True, seed=1)
    with pytest.raises(ValueError, match="other entries"):
        make_loader(entries, 32, 2, 2, train=False, seed=1, max_samples=5, decoded=training.dataset)


def test_building_a_sample_loader_leaves_the_training_loader_s_random_state_alone(cache_dir, tmp_path):
    """MONAI's DataLoader seeds every random transform it finds under its dataset: the sample holds only the training
    cache's items, so building it does not re-seed the training loader's augmentation."""
    entries, _ = _cases(cache_dir, tmp_path)["segmentation"]
    training = make_loader(entries, 32, 2, 4, train=True, seed=1)
    training.dataset.transform.set_random_state(seed=5)
    expected = [training.dataset[i] for i in range(3)]
    training.dataset.transform.set_random_state(seed=5)
    make_loader(entries, 32, 2, 2, train=False, seed=9, max_samples=5, decoded=training.dataset)
    for item, again in zip(expected, [training.dataset[i] for i in range(3)], strict=True):
        assert torch.equal(item["image"], again["image"])
