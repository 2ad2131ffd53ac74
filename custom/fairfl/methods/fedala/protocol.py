"""FedALA's task fields and what a site keeps of it: ALA's settings, and the site's element-wise aggregation weights.
The task fields are the job arguments of the same names (arguments.py, FEDALA), sent in every task. (The site's local
model theta_i is the executor's own, fairfl.flare.protocol.LOCAL_MODEL_FILE.)"""

# server -> site
FEDALA_LAYERS = "fedala_layers"  # every task: start training from theta_hat (train), score theta_hat (validate,
# EVALUATE FROM_PERSONAL); theta_hat mixes the site's local model in on this many top parameter tensors (the paper's p)
FEDALA_ETA = "fedala_eta"  # W's step size (the paper's eta)
FEDALA_RAND_PERCENT = "fedala_rand_percent"  # W is learned on this percentage of the site's training items (s)
FEDALA_THRESHOLD = "fedala_threshold"  # the start phase ends when the std of the last passes' losses is below it ...
FEDALA_WINDOW = "fedala_window"  # ... over this many passes ...
FEDALA_MAX_PASSES = "fedala_max_passes"  # ... or after this many passes

# what a site keeps between rounds (fairfl.flare.site_state): {"round", "weights": {parameter name: W}} after its
# ALA of a round, and the round before
WEIGHTS_FILE = "fedala_weights.pt"
PREVIOUS_WEIGHTS_FILE = "fedala_weights_previous.pt"
WEIGHTS_FILES = (WEIGHTS_FILE, PREVIOUS_WEIGHTS_FILE)
