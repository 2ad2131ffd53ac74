"""FedProx's job arguments (fairfl.methods.fedprox.controller.FedProxController), besides the round's."""

from fairfl.argument import Argument
from fairfl.kinds import Real
from fairfl.methods.spec import ControllerArguments

# the largest mu (FedProx) or lambda (Ditto) a job may set and a site accepts (fairfl.methods.fedprox.client): far
# above what is tuned (FedProx's grid: 0.001 to 1)
MAX_PROXIMAL_WEIGHT = 1000.0

FEDPROX = (
    Argument(
        "mu",
        Real(0, MAX_PROXIMAL_WEIGHT),
        0.01,
        "weight of the proximal term (mu / 2) ||w - w_t||^2 (FedProx tunes it over 0.001..1; 0.01 is NVFlare's)",
    ),
)
CONTROLLERS = {"fairfl.methods.fedprox.controller.FedProxController": ControllerArguments(FEDPROX)}
