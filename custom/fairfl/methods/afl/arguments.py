"""AFL's job arguments (fairfl.methods.afl.controller.AFLController), besides the round's."""

from fairfl.argument import Argument
from fairfl.kinds import Nullable, Real
from fairfl.methods.spec import ControllerArguments

AFL = (
    Argument(
        "afl_alpha",
        Real(0, 1),
        0.5,
        "how far lambda may leave FedAvg's weights p: lambda = (1 - afl_alpha) p + afl_alpha mu, mu any mixture, so "
        "every site keeps at least (1 - afl_alpha) of its FedAvg weight and none exceeds (1 - afl_alpha) p_k + "
        "afl_alpha; 0 = FedAvg, 1 = the paper's whole simplex (one site may take every weight)",
    ),
    Argument(
        "afl_step",
        Real(0, 100),
        0.05,
        "gamma_lambda, the step of lambda's projected gradient ascent, in units of the round's median loss (the "
        "bounded losses ascended along are each site's loss over the round's median); 0 = lambda never moves",
    ),
    Argument(
        "afl_loss_cap",
        Real(1, 1000),
        3.0,
        "a site's loss counts at most this many times the round's median loss (lower median) in lambda's step: a "
        "site claiming a huge loss gains no more weight than one this far behind",
    ),
    Argument(
        "afl_max_gain",
        Nullable(Real(0, 1000)),
        None,
        "null = no ceiling (lambda bounded by afl_alpha alone); beta >= 0 = a ceiling besides: no site's lambda_k "
        "above (1 + beta) p_k, so a site claiming a huge loss gains at most beta times its own FedAvg weight (0 = "
        "FedAvg); it caps a genuinely badly served small site as much (recorded: at_ceiling)",
    ),
)
# MinimaxAggregation: AFL's aggregation mixed into another controller (FedFloor's), which declares AFL among its own
CONTROLLERS = {
    f"fairfl.methods.afl.controller.{name}": ControllerArguments(AFL)
    for name in ("MinimaxAggregation", "AFLController")
}
