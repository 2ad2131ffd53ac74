"""FedAvg (McMahan et al., 2017): the sample-weighted mean of the local models, the baseline of every paper."""

from fairfl.methods.spec import Job, MethodSpec, Variant

SPEC = MethodSpec(
    name="fedavg",
    order=20,
    doc="methods/fedavg.md",
    jobs=(Job("fedavg", "fairfl.methods.fedavg.controller.FedAvgController"),),
    variants=(Variant("fedavg", "FedAvg", "fedavg", families=("segmentation", "quality_shift", "imbalanced")),),
)
