"""FedCE's task fields: the weights the server averaged the global model with, and the site's leave-one-out error."""

# server -> site
LOO_WEIGHTS = "loo_weights"  # train: {site: its weight in the global model sent}; asks for the LOO error

# site -> server
LOO_ERROR = "loo_error"  # 1 - Dice (classification: 1 - balanced accuracy) of the leave-one-out model on the
# validation split
