"""FedCE's job arguments (fairfl.methods.fedce.controller.FedCEController), besides the round's."""

from fairfl.argument import Argument
from fairfl.kinds import OneOf
from fairfl.methods.spec import ControllerArguments

FEDCE = (  # fairfl.methods.fedce.contribution.COMBINE_MODES
    Argument(
        "combine",
        OneOf(("sum", "product")),
        "sum",
        '"sum" (FedCE (Sum.), Gamma^s) or "product" (FedCE (Multi.), Gamma^m)',
    ),
)
CONTROLLERS = {"fairfl.methods.fedce.controller.FedCEController": ControllerArguments(FEDCE)}
