"""FedFloor's job arguments (fairfl.methods.fedfloor.controller.FedFloorController), besides the round's: Ditto's,
its own, then AFL's (read only with minimax_aggregation)."""

from fairfl.argument import Argument
from fairfl.kinds import Boolean, ListOf, Real
from fairfl.methods.afl.arguments import AFL
from fairfl.methods.ditto.arguments import DITTO
from fairfl.methods.spec import ControllerArguments

FEDFLOOR = (  # fairfl.methods.fedfloor.mixing.DEFAULT_GRID, check_grid
    Argument(
        "mix_grid",
        ListOf(Real(0, 1), 1, 101, distinct=True),
        (0.0, 0.25, 0.5, 0.75, 1.0),
        "the alphas scored (0 = the global model, 1 = the personal model); [0, 1] chooses between the two without "
        "mixing (recorded as fedfloor_pick)",
    ),
    Argument(
        "mix_guard",
        Real(0, 10),
        0.0,
        "0 = each site is scored with the mix its validation split scores best; z > 0 = only with a mix whose "
        "validation gain over the global model, less z standard errors of that gain (its patients paired), is above "
        "0, else the global model (recorded as fedfloor_guarded): a few validation patients do not move a site off "
        "the shared model. Needs 0 in mix_grid",
    ),
    Argument(
        "minimax_aggregation",
        Boolean(),
        False,
        "true: the global model is aggregated as AFL's (the sites' weights ascend on the losses of the model sent, "
        "within afl_alpha of FedAvg's; recorded as fedfloor_minimax), so the global model each site mixes with "
        "leans toward the sites it serves worst; false: FedAvg's",
    ),
)
CONTROLLERS = {"fairfl.methods.fedfloor.controller.FedFloorController": ControllerArguments(DITTO + FEDFLOOR + AFL)}
