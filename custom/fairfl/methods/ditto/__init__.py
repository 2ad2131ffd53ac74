"""Ditto (Li et al., ICML 2021): each site keeps a personal model pulled towards the global one."""

from fairfl.methods.spec import Claim, Job, MethodSpec, Variant

SPEC = MethodSpec(
    name="ditto",
    order=60,
    client_steps=(
        ("fairfl.methods.ditto.client.PersonalTraining", 50),
        ("fairfl.methods.ditto.client.PersonalEvaluation", 70),
    ),
    doc="methods/ditto.md",
    jobs=(Job("ditto", "fairfl.methods.ditto.controller.DittoController"),),
    variants=(Variant("ditto", "Ditto", "ditto", families=("segmentation", "quality_shift", "imbalanced")),),
    # fairer and at least as accurate
    claims=(
        Claim("Ditto", "ditto", "fedavg", "dice", "std", family="segmentation"),
        Claim("Ditto", "ditto", "fedavg", "dice", "avg", family="segmentation"),
    ),
)
