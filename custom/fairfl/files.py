"""Atomic file writes: every model, checkpoint and results file is written whole or not at all.

A write goes to a temporary file beside the target, is flushed to disk (fsync) and then renamed over the target
(os.replace, atomic on POSIX), so a process killed mid-write, a full disk or an exception leaves the previous
file intact and no temporary behind."""

from __future__ import annotations

import json
import math
import os


def write_atomic(path: str, write, mode: str = "wb") -> None:
    """Call `write(file)` on a temporary file beside `path`, fsync it and replace `path` with it; on any error the
    temporary is removed and `path` is left as it was."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    try:  # make the rename itself durable
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_atomic(obj, path: str) -> None:
    """torch.save, atomically (`write_atomic`)."""
    import torch  # here, not at the top: what only writes JSON (the recipe's command line) need not load torch

    write_atomic(path, lambda f: torch.save(obj, f))


def save_round_keeping_previous(obj, path: str, previous_path: str, saved_round: int | None, round_num: int) -> None:
    """Save round `round_num`'s `obj` at `path` (`save_atomic`); when `path` holds an earlier round's version
    (`saved_round` < `round_num`), it becomes `previous_path` first. A site keeps its state this way (Ditto's
    personal model, a kept optimiser state) so that a round repeated after a restart can start from the same
    state as its first try."""
    if saved_round is not None and saved_round < round_num:
        # the new version whole on disk first, then two renames: a process killed in between leaves at least the
        # previous round's version, never neither (a repeated round only needs that one)
        staged = f"{path}.next"
        save_atomic(obj, staged)
        os.replace(path, previous_path)
        os.replace(staged, path)
    else:
        save_atomic(obj, path)


def json_safe(value):
    """`value` as plain JSON-able values: every NaN/Inf float replaced by None, so the JSON written is valid (bare NaN
    is not JSON); numpy and torch scalars become Python numbers, their arrays lists, tuples lists."""
    if hasattr(value, "tolist") and getattr(value, "ndim", 0) > 0:  # numpy or torch array
        value = value.tolist()
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # numpy or torch scalar
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json_atomic(path: str, data, indent: int = 1) -> None:
    """`data` as JSON (NaN/Inf written as null), atomically."""
    text = json.dumps(json_safe(data), indent=indent, allow_nan=False)
    write_atomic(path, lambda f: f.write(text), mode="w")


def parse_json(text: str):
    """`json.loads(text)`, every way it can fail a ValueError: a file another party writes may nest `[[[...` deeper
    than Python's parser recurses (a RecursionError, not a ValueError)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None


def read_json(path):
    """The JSON content of the file `path`; any way it cannot be read or parsed is a ValueError saying why (the caller
    names the file and the party)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read it ({type(e).__name__}: {e})") from None
    try:
        return parse_json(text)
    except ValueError as e:
        raise ValueError(f"not valid JSON ({e})") from None
