"""What the server records with hostile sites: results.json (NaN and Inf as null, atomic writes that keep the old
file, `stopped` when the server fails or no evaluation is usable) and NVFlare's TensorBoard receiver, through the
controller's real round loop (`run`) with the sending replaced."""

import json
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fairfl.files import json_safe, save_atomic, write_atomic, write_json_atomic
from fairfl.flare import protocol
from fairfl.models import initial_state
from fairfl.results import ResultsLog

from helpers import check_tracking, tensorboard_scalars
from site_answers import SITES, answer, honest_params, hostile, make


def test_an_error_inside_the_server_leaves_results_json_with_stopped(tmp_path):
    controller = make(tmp_path=tmp_path)

    def broken():
        raise RuntimeError("disk on fire")

    controller._run_rounds = broken
    with pytest.raises(RuntimeError):
        controller.run()
    results = json.loads((tmp_path / "results.json").read_text())
    assert "disk on fire" in results["stopped"] and results["method"] == "fedavg"


def test_results_json_writes_null_for_non_finite_numbers(tmp_path):
    log = ResultsLog(
        str(tmp_path / "results.json"),
        method="fedavg",
        task="segmentation",
        metric="dice",
        seed=0,
        sites=["site-1"],
        config={},
    )
    log.add_round(0, 1.0, None, weights={"site-1": float("nan")}, gamma=np.float64("inf"))
    text = (tmp_path / "results.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    record = json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c}"))["rounds"][0]
    assert record["weights"] == {"site-1": None} and record["gamma"] is None
    assert json_safe({"a": [np.float32(1.5), (float("-inf"),)]}) == {"a": [1.5, [None]]}


def test_atomic_writes_keep_the_old_file_and_no_temporary_on_error(tmp_path):
    path = tmp_path / "global_model.pt"
    save_atomic({"w": torch.ones(2)}, str(path))

    def half_then_fail(f):
        f.write(b"partial")
        raise OSError("disk full")

    with pytest.raises(OSError):
        write_atomic(str(path), half_then_fail)
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.ones(2))
    assert os.listdir(tmp_path) == ["global_model.pt"]
    state = tmp_path / "method_state.json"
    write_json_atomic(str(state), {"round": 1})
    with pytest.raises(TypeError):  # not JSON: the old file stays
        write_json_atomic(str(state), {"round": {2}})
    assert json.loads(state.read_text()) == {"round": 1}
    assert sorted(os.listdir(tmp_path)) == ["global_model.pt", "method_state.json"]


class ServerEngine:
    """What the round loop uses of NVFlare's server engine: new contexts, and events delivered to the job's
    components as its run manager delivers them (here NVFlare's own TensorBoard receiver, writing into `run_dir`)."""

    def __init__(self, run_dir, components):
        from nvflare.apis.fl_context import FLContextManager
        from nvflare.apis.workspace import Workspace

        for folder in ("startup", "local"):  # what NVFlare checks a workspace by
            (run_dir.parent / folder).mkdir(exist_ok=True)
        from nvflare.apis.fl_constant import ProcessType, ReservedKey

        self.components, self.workspace = components, Workspace(str(run_dir.parent), "server")
        server_job = {ReservedKey.PROCESS_TYPE: ProcessType.SERVER_JOB}  # NVFlare's MLflow receiver asks
        self.contexts = FLContextManager(self, "server", run_dir.name, private_stickers=server_job)

    def get_clients(self):
        return [SimpleNamespace(name=site) for site in SITES]

    def new_context(self):
        return self.contexts.new_context()

    def get_workspace(self):
        return self.workspace

    def fire_event(self, event_type, fl_ctx):
        from nvflare.private.event import fire_event

        fire_event(event_type, self.components, fl_ctx)


def run_rounds(tmp_path, train, validate, receivers=(), **kwargs):
    """The controller's real round loop (`run`) with the sending replaced: `train(round)` and `validate(round)`
    give the answers of each task. NVFlare's TensorBoard receiver, and any other `receivers`, record what the loop
    tracks."""
    from nvflare.apis.event_type import EventType
    from nvflare.apis.signal import Signal
    from nvflare.app_opt.tracking.tb.tb_receiver import TBAnalyticsReceiver

    tmp_path.mkdir(parents=True, exist_ok=True)
    controller = make(tmp_path=tmp_path, **{"num_rounds": 2, "eval_every": 1, **kwargs})
    controller.sample_clients = lambda: list(SITES)
    controller.abort_signal, controller.fl_ctx = Signal(), None
    controller.engine = ServerEngine(tmp_path, [TBAnalyticsReceiver(tb_folder="tb_events"), *receivers])
    answers = {protocol.TASK_TRAIN: train, protocol.TASK_VALIDATE: validate}
    controller._ask_models = lambda round_num, task_name, *args: answers[task_name](round_num)
    with controller.engine.new_context() as fl_ctx:
        controller.engine.fire_event(EventType.START_RUN, fl_ctx)
    controller.run()
    with controller.engine.new_context() as fl_ctx:
        controller.engine.fire_event(EventType.END_RUN, fl_ctx)
    return json.loads((tmp_path / "results.json").read_text(), parse_constant=lambda c: pytest.fail(f"bare {c}"))


def test_the_round_loop_goes_on_past_a_hostile_site_and_stops_with_a_reason_when_no_evaluation_is_usable(tmp_path):
    state0 = initial_state(make().model_spec(), 0)

    def train(round_num):
        answers = hostile(state0, 2, metrics={"train_loss": float("nan")}, num_samples=10**18)
        return [answers[0], answers[1], answers[2], answer("site-4", honest_params(state0, 3), num_samples=23)]

    def validate(round_num):
        return [answer(s, {}, metrics={"dice": 0.5 if s != "site-3" else "0.9"}) for s in SITES]

    results = run_rounds(tmp_path / "a", train, validate)
    assert [r["round"] for r in results["rounds"]] == [0, 1] and "stopped" not in results
    for record in results["rounds"]:
        assert "train_loss" in record["rejected"]["site-3"] and "evaluation" in record["rejected"]["site-3"]
        assert set(record["weights"]) == {"site-1", "site-2", "site-4"} and record["train"]["site-3"] == {}
    assert set(results["final"]["per_site"]) == {"site-1", "site-2", "site-4"}
    # NVFlare's TensorBoard receiver shows the accepted numbers per site and round; nothing of site-3 (its NaN loss,
    # its string Dice), whose folder is never made
    check_tracking(str(tmp_path / "a"), results, SITES)
    assert tensorboard_scalars(str(tmp_path / "a"), "site-1")["dice"] == {1: 0.5, 2: 0.5}  # rounds from 1
    # no site's evaluation usable at the end: the run says so instead of ending without a word
    results = run_rounds(
        tmp_path / "b", train, lambda r: [answer(s, {}, metrics={"dice": float("nan")}) for s in SITES], num_rounds=1
    )
    assert results["final"] is None and "no site's evaluation could be used" in results["stopped"]
