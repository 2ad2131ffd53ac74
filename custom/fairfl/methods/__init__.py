"""The method registry: every method unit's spec, and the one place names, variants, jobs and claims are looked up.

A method unit is a subpackage `fairfl.methods.<name>` with a `SPEC` (`fairfl.methods.spec.MethodSpec`); the registry
finds every one, so adding a method adds its unit and edits nothing shared. The report, the benchmark, the CLI and
`fairfl make-jobs` read method names, display names, jobs and the papers' claims from here and nowhere else;
fairfl.arguments finds the units' controller arguments through it. Importing this imports the units' specs alone,
which start neither torch nor FLARE.

The units stand in the order their specs give (MethodSpec.order): that of the benchmark's default comparisons and of
their claims. The sites run the units' client steps in the order of their ranks (MethodSpec.client_steps)."""

from __future__ import annotations

import importlib
import pkgutil

from fairfl.methods.spec import FAMILY_METRICS, Claim, Job, MethodSpec, Variant


def discovered_units() -> list[MethodSpec]:
    """The SPEC of every subpackage of fairfl.methods that has one (named as its package), in no particular order."""
    found = []
    for module in pkgutil.iter_modules(__path__, f"{__name__}."):
        spec = getattr(importlib.import_module(module.name), "SPEC", None) if module.ispkg else None
        if spec is None:
            continue
        if not isinstance(spec, MethodSpec) or spec.name != module.name.rpartition(".")[2]:
            raise ValueError(f"{module.name}.SPEC must be a MethodSpec named as its package")
        found.append(spec)
    return found


def _refuse_ties(ranked, what: str, by: str) -> None:
    """ValueError unless every (rank, name) of `ranked` has a rank of its own: a tie would leave the order to the
    file system."""
    seen: dict[object, str] = {}
    for rank, name in ranked:
        if rank in seen:
            raise ValueError(f"{what} {seen[rank]} and {name} have the same {by}, {rank}, in the method registry")
        seen[rank] = name


def in_order(units) -> tuple[MethodSpec, ...]:
    """`units` by their order (MethodSpec.order); two in one place are refused."""
    _refuse_ties([(unit.order, unit.name) for unit in units], "method units", "order")
    return tuple(sorted(units, key=lambda unit: unit.order))


def step_order(units) -> tuple[str, ...]:
    """The dotted paths of every unit's client steps by rank (MethodSpec.client_steps); two of one rank are refused."""
    ranked = [(rank, path) for unit in units for path, rank in unit.client_steps]
    _refuse_ties(ranked, "client steps", "rank")
    return tuple(path for _, path in sorted(ranked))


UNITS: tuple[MethodSpec, ...] = in_order(discovered_units())
FAMILIES = tuple(FAMILY_METRICS)  # the benchmark's comparisons (fairfl.benchmark)
# what methods change at the sites (fairfl.methods.steps): each phase of a task runs the steps its meta switches on in
# this order
CLIENT_STEPS: tuple[str, ...] = step_order(UNITS)


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
    "discovered_units",
    "in_order",
    "step_order",
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
