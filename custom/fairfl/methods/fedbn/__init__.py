"""FedBN (Li et al., "FedBN: Federated Learning on Non-IID Features via Local Batch Normalization", ICLR 2021): FedAvg
in which every site keeps its own normalisation layers, the standard answer to scanner shift."""

from fairfl.methods.spec import Job, MethodSpec, Variant

SPEC = MethodSpec(
    name="fedbn",
    order=40,
    client_steps=(("fairfl.methods.fedbn.client.LocalNorm", 30),),
    doc="methods/fedbn.md",
    # batch norm: the U-Net's default instance norm has no parameters to keep local
    jobs=(Job("fedbn", "fairfl.methods.fedbn.controller.FedBNController", server={"model_norm": "batch"}),),
    variants=(Variant("fedbn", "FedBN", "fedbn"),),
)
