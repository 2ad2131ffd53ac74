"""FedNPR / FedNPR-Per (prototype regularisation for class imbalance: balanced softmax plus a loss pulling features
towards the federation's per-class sub-cluster prototypes; -Per keeps a personal head)."""

from fairfl.methods.spec import CLOSEST_ANCESTOR, Claim, Job, MethodSpec, Variant

IMBALANCED = ("imbalanced",)
# K per dataset (the paper's grid search): 4 on skin lesions, 2 on ICH. lambda stays the job's 1: the authors' code
# adds the paper's 0.1 / 0.05 to the loss instead of multiplying, so their runs trained NPR with weight 1.
K = {"skin_imbalanced": {"num_subclusters": 4}, "ich_imbalanced": {"num_subclusters": 2}}
DATA = {"dataset": "skin_imbalanced"}
SPEC = MethodSpec(
    name="fednpr",
    order=110,
    client_steps=(
        ("fairfl.methods.fednpr.client.PersonalHead", 20),
        ("fairfl.methods.fednpr.client.NPRObjective", 90),
    ),
    doc="methods/fednpr.md",
    jobs=(
        Job("fednpr", "fairfl.methods.fednpr.controller.FedNPRController", server=DATA),
        Job("fednpr_per", "fairfl.methods.fednpr.controller.FedNPRController", server={**DATA, "personal_head": True}),
    ),
    variants=(
        Variant("fednpr", "FedNPR", "fednpr", families=IMBALANCED, dataset_arguments=K),
        Variant("fednpr_per", "FedNPR-Per", "fednpr_per", families=IMBALANCED, dataset_arguments=K),
        Variant("fedprox_npr", "FedProx + NPR", "fednpr", {"mu": 0.01}, families=IMBALANCED, dataset_arguments=K),
        Variant("fedprox_npr_per", "FedProx + NPR-Per", "fednpr_per", {"mu": 0.01}, dataset_arguments=K),
    ),
    claims=(
        Claim("FedNPR", "fednpr", "fedavg", "balanced_accuracy", "avg", 2.0, family="imbalanced"),
        Claim("FedNPR", "fednpr_per", "fednpr", "balanced_accuracy", "avg", family="imbalanced"),
        Claim("FedNPR", "fedprox_npr", "fedprox", "balanced_accuracy", "avg", family="imbalanced"),
        # this project's: the personal head against FedNPR, its closest ancestor, on the spread too
        Claim(CLOSEST_ANCESTOR, "fednpr_per", "fednpr", "balanced_accuracy", "std", family="imbalanced"),
    ),
)
