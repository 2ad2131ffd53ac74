"""FedProx's task field: the weight of the proximal term."""

# server -> site
PROX_MU = "prox_mu"  # add (mu / 2) ||w - w_sent||^2 to the local loss
