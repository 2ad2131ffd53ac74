"""FedNPR's job arguments (fairfl.methods.fednpr.controller.FedNPRController), besides the round's: FedProx's mu
(0 here: no proximal term unless a job sets one), then its own."""

from fairfl.argument import MAX_FACTOR, Argument
from fairfl.kinds import Boolean, Integer, OneOf, Real
from fairfl.methods.fedprox.arguments import FEDPROX
from fairfl.methods.spec import ControllerArguments

FEDNPR = (  # fairfl.methods.fednpr.npr: NUM_SUBCLUSTERS, NPR_WEIGHT, EPSILON, ... and what a site accepts
    Argument(
        "num_subclusters",
        Integer(1, 256),
        4,
        "K prototypes per class (the paper: 4 on skin lesions, 2 on ICH; 1 = the class mean)",
    ),
    Argument(
        "npr_weight",
        Real(0, MAX_FACTOR),
        1.0,
        "lambda of Eq. 5, multiplying NPR. Default 1: the authors' code adds lambda instead, so their runs trained "
        "with weight 1 whatever lambda they give (the paper: 0.1 on skin, 0.05 on ICH)",
    ),
    Argument("sinkhorn_epsilon", Real(0, MAX_FACTOR, low_open=True), 0.05, "Sinkhorn-Knopp's entropic regularisation"),
    Argument("sinkhorn_iterations", Integer(1, 10_000), 50, "Sinkhorn-Knopp's iterations"),
    Argument("temperature", Real(0, MAX_FACTOR, low_open=True), 1.0, "divides NPR's logits (Eq. 3 has none: 1)"),
    Argument(
        "npr_logits",
        OneOf(("layernorm", "cosine")),
        "layernorm",
        '"layernorm" (the authors\' training loop: the per-class max cosines through a LayerNorm over the classes) or '
        '"cosine" (Eq. 3 as printed: the max cosines themselves)',
    ),
    Argument("personal_head", Boolean(), False, "FedNPR-Per: every site keeps its own classifier head"),
    Argument(
        "score_local_model",
        Boolean(),
        False,
        "false: every site is scored with the aggregated global model (FedNPR-Per: with its own head); true (the "
        "authors' protocol): with the model it trained in the round, the one it sends, before aggregation; the global "
        "model is then scored beside it (global_ metrics)",
    ),
)
CONTROLLERS = {
    "fairfl.methods.fednpr.controller.FedNPRController": ControllerArguments(FEDPROX + FEDNPR, defaults={"mu": 0.0})
}
