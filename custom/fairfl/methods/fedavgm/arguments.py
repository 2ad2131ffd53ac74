"""FedAvgM's job arguments (fairfl.methods.fedavgm.controller.FedAvgMController), besides the round's."""

from fairfl.argument import Argument
from fairfl.kinds import Real
from fairfl.methods.spec import ControllerArguments

FEDAVGM = (
    Argument(
        "server_momentum",
        Real(0, 1, high_open=True),
        0.9,
        "beta, the server's momentum of the averaged updates (0 = no momentum; the paper's grid reaches 0.997)",
    ),
    Argument(
        "server_lr",
        Real(0, 10, low_open=True),
        0.1,
        "eta, the server's step along the momentum; the paper finds the effective step eta / (1 - beta) near 1 works "
        "best, which 0.1 at beta 0.9 gives (server_momentum 0 with server_lr 1 is FedAvg)",
    ),
)
CONTROLLERS = {"fairfl.methods.fedavgm.controller.FedAvgMController": ControllerArguments(FEDAVGM)}
