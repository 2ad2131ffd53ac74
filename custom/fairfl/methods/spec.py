"""What makes a method a method, written as data: its jobs, the variants a benchmark can run, and its paper's claims.

No FLARE or torch import here: the CLI, the report and the benchmark read these without starting either."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from fairfl.paired import Interval, verdict

# The benchmark's comparisons (fairfl.benchmark adds their papers and sites) and the metrics each reports, its
# headline first: the one a family's claims are judged on unless a claim names another.
FAMILY_METRICS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"segmentation": ("dice",), "quality_shift": ("auc",), "imbalanced": ("balanced_accuracy", "auc")}
)


def _frozen(mapping: Mapping | None) -> Mapping:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class Job:
    """A job folder `jobs/<name>/` (written by `fairfl make-jobs`): the server runs `controller` (a dotted class path)
    with its constructor's defaults changed by `server`; every site runs the executor for `tasks` with its defaults
    changed by `client`."""

    name: str
    controller: str
    tasks: tuple = ("train", "validate")
    server: Mapping = field(default_factory=dict)
    client: Mapping = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "server", _frozen(self.server))
        object.__setattr__(self, "client", _frozen(self.client))


@dataclass(frozen=True)
class Variant:
    """One runnable configuration of a method: `name` is what its runs record as their method (results.json) and what
    `fairfl benchmark --methods` takes; `job` with `arguments` runs it. `dataset_arguments` are per built-in dataset
    defaults (the paper's setting for that data), which the run's own arguments override. `families`: the benchmark
    comparisons that run it by default. `records`: the method its runs record, when that is another variant's name
    and a setting in their config tells them apart (FedAvg with local SGD records "fedavg", local_optimizer "sgd")."""

    name: str
    display: str
    job: str
    arguments: Mapping = field(default_factory=dict)
    families: tuple = ()
    dataset_arguments: Mapping = field(default_factory=dict)
    records: str = ""

    def __post_init__(self):
        object.__setattr__(self, "arguments", _frozen(self.arguments))
        object.__setattr__(
            self, "dataset_arguments", _frozen({k: _frozen(v) for k, v in dict(self.dataset_arguments).items()})
        )
        object.__setattr__(self, "records", self.records or self.name)


# a claim's `paper` where the claim is this project's own comparison, not a paper's: a method judged against its closest
# ancestor (the method it adds one idea to) beside the baseline its paper beats
CLOSEST_ANCESTOR = "fairfl (closest ancestor)"


class Claim:
    """A paper's claim (or, `paper` CLOSEST_ANCESTOR, this project's comparison of a method with its closest ancestor)
    as a comparison of two methods' final results in a benchmark `family`: `statistic` ("avg":
    mean over sites, or "std": population std across sites) of `metric` (%); the claim is that method - baseline is
    above 0 / at least `margin` (higher is better), or below 0 / at most -`margin` (lower is better, for a std): at
    margin 0 both are strict, so an arm identical to the baseline holds neither. It is judged
    on the paired per-seed differences (fairfl.paired): holds when their whole 95% interval satisfies it, fails when
    none of it does, inconclusive otherwise."""

    def __init__(self, paper, method, baseline, metric, statistic, margin=0.0, family=""):
        self.paper, self.method, self.baseline = paper, method, baseline
        self.metric, self.statistic, self.margin, self.family = metric, statistic, margin, family

    @property
    def lower_is_better(self) -> bool:
        return self.statistic == "std"

    def text(self, method_name) -> str:
        from fairfl.labels import metric_label_markdown  # method_name: the registry's (the registry imports this)

        what = f"{'Std.' if self.lower_is_better else 'Avg.'} {metric_label_markdown(self.metric)}"
        points = f"{abs(self.margin):g} point{'' if abs(self.margin) == 1 else 's'}"
        if self.lower_is_better:
            goal = "below" if self.margin == 0 else f"at least {points} below"
        elif self.margin >= 0:
            goal = "above" if self.margin == 0 else f"at least {points} above"
        else:
            goal = f"at most {points} below"
        return f"{method_name(self.method)}: {what} {goal} {method_name(self.baseline)}'s"

    def judge(self, interval: Interval) -> str:
        """holds, fails or inconclusive, from the interval of the paired differences method - baseline."""
        if self.lower_is_better:
            return verdict(interval, -self.margin, above=False, strict=self.margin == 0)
        return verdict(interval, self.margin, above=True, strict=self.margin == 0)


@dataclass(frozen=True)
class ControllerArguments:
    """What a method's controller takes besides the round's arguments, which every controller takes
    (fairfl.arguments.ROUND): `own`, listed after the round's in its job files, and `defaults`, the defaults it
    changes of either (Fed-LWR weighs its sites uniformly). A unit declares them in `fairfl.methods.<name>.arguments`
    as CONTROLLERS, {controller class path: ControllerArguments}."""

    own: tuple = ()
    defaults: Mapping = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "defaults", _frozen(self.defaults))


@dataclass(frozen=True)
class MethodSpec:
    """A method unit, the package `fairfl.methods.<name>` whose SPEC this is (the registry, fairfl.methods, finds it
    there): its documentation page (under docs/), its jobs, variants and claims, where it stands among the units, and
    its client steps. Its controllers' job arguments are declared beside it, in `fairfl.methods.<name>.arguments`
    (CONTROLLERS: ControllerArguments)."""

    name: str
    doc: str
    jobs: tuple
    variants: tuple
    # Where the unit stands among the units (ascending; no two alike): the order of the benchmark's default method
    # lists and of the claims, and so of the SUMMARY tables. Spaced by 10, so a new unit can stand between two.
    order: int
    claims: tuple = ()
    # The unit's client steps (fairfl.methods.steps.ClientStep), as (dotted class path, rank). Every phase of a site's
    # task runs the steps that apply, of every unit, by ascending rank (no two alike): Ditto keeps the model sent
    # (PersonalTraining) before a probe runs on it (ProbeModelSent); CFFL scores the trained model (ValidateTrained)
    # before Ditto's personal step. A step replacing the loss (FedNPR's) runs before those adding a term (FedProx's)
    # whatever the ranks (ClientStep.replaces_loss).
    client_steps: tuple = ()
    # The unit's own site tasks (fairfl.methods.steps.MethodTask), as dotted class paths: a site's executor answers
    # each by its name beside train and validate, and the unit's job lists it among its tasks.
    site_tasks: tuple = ()

    @property
    def package(self) -> str:
        return f"fairfl.methods.{self.name}"
