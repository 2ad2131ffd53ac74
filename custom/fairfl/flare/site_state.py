"""What a site keeps between rounds of a named run, one version per round: its local model (a method's that trains
from or scores with it, or keeps parts of it at the site), a personal model a method keeps beside the global one, a
kept optimiser state.

Each lives in a current file and, once a later round is saved, the previous round's file. A round repeated after a
restart (the server died after this site had already answered, or trained, the next round, but before its
checkpoint) must start from what its first try started from, so the resumed run matches one that never stopped:
a task of round r takes the newest version saved before round r (`newest_before`). A version is a dict
{"round": int, ...} written by `save_atomic`; a file that cannot be read or is not one is an error naming the site
and the file, never silently replaced."""

from __future__ import annotations

import copy
import os
import threading
from collections import OrderedDict

import torch

from fairfl.errors import DataError
from fairfl.files import save_round_keeping_previous
from fairfl.site_checks import check_site_state
from fairfl.training import load_tensors

# What this process last read or wrote of each kept file, under the file's identity at the time (device, inode, size,
# modification and change times): a task reads a version from disk, and checks it, only when its file is not the one
# this process wrote or read, as after a restart or a change by hand. Without it every task loaded and checked both
# kept versions, which cost a small site a tenth of its round. Kept on the CPU, as a read from disk gives it.
_KEPT: OrderedDict = OrderedDict()  # path -> (identity, saved dict, {references it fits})
KEPT_FILES = 16  # files remembered: a few sites' state (the simulator with -t below -n); more are read again
KEPT_BYTES = 256 << 20  # and at most this many bytes of tensors; a larger version is always read from disk
_KEPT_LOCK = threading.Lock()


def _identity_of(st: os.stat_result) -> tuple | None:
    """A file's identity, or None where the file system keeps whole seconds (ext3, some network file systems): a file
    rewritten in place within the same second would look the same, so such a file is never remembered."""
    if st.st_mtime_ns % 1_000_000_000 == 0 and st.st_ctime_ns % 1_000_000_000 == 0:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _identity(path: str) -> tuple | None:
    try:
        return _identity_of(os.stat(path))
    except FileNotFoundError:
        return None


def _cpu_copy(value):
    """`value` with every tensor copied to the CPU (as torch.load with map_location="cpu" gives it), the rest
    deep-copied: a state taken on a GPU comes back as a read from disk would."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _cpu_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cpu_copy(v) for v in value)
    return copy.deepcopy(value)


def _tensor_bytes(value) -> int:
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return int(getattr(value, "nbytes", 0) or 0)


def _remember(path: str, identity: tuple | None, saved: dict, fits: set) -> None:
    """Keep a CPU copy of `saved` as what `path` holds while it has `identity`."""
    with _KEPT_LOCK:
        _KEPT.pop(path, None)
        if identity is None or _tensor_bytes(saved) > KEPT_BYTES:
            return
        _KEPT[path] = (identity, _cpu_copy(saved), fits)
        while len(_KEPT) > KEPT_FILES or sum(_tensor_bytes(entry[1]) for entry in _KEPT.values()) > KEPT_BYTES:
            _KEPT.popitem(last=False)


def _recalled(path: str) -> tuple[dict, set] | None:
    """(a copy of what `path` holds, the references it was found to fit), when this process knows the file as it is."""
    identity = _identity(path)
    with _KEPT_LOCK:
        entry = _KEPT.get(path)
        if entry is None or entry[0] != identity:
            return None
        _KEPT.move_to_end(path)
        return _cpu_copy(entry[1]), entry[2]


def _read(site: str, path: str, what: str, remedy: str) -> tuple[dict, set]:
    """(the version in `path`, the references it fits), from this process's memory or from disk."""
    recalled = _recalled(path)
    if recalled is not None:
        return recalled
    try:
        with open(path, "rb") as f:  # the identity of the file read, not of one put in its place meanwhile
            identity = _identity_of(os.fstat(f.fileno()))
            saved = load_tensors(path, f)
    except (OSError, ValueError) as e:
        raise DataError(site, path, f"unreadable {what} ({e}); {remedy}") from e
    if not isinstance(saved, dict) or type(saved.get("round")) is not int:
        raise DataError(site, path, f"not a {what} ({{'round': int, ...}}); {remedy}")
    fits: set = set()
    _remember(path, identity, saved, fits)
    return saved, fits


def kept_versions(site: str, state_dir: str, files: tuple[str, str], what: str, remedy: str) -> list:
    """[(round, saved dict, file name)] of the versions in `files` (current, previous) in `state_dir`, newest first.
    `what` names the state and `remedy` what to do about a bad file, in the error. Each saved dict is the caller's
    own (changing it changes neither the file nor what a later call returns)."""
    return [(saved["round"], saved, name) for saved, _, name in _kept(site, state_dir, files, what, remedy)]


def _kept(site: str, state_dir: str, files: tuple[str, str], what: str, remedy: str) -> list:
    """[(saved dict, the references it fits, file name)], newest first."""
    versions = []
    for name in files:
        path = os.path.join(state_dir, name)
        if os.path.exists(path):
            versions.append((*_read(site, path, what, remedy), name))
    return sorted(versions, key=lambda version: -version[0]["round"])


def newest_before(versions: list, round_num: int):
    """The saved dict of the newest version from a round before `round_num`, or None."""
    return next((saved for saved_round, saved, _ in versions if saved_round < round_num), None)


def keep_version(saved: dict, state_dir: str, files: tuple[str, str], versions: list) -> None:
    """Save `saved` (its "round" included) as the current file; the current one becomes the previous when it is of
    an earlier round (a repeat of the same round replaces it). `versions`: what `kept_versions` found."""
    current, previous = files
    current_round = next((saved_round for saved_round, _, name in versions if name == current), None)
    current_path, previous_path = os.path.join(state_dir, current), os.path.join(state_dir, previous)
    moves = current_round is not None and current_round < saved["round"]  # the current file becomes the previous
    with _KEPT_LOCK:
        moved = _KEPT.pop(current_path, None) if moves else None
    save_round_keeping_previous(saved, current_path, previous_path, current_round, saved["round"])
    previous_identity = _identity(previous_path) if moved is not None else None
    if moved is not None and previous_identity is not None and moved[0][1] == previous_identity[1]:  # same inode
        _remember(previous_path, previous_identity, moved[1], moved[2])
    _remember(current_path, _identity(current_path), saved, set())


def kept_model_versions(site: str, state_dir: str, files: tuple[str, str], what: str, remedy: str, reference) -> list:
    """`kept_versions` of a model {"round", "model": state dict}, each checked to fit `reference` (the job's network's
    state dict): one of another network or holding NaN/Inf is an error naming the site and the file."""
    fitted = tuple((key, tuple(value.shape), str(value.dtype)) for key, value in reference.items())
    versions = []
    for saved, fits, name in _kept(site, state_dir, files, what, remedy):
        if fitted not in fits:  # checked once per file as this process knows it
            model = saved.get("model")
            problem = check_site_state(model, reference) if isinstance(model, dict) else "no 'model' state dict"
            if problem:
                path = os.path.join(state_dir, name)
                raise DataError(site, path, f"the {what} does not fit this job's network: {problem}; {remedy}")
            fits.add(fitted)
        versions.append((saved["round"], saved, name))
    return versions
