"""Fed-LWR (Yan et al., MICCAI 2024): layer-wise re-weighting by CKA to an averaged anchor; per layer, a site whose
features differ most from the anchor model's gets the largest weight."""

from fairfl.methods.spec import Claim, Job, MethodSpec, Variant

SPEC = MethodSpec(
    name="fedlwr",
    order=90,
    doc="methods/fedlwr.md",
    jobs=(Job("fedlwr", "fairfl.methods.fedlwr.controller.FedLWRController", tasks=("train", "validate", "cka")),),
    site_tasks=("fairfl.methods.fedlwr.client.AnchorCKA",),
    variants=(Variant("fedlwr", "Fed-LWR", "fedlwr", families=("segmentation",)),),
    claims=(
        Claim("Fed-LWR", "fedlwr", "fedavg", "dice", "std", family="segmentation"),
        Claim("Fed-LWR", "fedlwr", "fedavg", "dice", "avg", family="segmentation"),
    ),
)
