"""APFL's task fields and what a site keeps of it: the mixing weight it starts from, alpha's step size, and the site's
personal model with its learned alpha."""

# server -> site
APFL_ALPHA_INIT = "apfl_alpha_init"  # every task: train the site's personal model v and mixing weight alpha beside the
# model sent (train), score their mix (validate, EVALUATE FROM_PERSONAL); alpha's start, before the site's first round
APFL_ALPHA_LR = "apfl_alpha_lr"  # train: alpha's step size; absent: the site's learning rate; 0: alpha stays

# what a site keeps between rounds (fairfl.flare.site_state): {"round", "model": its personal model v, "alpha": its
# mixing weight} after its last round, and the round before
PERSONAL_MODEL_FILE = "apfl_personal_model.pt"
PREVIOUS_PERSONAL_MODEL_FILE = "apfl_personal_model_previous.pt"
PERSONAL_MODEL_FILES = (PERSONAL_MODEL_FILE, PREVIOUS_PERSONAL_MODEL_FILE)
