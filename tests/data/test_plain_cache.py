"""2-D training loaders cache plain tensors and augment with MONAI's metadata tracking off
(fairfl.data.loaders.PlainCacheDataset): the same batches, value for value and draw for draw, as MONAI's CacheDataset
with MetaTensors gives for the same pipeline and seeds, for segmentation and classification, in the site process and
in loader workers; and the switch is back as it was afterwards."""

import pytest
import torch
from monai.data import CacheDataset, DataLoader, get_track_meta

from fairfl.data.builtin import ensure_builtin
from fairfl.data.datalist import load_datalist
from fairfl.data.loaders import PlainCacheDataset, make_loader


def _batches(loader, seed):
    loader.generator.manual_seed(seed)
    loader.dataset.transform.set_random_state(seed=seed)
    return [{k: v.clone() for k, v in batch.items() if isinstance(v, torch.Tensor)} for batch in loader]


@pytest.mark.parametrize(
    "kind, workers",
    [("segmentation", 0), ("classification", 0), ("segmentation", 2)],
)
def test_plain_cached_batches_are_the_metatensor_pipeline_s_batches(cache_dir, kind, workers):
    if kind == "segmentation":
        root = ensure_builtin("prostate", image_size=32, seed=0, num_sites=2, size_scale=0.5)
        entries, options = load_datalist(root, "site-1", num_classes=2)["training"], {"num_classes": 2}
    else:
        root = ensure_builtin("skin", image_size=32, seed=0, num_sites=4, size_scale=0.05)
        entries = load_datalist(root, "site-1", num_classes=8, task="classification")["training"]
        options = {"num_classes": 8, "task": "classification", "in_channels": 3}
    loader = make_loader(entries, 32, batch_size=4, train=True, seed=1, num_workers=workers, **options)
    assert isinstance(loader.dataset, PlainCacheDataset)
    assert all(type(v) is torch.Tensor for v in loader.dataset._cache[0].values() if isinstance(v, torch.Tensor))
    reference = DataLoader(  # MONAI's own cache of the same pipeline: MetaTensors, metadata tracked
        CacheDataset(entries, transform=loader.dataset.transform, cache_rate=1.0, num_workers=0, progress=False),
        batch_size=4,
        shuffle=True,
        num_workers=workers,
        generator=torch.Generator().manual_seed(1),
    )
    assert type(reference.dataset._cache[0]["image"]) is not torch.Tensor  # the reference really is the other path
    for seed in (3, 4):
        ours, theirs = _batches(loader, seed), _batches(reference, seed)
        assert len(ours) == len(theirs) > 1
        for a, b in zip(ours, theirs, strict=True):
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert get_track_meta()  # the switch is back on for everything else in the process


def test_metadata_tracking_blocks_in_several_threads_leave_it_as_it_was():
    """MONAI's switch is one for the whole process: the first block in turns it off, the last one out turns it back,
    however the blocks of two threads interleave."""
    import threading

    from fairfl.data.loaders import _metadata_off

    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()

    def first():
        with _metadata_off():
            first_in.set()
            second_in.wait(5)
        first_out.set()

    def second():
        first_in.wait(5)
        with _metadata_off():
            second_in.set()
            first_out.wait(5)
            assert not get_track_meta()  # still off while this block runs

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert get_track_meta()
