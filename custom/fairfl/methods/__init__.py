"""The method registry: every method unit's spec, and the one place names, variants, jobs and claims are looked up.

A method unit is a package `fairfl.methods.<name>` with a `SPEC` (`fairfl.methods.spec.MethodSpec`). The report,
the benchmark, the CLI and `fairfl make-jobs` read method names, display names, jobs and the papers' claims from
here and nowhere else; adding a method means adding its unit to UNITS. Importing this starts neither torch nor FLARE.

The units' order is the order of the benchmark's default comparisons and of their claims."""

from __future__ import annotations

from fairfl.methods import (
    ditto,
    fedavg,
    fedbn,
    fedce,
    fedfloor,
    fedism,
    fedlwr,
    fednpr,
    fedprox,
    qfedavg,
    rewards,
    solo,
)
from fairfl.methods.spec import FAMILY_METRICS, Claim, Job, MethodSpec, Variant

UNITS: tuple[MethodSpec, ...] = tuple(
    unit.SPEC
    for unit in (solo, fedavg, fedprox, fedbn, qfedavg, ditto, rewards, fedce, fedlwr, fedism, fednpr, fedfloor)
)
FAMILIES = tuple(FAMILY_METRICS)  # the benchmark's comparisons (fairfl.benchmark)
# What methods change at the sites (fairfl.methods.steps): each phase of a task runs the steps its meta switches on in
# this order (Ditto keeps the model sent before a probe runs on it; CFFL scores the trained model before Ditto's
# personal step; a step replacing the loss runs before those adding a term whatever the order).
CLIENT_STEPS = (
    "fairfl.methods.fedce.client.LeaveOneOutError",
    "fairfl.methods.fednpr.client.PersonalHead",
    "fairfl.methods.fedbn.client.LocalNorm",
    "fairfl.methods.rewards.client.ValidateTrained",
    "fairfl.methods.ditto.client.PersonalTraining",
    "fairfl.methods.fedfloor.client.ValidatedMix",
    "fairfl.methods.ditto.client.PersonalEvaluation",
    "fairfl.methods.fedism.client.ProbeModelSent",
    "fairfl.methods.fednpr.client.NPRObjective",
    "fairfl.methods.fedprox.client.ProximalTerm",
    "fairfl.methods.fedism.client.SALTTraining",
)


def _unique(items, what: str) -> dict:
    found = {}
    for item in items:
        if item.name in found:
            raise ValueError(f"two {what} named {item.name!r} in the method registry")
        found[item.name] = item
    return found


VARIANTS: dict[str, Variant] = _unique((v for unit in UNITS for v in unit.variants), "variants")
JOBS: dict[str, Job] = _unique((j for unit in UNITS for j in unit.jobs), "jobs")


def display_name(method: str) -> str:
    """How tables name a method (a registered variant); an unknown name (an old run's) is shown as it is."""
    variant = VARIANTS.get(method)
    return variant.display if variant else method


def unit_of(method: str) -> MethodSpec:
    """The unit a variant belongs to."""
    return next(unit for unit in UNITS if any(v.name == method for v in unit.variants))


def family_methods(family: str) -> list[str]:
    """The variants a benchmark family runs by default, in registry order."""
    return [name for name, variant in VARIANTS.items() if family in variant.families]


def family_claims(family: str) -> list[Claim]:
    """The papers' claims judged in a benchmark family, in registry order."""
    return [claim for unit in UNITS for claim in unit.claims if claim.family == family]


def variant_job(method: str, dataset: str = "") -> tuple[str, dict]:
    """(job name, job arguments) that run variant `method` on `dataset`: its dataset defaults, then its own."""
    variant = VARIANTS[method]
    return variant.job, {**variant.dataset_arguments.get(dataset, {}), **variant.arguments}


__all__ = [
    "UNITS",
    "FAMILIES",
    "FAMILY_METRICS",
    "CLIENT_STEPS",
    "VARIANTS",
    "JOBS",
    "Claim",
    "Job",
    "MethodSpec",
    "Variant",
    "display_name",
    "unit_of",
    "family_methods",
    "family_claims",
    "variant_job",
]
