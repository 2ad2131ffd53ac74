"""FedISM(+)'s job arguments (fairfl.methods.fedism.controller.FedISMController), besides the round's."""

from fairfl.argument import Argument
from fairfl.kinds import Boolean, OneOf, Real
from fairfl.methods.spec import ControllerArguments

# the largest rho a job may set and a site accepts (fairfl.methods.fedism.client): 100 times the papers' largest (0.1)
MAX_SEARCH_DISTANCE = 10.0

FEDISM = (  # fairfl.methods.fedism.sharpness.RHO_MAX, TAU, GSAM_ALPHA; saga.VARIANTS, Q, BETA
    Argument(
        "rho_max",
        Real(0, MAX_SEARCH_DISTANCE),
        0.1,
        "the largest search distance (FedISM+: 0.1; FedISM's fixed rho: 0.05)",
    ),
    Argument(
        "tau",
        Real(0, 100),
        0.5,
        "how fast rho grows (Eq. 12; FedISM+: 0.5); 0 = a fixed rho = rho_max, which is FedISM",
    ),
    Argument(
        "variant", OneOf(("S", "L")), "S", 'SAGA\'s weights: "S" (sharpness, Eq. 16) or "L" (perturbed loss, Eq. 17)'
    ),
    Argument("q", Real(0, 100, low_open=True), 2.0, "exponent of SAGA's weights (the paper: 2; Eq. 16 needs q > 0)"),
    Argument(
        "beta",
        Real(0, 1, low_open=True),
        0.5,
        "moving-average weight of this round's raw weights (the paper: 0.5; 1 = no averaging)",
    ),
    Argument("gsam_alpha", Real(0, 1), 0.1, "GSAM's surrogate-gap weight (0.1); 0 is SAM"),
    Argument(
        "saga",
        Boolean(),
        True,
        "false = the SALT-only ablation (the paper's Table I): SALT training, FedAvg's weights (weighting), no "
        "sharpness probe",
    ),
)
CONTROLLERS = {"fairfl.methods.fedism.controller.FedISMController": ControllerArguments(FEDISM)}
