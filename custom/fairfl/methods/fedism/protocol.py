"""FedISM(+)'s task fields: SALT's search distance and alpha, and SAGA's sharpness probe and its report."""

# server -> site
SALT_RHO = "salt_rho"  # train with GSAM (SALT) at this search distance ...
SALT_ALPHA = "salt_alpha"  # ... and this surrogate-gap weight alpha
SHARPNESS_RHO = "sharpness_rho"  # before training, measure the sharpness of the model sent at this rho

# site -> server
SHARPNESS = "sharpness"  # {"loss", "perturbed_loss", "sharpness", "rho", "grad_norm", "samples"}
