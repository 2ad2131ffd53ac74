"""FedALA's job arguments (fairfl.methods.fedala.controller.FedALAController), besides the round's."""

from fairfl.argument import Argument
from fairfl.kinds import Integer, Real
from fairfl.methods.spec import ControllerArguments

# what each argument may be: the job's, a site's task fields and fairfl.methods.fedala.adaptive's checks alike (W is
# clipped to [0, 1] whatever eta; a larger step only throws it from end to end)
LAYERS = Integer(1, 100_000)
ETA = Real(0, 1000.0)
RAND_PERCENT = Integer(1, 100)
THRESHOLD = Real(0, 100.0)
WINDOW = Integer(2, 1000)
MAX_PASSES = Integer(1, 1000)

FEDALA = (
    Argument(
        "fedala_layers",
        LAYERS,
        2,
        "the paper's p: how many parameter tensors, counted from the network's output end, each site's start mixes "
        "its local model into (theta_hat = theta_i + (theta - theta_i) W there; the global model theta below); 2 = "
        "the output layer's weight and bias, the authors' code's default; at most the network's number of parameter "
        "tensors",
    ),
    Argument(
        "fedala_eta",
        ETA,
        1.0,
        "step size of the element-wise aggregation weights W (the paper's eta, 1.0); 0 = W stays at 1: every site "
        "starts from the global model, as in FedAvg",
    ),
    Argument(
        "fedala_rand_percent",
        RAND_PERCENT,
        80,
        "the percentage of a site's training items W is learned on, drawn afresh each round from the site's seed "
        "(the paper's s, 80)",
    ),
    Argument(
        "fedala_threshold",
        THRESHOLD,
        0.01,
        "the site's first learning of W (the start phase) ends when the standard deviation of the last "
        "fedala_window passes' mean losses is below it (0.01, the paper's)",
    ),
    Argument(
        "fedala_window",
        WINDOW,
        10,
        "how many passes' losses the start phase's standard deviation is taken over (10, as in the authors' code)",
    ),
    Argument(
        "fedala_max_passes",
        MAX_PASSES,
        20,
        "the most passes over the sample in the start phase, whether or not the loss has settled (the paper has no "
        "cap); every later round makes one pass",
    ),
)
CONTROLLERS = {"fairfl.methods.fedala.controller.FedALAController": ControllerArguments(FEDALA)}
