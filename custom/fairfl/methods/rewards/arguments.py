"""The reward controllers' job arguments (fairfl.methods.rewards.controller: CFFL's, CGSV's, none of their common
base's), besides the round's."""

from fairfl.argument import Argument
from fairfl.kinds import Nullable, Real
from fairfl.methods.spec import ControllerArguments

CFFL = (
    Argument(
        "alpha",
        Real(0, 100, low_open=True),  # sinh(alpha) overflows above 710
        5.0,
        'the sinh "punishment factor" (the authors\' code: 5 on MNIST; 10 on Adult)',
    ),
    Argument(
        "reputation_threshold",
        Real(0, 1, high_open=True),
        0.0,
        "a site whose normalised reputation falls below it is removed for good and receives nothing more; 0 = nobody "
        "is removed",
    ),
)
CGSV = (
    Argument("alpha", Real(0, 1), 0.95, "weight of the past reputation in its moving average (the paper: 0.95)"),
    Argument(
        "beta",
        Real(0, 1e9, low_open=True),
        1.0,
        "altruism degree: larger shares the aggregate more equally (the authors' code sweeps 0.5 to 2 and 1e7)",
    ),
    Argument(
        "gamma",
        Nullable(Real(0, 1e9, low_open=True)),
        None,
        "norm Gamma of every uploaded update (the paper: a constant per dataset); null = the median norm of the "
        "round's raw updates",
    ),
)
R = "fairfl.methods.rewards.controller"
CONTROLLERS = {
    f"{R}.RewardController": ControllerArguments(),
    f"{R}.CFFLController": ControllerArguments(CFFL),
    f"{R}.CGSVController": ControllerArguments(CGSV),
}
