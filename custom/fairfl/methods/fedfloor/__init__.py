"""FedFloor (this project's own method): Ditto's personal models, and each site scored with the mix of the global
and its personal model that its own validation split favours."""

from fairfl.methods.spec import FAMILY_METRICS, Claim, Job, MethodSpec, Variant

HEADLINE = {family: metrics[0] for family, metrics in FAMILY_METRICS.items()}  # every family, on its own metric

SPEC = MethodSpec(
    name="fedfloor",
    order=120,
    client_steps=(("fairfl.methods.fedfloor.client.ValidatedMix", 60),),
    doc="methods/fedfloor.md",
    jobs=(Job("fedfloor", "fairfl.methods.fedfloor.controller.FedFloorController"),),
    variants=(
        Variant("fedfloor", "FedFloor", "fedfloor", families=tuple(HEADLINE)),
        # ablation: choose the global or the personal model, never a mix
        Variant("fedfloor_pick", "FedFloor (pick)", "fedfloor", arguments={"mix_grid": [0, 1]}),
        # fairfl's composition: the global model each site mixes with is AFL's, pulled toward the worst-served
        # sites; its ablations are fedfloor (FedAvg's global model), afl (no personal model, no mix) and ditto
        Variant(
            "fedfloor_minimax",
            "FedFloor (minimax)",
            "fedfloor",
            arguments={"minimax_aggregation": True},
            families=tuple(HEADLINE),
        ),
        # FedFloor's next version for tiny validation splits: a site leaves the global model only for a mix whose
        # validation gain stands one standard error of the gain above 0; its ablation is fedfloor (no guard)
        Variant(
            "fedfloor_guarded",
            "FedFloor (guarded)",
            "fedfloor",
            arguments={"mix_guard": 1.0},
            families=tuple(HEADLINE),
        ),
    ),
    # the goal in docs/methods/fedfloor.md: fairer than FedAvg without losing more than half a point on average; and
    # the same against its closest ancestor, Ditto (whose personal model it may choose), and against Solo (training
    # alone; the worst site's goal is measured by benchmarks/fedfloor_goal.py)
    # FedFloor (minimax) against its ablations too: FedFloor (FedAvg's global model) and AFL (no personal model);
    # FedFloor (guarded) against FedFloor (no guard) and FedAvg (the model it falls back to)
    claims=tuple(
        claim
        for method, baselines in (
            ("fedfloor", ("fedavg", "ditto", "solo")),
            ("fedfloor_minimax", ("fedfloor", "afl")),
            ("fedfloor_guarded", ("fedfloor", "fedavg")),
        )
        for baseline in baselines
        for family, metric in HEADLINE.items()
        if baseline != "solo" or family != "quality_shift"  # Solo has no quality-shift arm: one shared test set
        for claim in (
            Claim("FedFloor", method, baseline, metric, "std", family=family),
            Claim("FedFloor", method, baseline, metric, "avg", margin=-0.5, family=family),
        )
    ),
)
