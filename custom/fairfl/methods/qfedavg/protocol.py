"""q-FedAvg's task fields: the loss of the model sent, asked for and reported (FedISM's probe measures it)."""

from fairfl.kinds import Real
from fairfl.site_checks import MAX_REPORTED

# server -> site
MEASURE_LOSS = "measure_loss"  # before training, measure the loss of the model sent (True)

# site -> server
GLOBAL_LOSS = "global_loss"  # mean loss of the model sent over the site's training set
GLOBAL_LOSS_KIND = Real(0.0, MAX_REPORTED)  # what a server reading it accepts (q-FedAvg's, AFL's)
