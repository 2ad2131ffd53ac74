"""FedSoup (Chen, Jiang, Dou, Wang and Li, MICCAI 2023): each site keeps a soup of the global models it received late
in the run, adding one only when its own validation split does not score the mix worse (temporal model selection),
and is scored with its local model averaged with that soup (federated model patching)."""

from fairfl.methods.spec import Claim, Job, MethodSpec, Variant

SPEC = MethodSpec(
    name="fedsoup",
    order=68,
    client_steps=(
        ("fairfl.methods.fedsoup.client.SoupSelection", 58),
        ("fairfl.methods.fedsoup.client.SoupEvaluation", 68),
    ),
    doc="methods/fedsoup.md",
    jobs=(Job("fedsoup", "fairfl.methods.fedsoup.controller.FedSoupController"),),
    variants=(Variant("fedsoup", "FedSoup", "fedsoup", families=("segmentation", "quality_shift", "imbalanced")),),
    # the paper's: its personalised (patched) models more accurate on the sites' own data than FedAvg's
    claims=(Claim("FedSoup", "fedsoup", "fedavg", "dice", "avg", family="segmentation"),),
)
