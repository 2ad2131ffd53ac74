"""FedAvgM (Hsu et al., 2019): FedAvg whose server steps along a momentum of the rounds' averaged updates, which
damps the round-to-round swings that sites with different data cause."""

from fairfl.methods.spec import Job, MethodSpec, Variant

SPEC = MethodSpec(
    name="fedavgm",
    order=25,
    doc="methods/fedavgm.md",
    jobs=(Job("fedavgm", "fairfl.methods.fedavgm.controller.FedAvgMController"),),
    variants=(Variant("fedavgm", "FedAvgM", "fedavgm"),),
)
