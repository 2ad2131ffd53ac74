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

import os

from fairfl.errors import DataError
from fairfl.files import save_round_keeping_previous
from fairfl.site_checks import check_site_state
from fairfl.training import load_tensors


def kept_versions(site: str, state_dir: str, files: tuple[str, str], what: str, remedy: str) -> list:
    """[(round, saved dict, file name)] of the versions in `files` (current, previous) in `state_dir`, newest first.
    `what` names the state and `remedy` what to do about a bad file, in the error."""
    versions = []
    for name in files:
        path = os.path.join(state_dir, name)
        if not os.path.exists(path):
            continue
        try:
            saved = load_tensors(path)
        except ValueError as e:
            raise DataError(site, path, f"unreadable {what} ({e}); {remedy}") from e
        if not isinstance(saved, dict) or type(saved.get("round")) is not int:
            raise DataError(site, path, f"not a {what} ({{'round': int, ...}}); {remedy}")
        versions.append((saved["round"], saved, name))
    return sorted(versions, key=lambda version: -version[0])


def newest_before(versions: list, round_num: int):
    """The saved dict of the newest version from a round before `round_num`, or None."""
    return next((saved for saved_round, saved, _ in versions if saved_round < round_num), None)


def keep_version(saved: dict, state_dir: str, files: tuple[str, str], versions: list) -> None:
    """Save `saved` (its "round" included) as the current file; the current one becomes the previous when it is of
    an earlier round (a repeat of the same round replaces it). `versions`: what `kept_versions` found."""
    current, previous = files
    current_round = next((saved_round for saved_round, _, name in versions if name == current), None)
    save_round_keeping_previous(
        saved,
        os.path.join(state_dir, current),
        os.path.join(state_dir, previous),
        current_round,
        saved["round"],
    )


def kept_model_versions(site: str, state_dir: str, files: tuple[str, str], what: str, remedy: str, reference) -> list:
    """`kept_versions` of a model {"round", "model": state dict}, each checked to fit `reference` (the job's network's
    state dict): one of another network or holding NaN/Inf is an error naming the site and the file."""
    versions = kept_versions(site, state_dir, files, what, remedy)
    for _, saved, name in versions:
        model = saved.get("model")
        problem = check_site_state(model, reference) if isinstance(model, dict) else "no 'model' state dict"
        if problem:
            path = os.path.join(state_dir, name)
            raise DataError(site, path, f"the {what} does not fit this job's network: {problem}; {remedy}")
    return versions
