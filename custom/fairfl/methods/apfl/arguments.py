"""APFL's job arguments (fairfl.methods.apfl.controller.APFLController), besides the round's."""

from fairfl.argument import Argument
from fairfl.kinds import Nullable, Real
from fairfl.methods.spec import ControllerArguments

MAX_ALPHA_LR = 1000.0  # alpha stays in [0, 1] whatever the step; a larger one only throws it from end to end
ALPHA_INIT = Real(0, 1)
ALPHA_LR = Real(0, MAX_ALPHA_LR)

APFL = (
    Argument(
        "apfl_alpha_init",
        ALPHA_INIT,
        0.5,
        "the mixing weight alpha each site starts from (its score is alpha v + (1 - alpha) w, v its personal model, w "
        "the global one): 0 = the global model, 1 = the personal model; 0.5 is the authors' code's (FedTorch "
        "fed_personal_alpha)",
    ),
    Argument(
        "apfl_alpha_lr",
        Nullable(ALPHA_LR),
        None,
        "step size of alpha's projected gradient steps, one per local step; null = the site's learning rate (lr), "
        "as the paper and the authors' code take it; 0 = alpha stays at apfl_alpha_init (APFL with a fixed mix)",
    ),
)
CONTROLLERS = {"fairfl.methods.apfl.controller.APFLController": ControllerArguments(APFL)}
