"""What a run shows while it goes: one line per finished round and the run's outcome, from the results file the
server rewrites after every round (docs/results.md).

Plain functions of the parsed file. It is read while another process writes it, and what it holds came from the
sites, so any field may be missing, of another type, NaN or hostile text: nothing here raises on such a file."""

from __future__ import annotations

import json
import math

QUIET, PROGRESS, VERBOSE = 0, 1, 2  # how much a run prints: outcome only; a line per round; and the simulator's log
MISSING_SITES = ("absent", "failed", "rejected")  # the round record's lists/dicts of sites that gave nothing usable


def shown_round(round_index: int) -> int:
    """The round as fairfl shows it to people (console, report, TensorBoard and MLflow steps): counted from 1, so
    the last of N rounds is round N. results.json's `round` counts from 0, as NVFlare's `current_round` and its own
    log ("Round 0 started.") do (docs/results.md)."""
    return round_index + 1


def read_results(path: str) -> dict:
    """The results file as a dict; {} when it is missing, unreadable, not JSON or not an object."""
    try:
        with open(path, encoding="utf-8") as f:
            results = json.load(f)
    except (OSError, ValueError, RecursionError):  # ValueError: bad JSON or UTF-8; RecursionError: absurd nesting
        return {}
    return results if isinstance(results, dict) else {}


def finished_rounds(results: dict) -> list:
    """The round records that name their round (objects with an integer `round`), in the file's order."""
    rounds = results.get("rounds") if isinstance(results, dict) else None
    if not isinstance(rounds, list):
        return []
    return [r for r in rounds if isinstance(r, dict) and type(r.get("round")) is int]


def _number(value) -> float | None:
    """A finite number as float; None for anything else (missing, text, a bool, NaN, Inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _text(value, limit: int = 60) -> str:
    """One printable line of at most `limit` characters (names and reasons come from the sites)."""
    text = "".join(c if c.isprintable() else "?" for c in str(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def clock(seconds: float) -> str:
    """0:42, 12:05, 1:02:03."""
    minutes, secs = divmod(int(round(max(seconds, 0.0))), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def evaluation(record: dict, metric: str) -> str | None:
    """'dice mean 81.2%, worst site-6 71.0%' of a record with `mean` (and `worst`); None without a usable mean."""
    mean, worst = _number(record.get("mean")), _number(record.get("worst"))
    if mean is None:
        return None
    text = f"{metric} mean {100 * mean:.1f}%"
    if worst is not None:
        text += f", worst {_text(record.get('worst_site', '?'), 40)} {100 * worst:.1f}%"
    return text


def missing_sites(record: dict) -> str:
    """'absent site-2; failed site-3 (BAD_TASK_DATA)': the round's sites that gave nothing usable, and why."""
    parts = []
    for key in MISSING_SITES:
        value = record.get(key)
        if isinstance(value, dict):
            names = [f"{_text(site, 40)} ({_text(why)})" for site, why in value.items()]
        elif isinstance(value, list):
            names = [_text(site, 40) for site in value]
        else:
            names = [_text(value)] if value else []
        if names:
            parts.append(f"{key} {', '.join(names)}")
    return "; ".join(parts)


def progress_line(record: dict, results: dict, elapsed: float) -> str:
    """The line of finished round `record` of the run whose results file holds `results`, `elapsed` seconds after
    the run started: 'round k/N', elapsed, the time left (the mean round time so far, the first round left out once
    there are others, times the rounds left), the last evaluation so far, and the sites that were absent, failed or
    rejected in this round."""
    results = results if isinstance(results, dict) else {}
    config = results.get("config") if isinstance(results.get("config"), dict) else {}
    num_rounds = config.get("num_rounds") if type(config.get("num_rounds")) is int else 0
    num_rounds = num_rounds if num_rounds > 0 else None
    metric = _text(results.get("metric") or "score", 20)
    record = record if isinstance(record, dict) else {}
    number = record.get("round") if type(record.get("round")) is int else None
    done = "?" if number is None else shown_round(number)
    so_far = [r for r in finished_rounds(results) if number is not None and r["round"] <= number] or [record]
    parts = [f"round {done}/{num_rounds}" if num_rounds else f"round {done}", f"elapsed {clock(elapsed)}"]
    if num_rounds and number is not None:
        seconds = [s for s in (_number(r.get("seconds")) for r in so_far) if s is not None and s >= 0]
        timed = seconds[1:] or seconds  # the first round also waited for the sites to start: left out when it can be
        per_round = sum(timed) / len(timed) if timed else elapsed / len(so_far)
        parts.append(f"left ~{clock(per_round * max(num_rounds - done, 0))}")
    for evaluated in reversed(so_far):
        scores = evaluation(evaluated, metric)
        if scores:
            parts.append(scores if evaluated is so_far[-1] else f"{scores} (round {shown_round(evaluated['round'])})")
            break
    else:
        parts.append("not evaluated yet")
    missing = missing_sites(record)
    return " | ".join(parts + ([missing] if missing else []))


def outcome_line(results: dict, seconds: float, failed: str | None = None) -> str:
    """How the run ended: 'stopped ...: <the reason results.json records>', 'failed ...: <failed>' (the caller's
    reason: the simulator's exit code, errors in the logs) or 'finished N rounds in 3:10: <final evaluation>'."""
    results = results if isinstance(results, dict) else {}
    took = f"after {clock(seconds)} ({len(finished_rounds(results))} round(s) recorded)"
    if results.get("stopped"):
        return f"stopped {took}: {_text(results['stopped'], 500)}"
    final = results.get("final")
    if failed or not isinstance(final, dict):
        return f"failed {took}: {failed or 'no final results'}"
    scores = evaluation(final, _text(results.get("metric") or "score", 20))
    return f"finished {len(finished_rounds(results))} round(s) in {clock(seconds)}" + (f": {scores}" if scores else "")


def round_printer(label: str = "", write=print):
    """An `on_round` callback for fairfl.simulate.run_simulator that prints progress_line (after `label`)."""

    def show(record: dict, results: dict, elapsed: float) -> None:
        write(label + progress_line(record, results, elapsed), flush=True)

    return show
