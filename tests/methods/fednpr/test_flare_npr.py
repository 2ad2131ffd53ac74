"""FedNPR, FedNPR-Per and FedProx in the FLARE layer: controllers on hand-made updates, the executor on tiny data."""

import math

import numpy as np
import pytest
import torch
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

from fairfl.flare import protocol
from fairfl.flare.engine import SiteUpdate
from fairfl.flare.executor import FairflExecutor
from fairfl.flare.site_task import SiteTask
from fairfl.methods.fednpr.controller import FedNPRController
from fairfl.methods.fednpr.protocol import NPR
from fairfl.methods.fedprox.client import with_proximal_term
from fairfl.methods.fedprox.controller import FedProxController
from fairfl.methods.fedprox.protocol import PROX_MU
from fairfl.methods.steps import TaskSteps
from fairfl.models import build_model, head_state_keys, initial_state, load_numpy_state, state_to_torch
from fairfl.report.runs import group_of

from helpers import trained_weights

TINY = {"dataset": "skin_imbalanced", "model_channels": [4, 8], "num_rounds": 2}


def perturbed_updates(global_state, sites=("site-1", "site-2", "site-3")):
    generator = torch.Generator().manual_seed(0)
    return {
        site: SiteUpdate(
            {
                k: v + 0.1 * (i + 1) * torch.randn(v.shape, generator=generator) if v.is_floating_point() else v
                for k, v in state_to_torch(global_state).items()
            },
            10 * (i + 1),
            {},
        )
        for i, site in enumerate(sites)
    }


def test_method_names_settings_and_refusals():
    assert FedNPRController(**TINY).method == "fednpr"
    assert FedNPRController(personal_head=True, **TINY).method == "fednpr_per"
    assert FedNPRController(mu=0.01, **TINY).method == "fedprox_npr"
    assert FedProxController().method == "fedprox" and FedProxController().train_meta(0) == {PROX_MU: 0.01}
    meta = FedNPRController(num_subclusters=1, **TINY).train_meta(0)
    assert meta[NPR]["k"] == 1 and PROX_MU not in meta
    # the authors' regulariser by default: LayerNorm'd logits, weight 1; Eq. 3 as printed on request
    assert meta[NPR]["logits"] == "layernorm" and meta[NPR]["weight"] == 1.0
    cosine = FedNPRController(npr_logits="cosine", temperature=0.1, **TINY)
    assert cosine.train_meta(0)[NPR]["logits"] == "cosine" and cosine.config()["npr_logits"] == "cosine"
    for bad in ({"npr_logits": "LayerNorm"}, {"temperature": 0.0}, {"npr_weight": -1}):
        with pytest.raises(ValueError):
            FedNPRController(**bad, **TINY)
    with pytest.raises(ValueError, match="classification method"):
        FedNPRController(dataset="prostate")
    with pytest.raises(ValueError):
        FedNPRController(num_subclusters=0, **TINY)
    with pytest.raises(ValueError):
        FedProxController(mu=-1)


@pytest.mark.parametrize("personal", [False, True])
def test_fednpr_per_leaves_the_head_out_of_aggregation(personal):
    controller = FedNPRController(personal_head=personal, **TINY)
    global_state = initial_state(controller.model_spec(), 0)
    updates = perturbed_updates(global_state)
    new_state, extras = controller.aggregate_round(0, global_state, updates, {})
    weights = extras["weights"]
    assert weights == pytest.approx({"site-1": 1 / 6, "site-2": 2 / 6, "site-3": 3 / 6})
    head = set(head_state_keys(controller.model_spec()))
    assert head and head < set(global_state)
    for key in global_state:
        averaged = sum(weights[s] * updates[s].state[key].double() for s in updates).numpy()
        if personal and key in head:
            np.testing.assert_array_equal(new_state[key], global_state[key])  # the global head never moves
        else:
            np.testing.assert_allclose(new_state[key], averaged, rtol=1e-5, atol=1e-6)


def test_proximal_term_is_nvflares_fedprox_loss():
    model = build_model({"name": "cnn", "in_channels": 3, "num_classes": 4, "channels": [4, 8]})
    loss_fn = with_proximal_term(lambda logits, target: torch.zeros(()), model, mu=0.5)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1)
    expected = 0.25 * sum(float(((p.detach() - before[n]) ** 2).sum()) for n, p in model.named_parameters())
    assert float(loss_fn(torch.zeros(1, 4), torch.zeros(1)).detach()) == pytest.approx(expected, rel=1e-5)


def train_meta_and_site(controller) -> tuple[dict, FairflExecutor]:
    """The meta of `controller`'s round-0 train task on the tiny class-imbalanced skin data, and a site's executor."""
    meta = {
        protocol.MODEL_SPEC: controller.model_spec(),
        protocol.DATASET: "skin_imbalanced",
        protocol.TASK: "classification",
        protocol.NUM_SITES: 6,
        protocol.DATA_SEED: 0,
        protocol.START_FROM: protocol.FROM_GLOBAL,
        **controller.site_meta(),
        **controller.train_meta(0),
    }
    return meta, FairflExecutor(image_size=32, batch_size=16, lr=3e-4, weight_decay=5e-4, synthetic_size_scale=0.3)


def test_executor_trains_with_npr_and_evaluates_with_its_own_head(tmp_path, cache_dir):
    controller = FedNPRController(personal_head=True, mu=0.01, **TINY)
    meta, executor = train_meta_and_site(controller)
    params = initial_state(controller.model_spec(), 0)
    first = SiteTask.of("site-2", FLModel(params_type=ParamsType.FULL, params=params, current_round=0, meta=meta))
    result = executor._train(first, str(tmp_path))
    assert result.metrics["prototype_seconds"] > 0 and math.isfinite(result.metrics["train_loss"])
    assert 1.0 < result.metrics["npr_grad_ratio"] < 1e4  # LayerNorm'd NPR at weight 1 pulls harder than BSM
    # in mixed precision (bfloat16 here): prototypes and features from bfloat16 passes, the loss still float32
    mixed = FairflExecutor(image_size=32, batch_size=16, lr=3e-4, weight_decay=5e-4, synthetic_size_scale=0.3, amp=True)
    mixed = mixed._train(first, str(tmp_path / "amp"))
    assert math.isfinite(mixed.metrics["train_loss"]) and 0.0 < mixed.metrics["npr_grad_ratio"] < 1e4
    assert all(v.dtype == params[k].dtype and np.isfinite(v).all() for k, v in mixed.params.items())
    head = head_state_keys(controller.model_spec())
    assert not set(head) & set(result.params) and set(result.params) == set(params) - set(head)  # the head stays
    own = torch.load(tmp_path / protocol.LOCAL_MODEL_FILE, weights_only=True)["model"]
    own_head = {k: own[k].numpy() for k in head}
    assert any(not np.array_equal(own_head[k], params[k]) for k in head)  # the head trained
    # next round the server sends its global model (head unchanged); the site puts its own head back on it
    sent = SiteTask.of("site-2", FLModel(params_type=ParamsType.FULL, params=params, current_round=1, meta=meta))
    ctx = executor._context(sent, str(tmp_path), trains=True)
    model = executor._model_for(ctx, TaskSteps(meta), sent.start_from)
    state = model.state_dict()
    assert all(np.array_equal(state[k].numpy(), own_head[k]) for k in head)
    body = [k for k in params if k not in head and params[k].dtype.kind == "f"]
    assert all(np.array_equal(state[k].numpy(), params[k]) for k in body)
    # scored with its own head and, asked by the server (FedNPR-Per keeps a part local), with the global model as
    # sent (the head the server holds: never trained)
    assert FedNPRController(personal_head=True, **TINY).scores_global and not FedNPRController(**TINY).scores_global
    validate = {**meta, protocol.EVALUATE: protocol.FROM_GLOBAL, protocol.SCORE_GLOBAL: True}
    scores = executor._validate(
        SiteTask.of("site-2", FLModel(params_type=ParamsType.FULL, params=params, meta=validate)), str(tmp_path)
    ).metrics
    loader = executor._loader(sent, "testing", train=False, seed=executor.seed)
    own_scores = executor._evaluate(model, loader, sent)
    sent_scores = executor._evaluate(load_numpy_state(build_model(controller.model_spec()), params), loader, sent)
    assert scores["clean_auc"] == pytest.approx(own_scores["auc"]) and 0.0 <= scores["balanced_accuracy"] <= 1.0
    assert scores["global_clean_auc"] == pytest.approx(sent_scores["auc"]) != own_scores["auc"]


def test_server_expects_no_head_from_fednpr_per_sites_and_every_key_from_fednpr_sites():
    per, plain = FedNPRController(personal_head=True, **TINY), FedNPRController(**TINY)
    state0 = initial_state(per.model_spec(), 0)
    head = set(head_state_keys(per.model_spec()))
    assert set(per.update_reference(state0)) == set(state0) - head and set(plain.update_reference(state0)) == set(
        state0
    )
    body = {k: v for k, v in state_to_torch(state0).items() if k not in head}
    answer = SimpleAnswer({k: v.numpy() for k, v in body.items()})
    update, _, problem = per._screen_train_answer("site-1", answer, per.update_reference(state0), 0)
    assert problem is None and set(update.state) == set(body)
    _, _, problem = plain._screen_train_answer("site-1", answer, plain.update_reference(state0), 0)
    assert "missing keys" in problem  # only FedNPR-Per may leave the head out
    _, _, problem = per._screen_train_answer("site-1", SimpleAnswer(state0), per.update_reference(state0), 0)
    assert "unexpected keys" in problem  # a FedNPR-Per site that sends its head is refused: it must stay there
    new, _ = per.aggregate_round(0, state0, {"site-1": update}, {})
    assert all(np.array_equal(new[k], state0[k]) for k in head) and set(new) == set(state0)


class SimpleAnswer:
    """A site's `train` answer as the controller sees it (FLModel's fields)."""

    def __init__(self, params, num_samples=10):
        self.params, self.metrics, self.meta = params, {"train_loss": 0.5}, {protocol.NUM_SAMPLES: num_samples}
        self.params_type = ParamsType.FULL


def test_local_model_scoring_scores_the_model_the_site_sent_not_the_aggregate(tmp_path, cache_dir):
    """`score_local_model` (the authors' protocol): a site is scored with the model it trained in the round, exactly
    the one it sent, and the aggregate the server sends to score is scored beside it (global_ metrics); the default
    scores the aggregate."""
    local = FedNPRController(score_local_model=True, **TINY)
    assert FedNPRController(**TINY).evaluate == protocol.FROM_GLOBAL and not FedNPRController(**TINY).scores_global
    assert local.evaluate == protocol.FROM_LOCAL and local.scores_global  # the global model is scored beside it
    assert local._scored_params({"w": 1}) == {"w": 1}  # the aggregate still goes to every site (held-out sites too)
    assert local.config()["score_local_model"] is True and local.method == "fednpr"
    assert group_of({"method": local.method, "config": local.config()}) == "fednpr (local models scored)"
    meta, executor = train_meta_and_site(local)
    w0 = initial_state(local.model_spec(), 0)
    task = SiteTask.of("site-2", FLModel(params_type=ParamsType.FULL, params=w0, current_round=0, meta=meta))
    sent = trained_weights(executor._train(task, str(tmp_path)), w0)
    # the round's aggregate: the site's model averaged with another site's (here: the initial model)
    aggregate = {k: (v + w0[k]) / 2 if v.dtype.kind == "f" else v for k, v in sent.items()}
    validate = {**meta, protocol.EVALUATE: local.evaluate, protocol.SCORE_GLOBAL: local.scores_global}
    scores = executor._validate(
        SiteTask.of("site-2", FLModel(params_type=ParamsType.FULL, params=aggregate, current_round=0, meta=validate)),
        str(tmp_path),
    ).metrics
    loader = executor._loader(task, "testing", train=False, seed=executor.seed)
    spec = local.model_spec()
    sent_scores = executor._evaluate(load_numpy_state(build_model(spec), sent), loader, task)
    aggregate_scores = executor._evaluate(load_numpy_state(build_model(spec), aggregate), loader, task)
    assert sent_scores["auc"] != aggregate_scores["auc"]  # the two models tell apart on this test split
    assert scores["clean_auc"] == pytest.approx(sent_scores["auc"])
    assert scores["clean_balanced_accuracy"] == pytest.approx(sent_scores["balanced_accuracy"])
    assert scores["global_clean_auc"] == pytest.approx(aggregate_scores["auc"])
    # a site held out of training has no model of its own: it scores the aggregate as it is
    held = {**validate, protocol.HELD_OUT: ["site-2"]}
    held_scores = executor._validate(
        SiteTask.of("site-2", FLModel(params_type=ParamsType.FULL, params=aggregate, current_round=0, meta=held)),
        str(tmp_path),
    ).metrics
    assert held_scores["clean_auc"] == pytest.approx(aggregate_scores["auc"]) and "global_clean_auc" not in held_scores
