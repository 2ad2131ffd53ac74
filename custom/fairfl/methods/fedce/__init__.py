"""FedCE (Jiang et al., "Fair Federated Medical Image Segmentation via Client Contribution Estimation", CVPR 2023):
aggregation weights from each site's estimated contribution in gradient and data space."""

from fairfl.methods.spec import Claim, Job, MethodSpec, Variant

SPEC = MethodSpec(
    name="fedce",
    order=80,
    client_steps=(("fairfl.methods.fedce.client.LeaveOneOutError", 10),),
    doc="methods/fedce.md",
    jobs=(Job("fedce", "fairfl.methods.fedce.controller.FedCEController"),),
    variants=(
        Variant("fedce_sum", "FedCE (Sum.)", "fedce", {"combine": "sum"}, families=("segmentation", "quality_shift")),
        Variant("fedce_product", "FedCE (Multi.)", "fedce", {"combine": "product"}, families=("segmentation",)),
    ),
    claims=tuple(
        Claim("FedCE", method, "fedavg", "dice", statistic, family="segmentation")
        for method in ("fedce_sum", "fedce_product")
        for statistic in ("std", "avg")
    ),
)
