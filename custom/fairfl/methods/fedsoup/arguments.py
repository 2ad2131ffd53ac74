"""FedSoup's job arguments (fairfl.methods.fedsoup.controller.FedSoupController), besides the round's."""

from fairfl.argument import Argument
from fairfl.kinds import Real
from fairfl.methods.spec import ControllerArguments

START = Real(0, 1)

FEDSOUP = (
    Argument(
        "fedsoup_start",
        START,
        0.75,
        "the share of the run's rounds before the sites start their soups: a site's soup step runs in every round r "
        "(counted from 0) from floor(fedsoup_start x num_rounds) on, the last quarter of the rounds at 0.75 (the "
        "authors' code's wa_alpha); 0 = from the first round; 1 = never (every site is scored with its local model)",
    ),
)
CONTROLLERS = {"fairfl.methods.fedsoup.controller.FedSoupController": ControllerArguments(FEDSOUP)}
