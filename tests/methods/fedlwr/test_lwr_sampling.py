"""Fed-LWR's CKA sample on the built-in prostate data: a seeded random sample of the site in random order, whatever
the site's size, never datalist order (neighbouring slices of one patient per minibatch bias CKA high at small
sites); so the layer weights do not depend on how a site's datalist is ordered."""

import numpy as np
import pytest
import torch
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

from fairfl.data.builtin import ensure_builtin
from fairfl.data.datalist import load_datalist
from fairfl.data.loaders import make_loader, segmentation_transforms
from fairfl.errors import DataError
from fairfl.files import save_atomic
from fairfl.flare import protocol
from fairfl.flare.executor import FairflExecutor
from fairfl.flare.site_task import SiteTask, check_meta
from fairfl.methods.fedlwr.cka import layerwise_cka
from fairfl.methods.fedlwr.client import AnchorCKA
from fairfl.methods.fedlwr.controller import FedLWRController
from fairfl.methods.fedlwr.protocol import CKA, CKA_BATCH_SIZE, CKA_MAX_POSITIONS, CKA_MAX_SAMPLES, CKA_SPLIT
from fairfl.methods.fedlwr.weights import lwr_layer_weights
from fairfl.models import build_model, initial_state, load_numpy_state, state_to_numpy
from fairfl.training import TrainSettings, train_local

SITES = ("site-1", "site-2", "site-3")
SPEC = {"name": "unet", "in_channels": 1, "num_classes": 2, "channels": [8, 16, 32], "strides": [2, 2]}
SIZE, SCALE = 32, 0.5  # the simulator tests' tiny data: 27-30 training slices per site, 5-7 per patient


@pytest.fixture(scope="module")
def prostate(cache_dir):
    """(data root, {site: training entries in the datalist's order: patient by patient})."""
    root = ensure_builtin("prostate", image_size=SIZE, seed=0, num_sites=len(SITES), size_scale=SCALE)
    return root, {s: load_datalist(root, s, num_classes=2)["training"] for s in SITES}


@pytest.fixture(scope="module")
def models(prostate):
    """(anchor, {site: local model}): each local model is the anchor after 6 real training steps on its site."""
    torch.manual_seed(0)
    anchor = load_numpy_state(build_model(SPEC), initial_state(SPEC, 0))
    local = {}
    for site, entries in prostate[1].items():
        local[site] = load_numpy_state(build_model(SPEC), state_to_numpy(anchor.state_dict()))
        train_local(
            local[site],
            make_loader(entries, SIZE, 2, 8, train=True, seed=1),
            TrainSettings(lr=1e-3, weight_decay=1e-4, batch_size=8, local_steps=6),
            "cpu",
        )
    return anchor, local


def _paths(entries, seed, batch_size, max_samples):
    """The image files of one pass of the CKA loader, in the order it reads them."""
    loader = make_loader(entries, SIZE, 2, batch_size, train=False, seed=seed, max_samples=max_samples)
    return [loader.dataset.data[i]["image"] for i in loader.sampler]


def test_the_sample_of_a_small_site_is_all_of_it_in_a_seeded_random_order(prostate):
    entries = prostate[1]["site-2"]  # 27 slices of 5 patients, datalist order = patient order
    paths = [e["image"] for e in entries]
    order = _paths(entries, seed=11, batch_size=8, max_samples=64)
    assert sorted(order) == sorted(paths) and order != paths, "every slice once, not in datalist order"
    assert len({p.rsplit("_s", 1)[0] for p in order[:8]}) >= 3, "a minibatch mixes patients"
    assert order == _paths(entries, seed=11, batch_size=8, max_samples=64)  # seeded
    assert order != _paths(entries, seed=12, batch_size=8, max_samples=64)  # another round, another order
    shuffled = [entries[i] for i in np.random.default_rng(0).permutation(len(entries))]
    assert _paths(shuffled, seed=11, batch_size=8, max_samples=64) == order  # the datalist's order is irrelevant
    subset = _paths(entries, seed=11, batch_size=8, max_samples=10)
    assert len(set(subset)) == 10 and set(subset) < set(paths)
    with pytest.raises(ValueError, match="max_samples"):
        make_loader(entries, SIZE, 2, 8, train=False, seed=0, max_samples=0)


def mean_weights(cka_of_site) -> dict:
    """{site: Fed-LWR layer weight, mean over layers} from {site: its per-layer CKA}."""
    weights = lwr_layer_weights({s: cka_of_site(s) for s in SITES})
    return {s: float(np.mean([weights[layer][s] for layer in weights])) for s in SITES}


def test_layer_weights_match_the_whole_site_and_ignore_the_datalists_order(prostate, models):
    anchor, local = models
    datalists = prostate[1]

    def sampled(lists, batch_size):
        return lambda s: layerwise_cka(
            local[s],
            anchor,
            (b["image"] for b in make_loader(lists[s], SIZE, 2, batch_size, train=False, seed=5, max_samples=64)),
        )

    whole = mean_weights(sampled(datalists, 64))  # each site in one minibatch: no minibatch composition at all
    ours = mean_weights(sampled(datalists, 8))
    assert all(abs(ours[s] - whole[s]) < 0.05 for s in SITES), (ours, whole)
    rng = np.random.default_rng(1)
    for lists in (
        {s: [datalists[s][i] for i in rng.permutation(len(datalists[s]))] for s in SITES},
        {s: datalists[s][::-1] for s in SITES},
    ):
        assert mean_weights(sampled(lists, 8)) == pytest.approx(ours, abs=1e-6)
    # what the loader did before: minibatches of 8 in datalist order, one or two patients each. On this data
    # that is far off (the within-patient variation alone), so the test above can tell the two apart.
    transform = segmentation_transforms(SIZE, 2, train=False)

    def in_datalist_order(s):
        images = [transform(e)["image"] for e in datalists[s]]
        return layerwise_cka(local[s], anchor, [torch.stack(images[i : i + 8]) for i in range(0, len(images), 8)])

    patient_ordered = mean_weights(in_datalist_order)
    assert max(abs(patient_ordered[s] - whole[s]) for s in SITES) > 0.2, (patient_ordered, whole)


def test_a_site_measures_cka_on_a_fresh_sample_every_round_in_minibatches_of_cka_batch_size(
    prostate, models, tmp_path, monkeypatch
):
    """The cka task (AnchorCKA, through the executor's loaders) with the sample the server sends in its meta: the
    Fed-LWR controller's arguments cka_split, cka_max_samples and cka_batch_size, which a site checks as task fields
    (a missing one too)."""
    monkeypatch.setenv("FAIRFL_DATA_ROOT", str(prostate[0]))
    anchor, local = models
    save_atomic({"round": 3, "model": local["site-2"].state_dict()}, str(tmp_path / protocol.LOCAL_MODEL_FILE))
    meta = {protocol.MODEL_SPEC: SPEC, protocol.NUM_SITES: len(SITES)}
    executor = FairflExecutor(image_size=SIZE, batch_size=8)

    def cka(round_num, batch_size, split="training"):
        sample = {CKA_SPLIT: split, CKA_MAX_SAMPLES: 64, CKA_BATCH_SIZE: batch_size, CKA_MAX_POSITIONS: 4096}
        task = FLModel(
            params_type=ParamsType.FULL,
            params=state_to_numpy(anchor.state_dict()),
            current_round=round_num,
            meta={**meta, **sample},
        )
        return executor._method_task(AnchorCKA, SiteTask.of("site-2", task), str(tmp_path)).meta[CKA]

    first = cka(3, 8)
    assert cka(3, 8) == first and cka(4, 8) != first  # seeded by site and round
    whole = cka(3, 64)  # the site in one minibatch
    assert whole == pytest.approx(cka(4, 64), abs=1e-12)
    validation = cka(3, 64, "validation")
    assert validation.keys() == first.keys() and validation != whole  # the authors' split: other images
    controller = FedLWRController(cka_batch_size=8)
    controller.task_meta = meta  # every task's meta, set when the job starts
    sent = controller.cka_meta()
    expected = {CKA_SPLIT: "training", CKA_MAX_SAMPLES: 64, CKA_BATCH_SIZE: 8, CKA_MAX_POSITIONS: 4096}
    assert {k: sent[k] for k in AnchorCKA.fields} == expected
    for bad in (
        {"cka_batch_size": 3},
        {"cka_split": "testing"},
        {"cka_max_samples": 2},
        {"cka_batch_size": None},
        {"cka_batch_size": 32.5},
        {"cka_max_positions": 0},
    ):
        with pytest.raises(ValueError, match="cka"):
            FedLWRController(**bad)
        with pytest.raises(DataError, match=f"task field {next(iter(bad))} is"):
            check_meta("site-2", {**meta, **sent, **bad}, AnchorCKA)
    with pytest.raises(DataError, match="task field cka_split is missing"):
        check_meta("site-2", {**meta, CKA_MAX_SAMPLES: 64, CKA_BATCH_SIZE: 8, CKA_MAX_POSITIONS: 64}, AnchorCKA)
