"""fairfl.flare.site_state: what a site keeps per round, so that a round repeated after a restart starts from what its
first try started from (the resumed run then matches one that never stopped)."""

import pytest
import torch
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

from fairfl.errors import DataError
from fairfl.flare import protocol
from fairfl.flare.executor import FairflExecutor
from fairfl.flare.site_state import keep_version, kept_model_versions, kept_versions, newest_before
from fairfl.flare.site_task import SiteTask
from fairfl.models import build_model

FILES = ("state.pt", "state_previous.pt")
SPEC = {"name": "unet", "in_channels": 1, "num_classes": 2, "channels": [4, 8], "strides": [2]}


def versions(folder):
    return kept_versions("site-1", str(folder), FILES, "test state", "delete it")


def test_a_repeated_round_replaces_its_own_version_and_keeps_the_round_before(tmp_path):
    for round_num in (0, 1, 2):
        keep_version({"round": round_num, "value": round_num}, str(tmp_path), FILES, versions(tmp_path))
    assert [(r, name) for r, _, name in versions(tmp_path)] == [(2, "state.pt"), (1, "state_previous.pt")]
    # the server died after this site had trained round 2; round 2 runs again and must start from round 1
    assert newest_before(versions(tmp_path), 2)["value"] == 1
    keep_version({"round": 2, "value": 22}, str(tmp_path), FILES, versions(tmp_path))
    assert [(r, s["value"]) for r, s, _ in versions(tmp_path)] == [(2, 22), (1, 1)]
    assert newest_before(versions(tmp_path), 2)["value"] == 1 and newest_before(versions(tmp_path), 3)["value"] == 22
    assert newest_before(versions(tmp_path), 1) is None  # nothing from before round 1 is kept any more


@pytest.mark.parametrize(
    "content, message",
    [
        (b"not a torch file", "unreadable test state"),
        ({"value": 1}, "not a test state"),
        ({"round": True}, "not a test state"),  # a bool is not a round
        ([1, 2], "not a test state"),
    ],
)
def test_a_broken_kept_file_is_an_error_naming_the_site_and_the_file(tmp_path, content, message):
    path = tmp_path / FILES[1]
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        torch.save(content, path)
    with pytest.raises(DataError, match=message) as info:
        versions(tmp_path)
    assert info.value.site == "site-1" and info.value.path == str(path) and "delete it" in str(info.value)


def test_a_kept_model_of_another_network_or_with_nan_is_refused(tmp_path):
    reference = build_model(SPEC).state_dict()
    other = build_model({**SPEC, "channels": [8, 16]}).state_dict()
    poisoned = {k: (v.float() * float("nan") if v.is_floating_point() else v) for k, v in reference.items()}
    for state, message in ((other, "does not fit this job's network"), (poisoned, "NaN"), (None, "no 'model'")):
        torch.save({"round": 0, "model": state}, tmp_path / FILES[0])
        with pytest.raises(DataError, match=message):
            kept_model_versions("site-1", str(tmp_path), FILES, "local model", "delete it", reference)


def test_a_train_task_of_round_r_works_from_the_local_model_before_r_and_later_tasks_from_round_rs(tmp_path):
    """Solo's start, FedCE's leave-one-out and the parts FedBN/FedNPR-Per keep read the model trained before this
    round; evaluation and Fed-LWR's CKA the one this round trained."""
    executor = FairflExecutor()
    meta = {protocol.MODEL_SPEC: SPEC}
    states = {}
    for round_num in (0, 1):
        model = build_model(SPEC)
        torch.manual_seed(round_num)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_()
        states[round_num] = model.state_dict()
        trained = SiteTask.of("site-1", FLModel(current_round=round_num, meta=meta))
        executor._keep_local_model(trained, str(tmp_path), model)

    def own(round_num, trains):
        task = FLModel(params_type=ParamsType.FULL, params={}, current_round=round_num, meta=meta)
        return executor._context(SiteTask.of("site-1", task), str(tmp_path), trains=trains).own_model()

    def same(a, b):
        return all(torch.equal(a[k], b[k]) for k in b)

    assert same(own(1, trains=True), states[0])  # round 1 repeated after a restart: from round 0's model
    assert same(own(1, trains=False), states[1]) and same(own(2, trains=True), states[1])
    assert own(0, trains=True) is None  # the first round: nothing of its own yet


def test_a_process_killed_while_saving_a_new_round_leaves_the_round_before(tmp_path, monkeypatch):
    """The new version is written whole first, then the current file becomes the previous and the new one the
    current: dying between the two renames leaves the round before, which is what a repeated round reads."""
    import fairfl.files as files

    for round_num in (0, 1):
        keep_version({"round": round_num, "value": round_num}, str(tmp_path), FILES, versions(tmp_path))
    assert not list(tmp_path.glob("*.next*"))  # nothing staged is left behind
    real_replace, current = files.os.replace, str(tmp_path / FILES[0])

    def dies_putting_the_new_version_in_place(src, dst):
        if str(dst) == current:
            raise KeyboardInterrupt("killed")
        real_replace(src, dst)

    monkeypatch.setattr(files.os, "replace", dies_putting_the_new_version_in_place)
    with pytest.raises(KeyboardInterrupt):
        keep_version({"round": 2, "value": 2}, str(tmp_path), FILES, versions(tmp_path))
    monkeypatch.undo()
    assert newest_before(versions(tmp_path), 2)["value"] == 1  # the repeated round 2 starts where its first try did


def test_a_version_this_process_wrote_or_read_is_not_read_from_disk_again(tmp_path, monkeypatch):
    """Every task reads both kept versions: from memory while the files are the ones this process wrote or read,
    each a copy of its own (a caller changing it changes nothing the next task reads)."""
    import fairfl.flare.site_state as site_state

    for round_num in (0, 1, 2):
        keep_version({"round": round_num, "value": [round_num]}, str(tmp_path), FILES, versions(tmp_path))

    def no_reading(path):
        raise AssertionError(f"{path} read from disk again")

    monkeypatch.setattr(site_state, "load_tensors", no_reading)
    first = versions(tmp_path)
    assert [(r, s["value"], name) for r, s, name in first] == [(2, [2], FILES[0]), (1, [1], FILES[1])]
    first[0][1]["value"].append("changed by a caller")
    assert versions(tmp_path)[0][1]["value"] == [2]


@pytest.mark.parametrize("replacement", ["another version", "garbage", "poisoned model", "removed"])
def test_a_kept_file_changed_on_disk_is_read_and_checked_again(tmp_path, replacement):
    """A file replaced by hand (or by another process) after this process read it is read again, and a bad one is
    refused as on a first read, never served from memory."""
    reference = build_model(SPEC).state_dict()

    def models():
        return kept_model_versions("site-1", str(tmp_path), FILES, "local model", "delete it", reference)

    for round_num in (0, 1):
        keep_version({"round": round_num, "model": reference}, str(tmp_path), FILES, models())
    assert [r for r, _, _ in models()] == [1, 0]
    current = tmp_path / FILES[0]
    if replacement == "another version":
        torch.save({"round": 5, "model": reference}, current)
        assert [r for r, _, _ in models()] == [5, 0]
    elif replacement == "garbage":
        current.write_bytes(b"x" * current.stat().st_size)  # the same size, in place
        with pytest.raises(DataError, match="unreadable local model"):
            models()
    elif replacement == "poisoned model":
        poisoned = {k: (v * float("nan") if v.is_floating_point() else v) for k, v in reference.items()}
        torch.save({"round": 1, "model": poisoned}, current)
        with pytest.raises(DataError, match="NaN"):
            models()
    else:
        current.unlink()
        assert [r for r, _, _ in models()] == [0]


def test_what_is_remembered_is_a_cpu_copy_of_its_own_as_a_read_from_disk_gives():
    """A GPU site saves state dicts taken on its device; what the process remembers is copied to the CPU (as torch.load
    map_location gives a read of the file), nested lists and tuples too, sharing no storage with the caller's."""
    import fairfl.flare.site_state as site_state

    weights = torch.ones(3)
    copied = site_state._cpu_copy({"round": 1, "model": {"w": weights}, "moments": [(weights, 2)], "names": ["a"]})
    assert copied["moments"][0][1] == 2 and isinstance(copied["moments"][0], tuple) and copied["names"] == ["a"]
    for tensor in (copied["model"]["w"], copied["moments"][0][0]):
        assert tensor.device.type == "cpu" and torch.equal(tensor, weights)
        assert tensor.untyped_storage().data_ptr() != weights.untyped_storage().data_ptr()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_version_kept_on_the_gpu_comes_back_on_the_cpu(tmp_path):
    reference = build_model(SPEC).state_dict()
    keep_version({"round": 0, "model": {k: v.cuda() for k, v in reference.items()}}, str(tmp_path), FILES, [])
    (saved,) = [s for _, s, _ in versions(tmp_path)]
    assert {t.device.type for t in saved["model"].values()} == {"cpu"}


def test_a_file_system_of_whole_seconds_is_never_remembered():
    """Where timestamps are whole seconds (ext3, some network file systems) a file rewritten in place within the same
    second keeps its size and times: such files are always read again."""
    import os

    import fairfl.flare.site_state as site_state

    def stat(mtime_ns, ctime_ns):  # mode, inode, device, links, uid, gid, size, then the times: int, float, ns
        return os.stat_result((0o100644, 7, 1, 1, 0, 0, 100, 1, 1, 1, 1.0, 1.0, 1.0, 0, mtime_ns, ctime_ns))

    fine, coarse = stat(1_700_000_000_123, 1_700_000_000_456), stat(2_000_000_000, 3_000_000_000)
    assert site_state._identity_of(fine) is not None and site_state._identity_of(coarse) is None


def test_a_file_replaced_while_it_is_read_is_remembered_as_what_was_read(tmp_path, monkeypatch):
    """The identity remembered is that of the file actually read (its open descriptor), not of one put in its place
    meanwhile: the replacement is read when next asked for."""
    import os

    import fairfl.flare.site_state as site_state

    keep_version({"round": 1, "value": "old"}, str(tmp_path), FILES, versions(tmp_path))
    monkeypatch.setattr(site_state, "_KEPT", site_state.OrderedDict())  # a fresh process
    real_load = site_state.load_tensors

    def load_then_replaced(path, file=None):
        loaded = real_load(path, file)
        torch.save({"round": 2, "value": "new"}, str(path) + ".tmp")
        os.replace(str(path) + ".tmp", path)
        return loaded

    monkeypatch.setattr(site_state, "load_tensors", load_then_replaced)
    assert [(r, s["value"]) for r, s, _ in versions(tmp_path)] == [(1, "old")]
    monkeypatch.setattr(site_state, "load_tensors", real_load)
    assert [(r, s["value"]) for r, s, _ in versions(tmp_path)] == [(2, "new")]
