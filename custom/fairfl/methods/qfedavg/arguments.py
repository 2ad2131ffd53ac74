"""q-FedAvg's job arguments (fairfl.methods.qfedavg.controller.QFedAvgController), besides the round's."""

from fairfl.argument import Argument
from fairfl.kinds import Nullable, Real
from fairfl.methods.spec import ControllerArguments

QFEDAVG = (
    Argument("q", Real(0, 100), 1.0, "fairness exponent (0 = FedAvg with equal weights; FedISM+ tunes 0.5, 1, 2, 5)"),
    Argument(
        "lipschitz",
        Nullable(Real(0, 1e12)),
        None,
        "L of the update; null = 1 / the sites' learning rate (Li et al.); 0 = loss^q-weighted FedAvg",
    ),
)
CONTROLLERS = {"fairfl.methods.qfedavg.controller.QFedAvgController": ControllerArguments(QFEDAVG)}
