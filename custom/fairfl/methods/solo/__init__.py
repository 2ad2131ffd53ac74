"""Solo: every site trains alone, the lower bound a federation must beat at each site."""

from fairfl.methods.spec import Job, MethodSpec, Variant

SPEC = MethodSpec(
    name="solo",
    order=10,
    doc="methods/fedavg.md",
    jobs=(Job("solo", "fairfl.methods.solo.controller.SoloController"),),
    variants=(Variant("solo", "Solo", "solo", families=("segmentation", "imbalanced")),),
)
