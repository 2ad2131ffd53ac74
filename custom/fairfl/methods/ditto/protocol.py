"""Ditto's task field and what a site keeps of it: lambda, and the site's personal model (FedFloor scores it too)."""

# server -> site
DITTO_LAMBDA = "ditto_lambda"  # after training the model sent, also train the site's personal model v on
# loss(v) + (lambda / 2) ||v - w_sent||^2 (kept in PERSONAL_MODEL_FILE)

# what a site keeps between rounds (fairfl.flare.site_state): its personal model v_k, {"round", "model"}, after its
# last round, and the round before
PERSONAL_MODEL_FILE = "ditto_personal_model.pt"
PREVIOUS_PERSONAL_MODEL_FILE = "ditto_personal_model_previous.pt"
PERSONAL_MODEL_FILES = (PERSONAL_MODEL_FILE, PREVIOUS_PERSONAL_MODEL_FILE)
