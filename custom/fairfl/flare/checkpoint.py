"""A named run's checkpoint and the method state written beside results.json: what lets a stopped run resume where
it stopped, and refuses to resume one made with other settings."""

from __future__ import annotations

import os
from typing import Any, Protocol

from fairfl.files import json_safe, save_atomic, write_json_atomic
from fairfl.flare import protocol
from fairfl.flare.round_settings import RoundSettings
from fairfl.jobconfig import WAITING_ARGUMENTS, component_arguments
from fairfl.models import state_to_numpy, state_to_torch
from fairfl.results import ResultsLog
from fairfl.training import load_tensors

METHOD_STATE_FILE = "method_state.json"
CHECKPOINT_FILE = "checkpoint.pt"
# how long the run is and how it waits for sites may change on resume: a site that stays down may need a lower
# min_clients to go on
RESUME_MAY_CHANGE = ("num_rounds", "eval_every", "min_clients", *WAITING_ARGUMENTS)


class _Engine(Protocol):
    """What Checkpointing uses of the round engine it is mixed into (FairRoundController), for the type checker."""

    engine: Any  # NVFlare's server engine (the workspace)
    settings: RoundSettings
    results: ResultsLog
    declared_samples: dict[str, int]

    @property
    def method(self) -> str: ...

    def info(self, msg: str) -> None: ...

    def config(self) -> dict: ...

    def method_state(self) -> dict | None: ...

    def method_tensors(self) -> dict | None: ...

    def load_method_state(self, state: dict) -> None: ...

    def load_method_tensors(self, tensors: dict) -> None: ...


class Checkpointing:
    """The round engine's checkpoint and method-state files (a mixin of FairRoundController: it reads the
    controller's config, results, method state and declared sample counts)."""

    def _save_method_state(self: _Engine, run_dir, round_num):
        state = self.method_state()
        if state is None:
            return
        write_json_atomic(
            os.path.join(run_dir, METHOD_STATE_FILE), {"method": self.method, "round": round_num, "state": state}
        )

    def _checkpoint_path(self: _Engine) -> str:
        root = self.engine.get_workspace().get_root_dir()
        return os.path.join(protocol.run_state_dir(root, "server", self.settings.run_name), CHECKPOINT_FILE)

    def _save_checkpoint(self: _Engine, path, round_num, global_state) -> None:
        """Everything the next round needs, in one file replaced atomically: a crash keeps the previous one."""
        # tensors and plain JSON values only, so that it loads with weights_only=True (no pickled objects)
        checkpoint = {
            "round": round_num,
            **json_safe(
                {
                    "config": self.config(),
                    "method_state": self.method_state(),
                    "results": self.results.data,
                    "declared_samples": self.declared_samples,
                }
            ),
            "global_state": state_to_torch(global_state),
            "method_tensors": self.method_tensors(),
        }
        save_atomic(checkpoint, path)

    def _load_checkpoint(self: _Engine, path) -> dict | None:
        """The named run's checkpoint, loaded into the controller (method state, results so far); None if the
        run is new. A checkpoint of other settings is refused: resuming must not mix runs. How long the run is
        and how it waits for sites (RESUME_MAY_CHANGE) may change: a site that stays down may need a lower
        min_clients to go on."""
        if not os.path.exists(path):
            self.info(f"run {self.settings.run_name!r}: no checkpoint at {path}; starting at round 0")
            return None
        try:  # tensors, numbers, strings, lists and dicts only: a pickled object is never run
            checkpoint = load_tensors(path)
        except ValueError as e:
            raise ValueError(
                f"run {self.settings.run_name!r}: the checkpoint cannot be loaded safely: {e}; delete it or "
                f"choose another run_name"
            ) from e
        saved, current = checkpoint["config"], json_safe(self.config())
        # an argument added since the checkpoint was written ran at its default then
        defaults = json_safe(component_arguments(type(self)))
        missing = object()
        differing = sorted(
            k
            for k in set(saved) | set(current)
            if k not in RESUME_MAY_CHANGE and saved.get(k, defaults.get(k, missing)) != current.get(k, missing)
        )
        if differing or checkpoint["results"]["method"] != self.method:
            raise ValueError(
                f"run {self.settings.run_name!r}: the checkpoint {path} was made with other settings "
                f"({', '.join(differing) or 'method'}); choose another run_name or delete it"
            )
        if checkpoint["method_state"] is not None:
            self.load_method_state(checkpoint["method_state"])
        if checkpoint.get("method_tensors") is not None:
            self.load_method_tensors(checkpoint["method_tensors"])
        self.declared_samples = dict(checkpoint.get("declared_samples") or {})
        self.results.data.update(
            rounds=checkpoint["results"]["rounds"],
            final=checkpoint["results"]["final"],
            resumed=checkpoint["round"] + 1,
            # a finished run submitted again keeps its cross-site evaluation (cross_site_eval)
            **{k: v for k, v in checkpoint["results"].items() if k == "cross_site"},
        )
        self.results.write()
        self.info(f"run {self.settings.run_name!r}: resuming after round {checkpoint['round']} from {path}")
        return {"round": checkpoint["round"], "global_state": state_to_numpy(checkpoint["global_state"])}
