"""Fed-LWR's job arguments (fairfl.methods.fedlwr.controller.FedLWRController), besides the round's."""

from fairfl.argument import Argument
from fairfl.kinds import ListOf, Nullable, Real
from fairfl.methods.spec import ControllerArguments

FEDLWR = (
    Argument(
        "cka_clip",
        Nullable(ListOf(Real(0, 1), 2, 2, increasing=True)),
        None,
        "[low, high] to clip CKA to before Eq. 5 (the authors' code: [1e-4, 0.99]); null = no clip, as in the paper's "
        "equations",
    ),
)
# the anchor is the sites' plain mean (1/K: the paper's Eq. 1 and the authors' code)
CONTROLLERS = {
    "fairfl.methods.fedlwr.controller.FedLWRController": ControllerArguments(FEDLWR, defaults={"weighting": "uniform"})
}
