"""q-FedAvg (Li et al., "Fair Resource Allocation in Federated Learning", ICLR 2020): sites with a higher loss get a
larger share of the update (q-FFL)."""

from fairfl.methods.spec import Claim, Job, MethodSpec, Variant

SEGMENTATION = ("segmentation",)
# q-FFL: fairer at a similar average (within a point here)
CLAIMS = tuple(
    claim
    for method, baseline in (("qfedavg", "fedavg"), ("qfedavg_lossweighted", "fedavg"), ("qfedavg_sgd", "fedavg_sgd"))
    for claim in (
        Claim("q-FFL", method, baseline, "dice", "std", family="segmentation"),
        Claim("q-FFL", method, baseline, "dice", "avg", -1.0, family="segmentation"),
    )
)

SPEC = MethodSpec(
    name="qfedavg",
    order=50,
    doc="methods/qfedavg.md",
    jobs=(
        Job(
            "qfedavg",
            "fairfl.methods.qfedavg.controller.QFedAvgController",
            server={"num_rounds": 100, "eval_every": 10, "dataset": "skin"},
        ),
    ),
    variants=(
        Variant("qfedavg", "q-FedAvg (L = 1/lr)", "qfedavg", families=("segmentation", "quality_shift")),
        Variant(
            "qfedavg_lossweighted",
            "q-FedAvg (loss-weighted)",
            "qfedavg",
            {"lipschitz": 0.0},
            families=("segmentation", "quality_shift"),
        ),
        # q-FedAvg as Li et al. ran it: local SGD, L = 1 / lr; judged against FedAvg with the same local SGD. lr 0.5:
        # the smallest tried at which one site's plain SGD trains the U-Net at both sites measured, close to Adam
        # at 1e-3 (benchmarks/sgd_lr.py)
        Variant(
            "fedavg_sgd",
            "FedAvg (SGD)",
            "fedavg",
            {"local_optimizer": "sgd", "lr": 0.5},
            families=SEGMENTATION,
            records="fedavg",
        ),
        Variant(
            "qfedavg_sgd",
            "q-FedAvg (L = 1/lr) (SGD)",
            "qfedavg",
            {"local_optimizer": "sgd", "lr": 0.5},
            families=SEGMENTATION,
            records="qfedavg",
        ),
    ),
    claims=CLAIMS,
)
