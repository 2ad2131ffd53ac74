"""APFL (Deng, Kamani and Mahdavi, 2020): each site learns a personal model and how much of it to mix with the global
model."""

from fairfl.methods.spec import Claim, Job, MethodSpec, Variant

SPEC = MethodSpec(
    name="apfl",
    order=65,
    client_steps=(
        ("fairfl.methods.apfl.client.MixedTraining", 56),
        ("fairfl.methods.apfl.client.MixedEvaluation", 66),
    ),
    doc="methods/apfl.md",
    jobs=(Job("apfl", "fairfl.methods.apfl.controller.APFLController"),),
    variants=(Variant("apfl", "APFL", "apfl", families=("segmentation", "quality_shift", "imbalanced")),),
    # the paper's: its personalised models more accurate than FedAvg's global model on non-IID data
    claims=(Claim("APFL", "apfl", "fedavg", "dice", "avg", family="segmentation"),),
)
