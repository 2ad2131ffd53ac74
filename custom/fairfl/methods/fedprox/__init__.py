"""FedProx (Li et al., 2020): FedAvg with a proximal term mu/2 ||w - w_global||^2 in every site's loss."""

from fairfl.methods.spec import Job, MethodSpec, Variant

SPEC = MethodSpec(
    name="fedprox",
    order=30,
    client_steps=(("fairfl.methods.fedprox.client.ProximalTerm", 100),),
    doc="methods/fedavg.md",
    jobs=(Job("fedprox", "fairfl.methods.fedprox.controller.FedProxController"),),
    variants=(Variant("fedprox", "FedProx", "fedprox", families=("segmentation", "imbalanced")),),
)
