"""FedRDN (Yan et al., CVPR 2025): FedAvg whose sites train on images normalised with the channel statistics of a
randomly drawn site of the federation, and are scored on images normalised with their own: input-level harmonisation
against scanner and image-quality shift."""

from fairfl.methods.spec import Claim, Job, MethodSpec, Variant

SPEC = MethodSpec(
    name="fedrdn",
    order=45,
    client_steps=(("fairfl.methods.fedrdn.client.RandomDomainNormalization", 45),),
    doc="methods/fedrdn.md",
    jobs=(Job("fedrdn", "fairfl.methods.fedrdn.controller.FedRDNController"),),
    variants=(Variant("fedrdn", "FedRDN", "fedrdn", families=("segmentation", "quality_shift", "imbalanced")),),
    # the paper's medical image segmentation experiments: FedAvg with FedRDN above FedAvg in Dice
    claims=(Claim("FedRDN", "fedrdn", "fedavg", "dice", "avg", family="segmentation"),),
)
