"""Ditto's job arguments (fairfl.methods.ditto.controller.DittoController), besides the round's."""

from fairfl.argument import Argument
from fairfl.kinds import Real
from fairfl.methods.fedprox.arguments import MAX_PROXIMAL_WEIGHT
from fairfl.methods.spec import ControllerArguments

DITTO = (
    Argument(
        "ditto_lambda",
        Real(0, MAX_PROXIMAL_WEIGHT),
        0.1,
        "lambda of the personal objective; 0 = the personal model trains on local data alone (started from the first "
        "global model it received); large = it stays near the global model (the paper tunes it per dataset from a "
        "small grid; 0.1 is NVFlare 2.9's PTDittoHelper's)",
    ),
)
CONTROLLERS = {"fairfl.methods.ditto.controller.DittoController": ControllerArguments(DITTO)}
