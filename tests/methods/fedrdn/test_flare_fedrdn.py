"""FedRDN's FLARE parts: the controller gathering and sending the sites' statistics (hostile ones rejected for the
round naming the site, never sent; a missing site's kept), the site training on batches normalised with a drawn
site's statistics and scored with its own, and one short run through NVFlare's simulator (DP-SGD refused:
tests/methods/test_own_training_loops.py)."""

import json
import math
import os

import numpy as np
import pytest
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

import fairfl.methods.fedrdn.client as fedrdn_client
from fairfl.errors import DataError
from fairfl.flare import protocol
from fairfl.flare.executor import FairflExecutor
from fairfl.flare.site_task import SiteTask, check_meta
from fairfl.methods.fedrdn.client import own_statistics
from fairfl.methods.fedrdn.controller import FedRDNController
from fairfl.methods.fedrdn.normalization import channel_statistics, normalising, record_of, statistics_record, table
from fairfl.methods.fedrdn.protocol import FEDRDN, FEDRDN_STATISTICS, SITE_STATISTICS
from fairfl.models import build_model, initial_state, load_numpy_state
from fairfl.simulate import run_simulator

import helpers
from helpers import make_job, segmentation_task_meta, variant_controller

SEG = {"model_channels": [4, 8], "model_strides": [2], "num_rounds": 3}
SKIN = {"dataset": "skin", "model_channels": [4, 8], "model_strides": [2, 2], "num_rounds": 2}
SITES = ["site-1", "site-2", "site-3", "site-4"]


# ------------------------------------------------------------------------------------------------ the controller
def test_the_controller_sends_the_switch_in_every_task_and_reads_one_pair_per_input_channel():
    controller = FedRDNController(**SEG)
    assert controller.method == "fedrdn" and controller.site_meta() == {FEDRDN: True}
    assert controller.train_meta(0) == {}  # nothing gathered yet: the field is left out, never sent empty
    assert controller.answer_fields(protocol.TASK_TRAIN, 0) == {SITE_STATISTICS: statistics_record(1)}
    assert controller.answer_fields(protocol.TASK_VALIDATE, 0) == {}
    rgb = FedRDNController(**SKIN).answer_fields(protocol.TASK_TRAIN, 0)[SITE_STATISTICS]
    assert rgb == statistics_record(3)
    with pytest.raises(ValueError, match="exclude_sites .*held-out site is scored with the model sent"):
        FedRDNController(exclude_sites=["site-2"], **SEG)


def statistics(i, round_num=0) -> dict:
    """Site i's honest statistics in a round (they may change between rounds: its latest accepted are sent)."""
    return record_of([0.1 * i + 0.01 * round_num], [0.5 + 0.1 * i])


def make(tmp_path):
    return variant_controller("fedrdn", tmp_path, SITES, **SEG)


def trained(state: dict, seed: int) -> dict:
    generator = np.random.default_rng(seed)
    return {k: v + 0.01 * generator.standard_normal(v.shape).astype(v.dtype) for k, v in state.items()}


def play(controller, state, round_num, changed=None, missing=()):
    """One train round through the real screening and aggregation: every site of SITES but `missing` answers with its
    honest statistics, `changed` = {site: value of SITE_STATISTICS} instead (None: the field left out)."""
    answers = []
    for i, site in enumerate(SITES):
        if site in missing:
            continue
        record = (changed or {}).get(site, statistics(i, round_num))
        meta = {"client_name": site, protocol.NUM_SAMPLES: 20 + i}
        meta.update({} if record is None else {SITE_STATISTICS: record})
        params = trained(state, 10 * round_num + i)
        answers.append(FLModel(params_type=ParamsType.FULL, params=params, metrics={"train_loss": 0.5}, meta=meta))
    return helpers.server_round(controller, state, answers, round_num)


HOSTILE = {
    "NaN": {"mean_0": float("nan"), "std_0": 1.0},
    "inf": {"mean_0": 0.0, "std_0": float("inf")},
    "a zero std": {"mean_0": 0.0, "std_0": 0.0},
    "a negative std": {"mean_0": 0.0, "std_0": -1.0},
    "a huge mean": {"mean_0": 1e12, "std_0": 1.0},
    "two channels": record_of([0.0, 0.0], [1.0, 1.0]),
    "no channel": {},
    "a string": "mean 0, std 1",
    "a list": [0.0, 1.0],
    "None": None,
}


@pytest.mark.parametrize("label", HOSTILE)
def test_hostile_statistics_reject_that_site_for_the_round_and_are_never_sent(label, tmp_path):
    controller = make(tmp_path)
    state = initial_state(controller.model_spec(), 0)
    state, rejected, extras = play(controller, state, 0)
    assert not rejected and extras["statistics_sites"] == SITES
    assert controller.train_meta(1)[FEDRDN_STATISTICS] == {s: statistics(i, 0) for i, s in enumerate(SITES)}
    state, rejected, extras = play(controller, state, 1, changed={"site-3": HOSTILE[label]})
    assert set(rejected) == {"site-3"} and SITE_STATISTICS in rejected["site-3"], rejected
    assert set(extras["weights"]) == set(SITES) - {"site-3"}  # the others aggregated as FedAvg
    assert all(np.isfinite(v).all() for v in state.values() if v.dtype.kind == "f")
    sent = controller.train_meta(2)[FEDRDN_STATISTICS]
    # the others' latest statistics; site-3's from the answer accepted before, never the hostile one
    assert sent == {s: statistics(i, 0 if s == "site-3" else 1) for i, s in enumerate(SITES)}


def test_a_site_rejected_or_missing_from_its_first_round_is_sent_to_no_one_until_an_answer_of_it_is_accepted(
    tmp_path,
):
    controller = make(tmp_path)
    state = initial_state(controller.model_spec(), 0)
    state, rejected, _ = play(controller, state, 0, changed={"site-2": HOSTILE["a zero std"]}, missing=["site-4"])
    assert set(rejected) == {"site-2"}
    assert sorted(controller.train_meta(1)[FEDRDN_STATISTICS]) == ["site-1", "site-3"]
    state, rejected, extras = play(controller, state, 1, missing=["site-1"])  # site-1 absent: its statistics stay
    assert not rejected and extras["statistics_sites"] == SITES
    restored = make(tmp_path)  # what a resumed server continues from
    restored.load_method_state(controller.method_state())
    assert restored.train_meta(2) == controller.train_meta(2) and restored.final_extras() == controller.final_extras()
    assert controller.final_extras()["statistics"]["site-1"] == statistics(0, 0)


# -------------------------------------------------------------------------------------------------- the site
@pytest.fixture
def skin(cache_dir):
    """FedRDN's tasks on the built-in skin data (3 colour channels, sites that differ in colour and quality)."""
    controller = FedRDNController(**SKIN)
    meta = {**skin_meta(controller.model_spec()), **controller.site_meta()}
    return controller, meta, initial_state(controller.model_spec(), 0)


def skin_meta(spec: dict) -> dict:
    """A task's meta to a site of the built-in skin data (3 sites), training and scoring the model sent."""
    return {**segmentation_task_meta(spec), protocol.DATASET: "skin", protocol.TASK: "classification"}


def executor():
    return FairflExecutor(image_size=32, batch_size=16, synthetic_size_scale=0.2, lr=3e-4, weight_decay=5e-4)


def train(site_executor, meta, params, state_dir, round_num=0, site="site-1"):
    task = FLModel(params_type=ParamsType.FULL, params=params, current_round=round_num, meta=meta)
    return site_executor._train(SiteTask.of(site, task), str(state_dir))


FAR = {"site-9": record_of([5.0, 5.0, 5.0], [0.1, 0.1, 0.1])}  # a site far from site-1: inputs near -50


def test_the_site_trains_on_images_normalised_with_drawn_sites_and_replies_its_own_statistics(
    skin, tmp_path, monkeypatch
):
    controller, meta, sent = skin
    seen = []  # each training image's mean over its channels and pixels, as the network receives it
    real = fedrdn_client.train_local

    def spying(model, batches, *args, **kwargs):
        class Spy:
            def __len__(self):
                return len(batches)

            def __iter__(self):
                for batch in batches:
                    seen.extend(batch["image"].flatten(1).mean(1).tolist())
                    yield batch

        return real(model, Spy(), *args, **kwargs)

    monkeypatch.setattr(fedrdn_client, "train_local", spying)
    site = executor()
    result = train(site, {**meta, FEDRDN_STATISTICS: FAR}, sent, tmp_path / "a")
    own = result.meta[SITE_STATISTICS]
    task = SiteTask.of("site-1", FLModel(meta=meta))
    # the site's own: its training split as the network receives it, unaugmented
    assert own == pytest.approx(
        channel_statistics(b["image"] for b in site._loader(task, "training", train=False, seed=site.seed))
    )
    assert statistics_record(3).problem(own) is None and result.metrics["fedrdn_sites"] == 2.0
    assert max(own.values()) > 0.05 and abs(own["mean_0"] - own["mean_2"]) > 0.1  # colour: not (0, 1) everywhere
    far, near = [m for m in seen if m < -20], [m for m in seen if abs(m) < 3]
    assert far and near and len(far) + len(near) == len(seen)  # each image either site's, both drawn
    # the same task again is the same training (the draw is seeded by the job's seed, the site and the round)
    again = train(executor(), {**meta, FEDRDN_STATISTICS: FAR}, sent, tmp_path / "b")
    assert all(np.array_equal(result.params[k], again.params[k]) for k in result.params)
    alone = train(executor(), meta, sent, tmp_path / "c")  # round 0: its own statistics alone
    assert alone.metrics["fedrdn_sites"] == 1.0 and alone.meta[SITE_STATISTICS] == own
    assert not all(np.array_equal(result.params[k], alone.params[k]) for k in result.params)


def test_the_site_is_scored_on_images_normalised_with_its_own_statistics(skin, tmp_path):
    controller, meta, sent = skin
    site = executor()
    validate = {**meta, protocol.EVALUATE: protocol.FROM_GLOBAL}
    task = SiteTask.of("site-3", FLModel(params_type=ParamsType.FULL, params=sent, meta=validate))
    scores = site._validate(task, str(tmp_path)).metrics
    own = own_statistics(site._context(task, str(tmp_path), trains=False))
    _, mean, std = table({"site-3": own})
    loader = site._loader(task, "testing", train=False, seed=site.seed, whole=True)
    model = load_numpy_state(build_model(controller.model_spec()), sent)
    expected = site._test_scores(task, normalising(model, mean[0], std[0]), loader)
    plain = site._test_scores(task, load_numpy_state(build_model(controller.model_spec()), sent), loader)
    assert {k: scores[k] for k in expected} == pytest.approx(expected, abs=1e-9)
    assert any(not math.isclose(expected[k], plain[k], abs_tol=1e-6) for k in expected)  # not the images as they are


def test_the_site_refuses_statistics_it_cannot_use_naming_the_field(skin, tmp_path):
    controller, meta, sent = skin
    for bad in ({}, {"site-2": {"mean_0": 0.0, "std_0": 0.0}}, "site-2", [FAR], {"site-2": None}):
        with pytest.raises(DataError, match=f"task field {FEDRDN_STATISTICS} "):
            check_meta("site-1", {**meta, FEDRDN_STATISTICS: bad})
    grey = {"site-2": record_of([0.0], [1.0])}  # sound, but of one channel for a 3-channel network
    check_meta("site-1", {**meta, FEDRDN_STATISTICS: grey})
    with pytest.raises(DataError, match=f"{FEDRDN_STATISTICS} has statistics of 1 channels, the network takes 3"):
        train(executor(), {**meta, FEDRDN_STATISTICS: grey}, sent, tmp_path)
    with pytest.raises(DataError, match="task field fedrdn "):
        check_meta("site-1", {**meta, FEDRDN: "yes"})


# --------------------------------------------------------------------------------------------- the simulator
@pytest.mark.slow
def test_a_short_fedrdn_run_gathers_every_sites_statistics_and_trains_with_them(tmp_path, cache_dir):
    job = make_job("fedrdn", str(tmp_path / "job"), server=SKIN, client={"synthetic_size_scale": 0.2})
    run = run_simulator(job, str(tmp_path / "ws"), n_clients=3, threads=3, timeout=600)
    assert run.ok, run.describe_failure()
    with open(run.results_path) as f:
        results = json.load(f)
    sites = ["site-1", "site-2", "site-3"]
    assert results["method"] == "fedrdn" and [r["round"] for r in results["rounds"]] == [0, 1]
    first, second = results["rounds"]
    assert all(first["train"][s]["fedrdn_sites"] == 1.0 for s in sites)  # round 0: its own statistics only
    assert all(second["train"][s]["fedrdn_sites"] == 3.0 for s in sites)  # then every site's
    assert first["statistics_sites"] == second["statistics_sites"] == sites and "rejected" not in second
    final = results["final"]
    assert all(0.0 <= final["per_site"][s]["auc"] <= 1.0 for s in sites)
    # what each site sent is its own training images' statistics, as it computes them
    site = executor()
    task = SiteTask.of("site-2", FLModel(meta=skin_meta(FedRDNController(**SKIN).model_spec())))
    site.synthetic_size_scale = 0.2
    expected = own_statistics(site._context(task, str(tmp_path / "state"), trains=False))
    assert final["statistics"]["site-2"] == pytest.approx(expected, rel=1e-6)
    assert os.path.isfile(os.path.join(os.path.dirname(run.results_path), "method_state.json"))
