"""q-FedAvg's task fields: the loss of the model sent, asked for and reported (FedISM's probe measures it)."""

# server -> site
MEASURE_LOSS = "measure_loss"  # before training, measure the loss of the model sent (True)

# site -> server
GLOBAL_LOSS = "global_loss"  # mean loss of the model sent over the site's training set
