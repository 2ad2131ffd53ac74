"""Collaborative-fairness rewards, FedCE's baselines: CFFL (Lyu et al., 2020) and CGSV (Xu et al., NeurIPS 2021).
Each site receives a share of the update in proportion to its reputation."""

from fairfl.methods.spec import Job, MethodSpec, Variant

R = "fairfl.methods.rewards.controller"
SPEC = MethodSpec(
    name="rewards",
    order=70,
    client_steps=(("fairfl.methods.rewards.client.ValidateTrained", 40),),
    doc="methods/rewards.md",
    jobs=(Job("cffl", f"{R}.CFFLController"), Job("cgsv", f"{R}.CGSVController")),
    variants=(
        Variant("cffl", "CFFL", "cffl", families=("segmentation",)),
        Variant("cgsv", "CGSV", "cgsv", families=("segmentation",)),
    ),
)
