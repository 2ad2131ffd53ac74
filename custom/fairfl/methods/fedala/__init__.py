"""FedALA (Zhang et al., AAAI 2023): each site starts its local training from the global model mixed element-wise,
on its top layers, with its own local model, by weights it learns on its own data (adaptive local aggregation)."""

from fairfl.methods.spec import Claim, Job, MethodSpec, Variant

SPEC = MethodSpec(
    name="fedala",
    order=67,
    client_steps=(
        ("fairfl.methods.fedala.client.AdaptiveStart", 57),
        ("fairfl.methods.fedala.client.AdaptiveEvaluation", 67),
    ),
    doc="methods/fedala.md",
    jobs=(Job("fedala", "fairfl.methods.fedala.controller.FedALAController"),),
    variants=(Variant("fedala", "FedALA", "fedala", families=("segmentation", "quality_shift", "imbalanced")),),
    # the paper's: its personalised models more accurate than FedAvg's on non-IID data
    claims=(Claim("FedALA", "fedala", "fedavg", "dice", "avg", family="segmentation"),),
)
