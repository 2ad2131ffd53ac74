"""AFL (Mohri, Sivek and Suresh, "Agnostic Federated Learning", ICML 2019): the global model is the average of the
sites' models under mixture weights lambda, which take a projected gradient-ascent step on the sites' losses each
round (minimax: the aggregation moves toward the sites the global model serves worst), within a set of mixtures
around FedAvg's weights that bounds what any one site can gain."""

from fairfl.methods.spec import Claim, Job, MethodSpec, Variant

SPEC = MethodSpec(
    name="afl",
    order=52,
    doc="methods/afl.md",
    jobs=(Job("afl", "fairfl.methods.afl.controller.AFLController"),),
    variants=(Variant("afl", "AFL", "afl", families=("segmentation", "quality_shift", "imbalanced")),),
    # the paper's: a better model for the worst-served mixture of the sites than FedAvg's; judged here, as q-FFL's
    # claim is, on the spread of the sites' Dice
    claims=(Claim("AFL", "afl", "fedavg", "dice", "std", family="segmentation"),),
)
