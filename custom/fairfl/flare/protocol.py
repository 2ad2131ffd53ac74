"""Names shared by the server controllers and the client executor: task names and task-meta keys."""

TASK_TRAIN = "train"
TASK_VALIDATE = "validate"
TASK_CKA = "cka"

# server -> site
MODEL_SPEC = "model_spec"        # dict understood by fairfl.models.build_model
DATASET = "dataset"              # which built-in dataset (fairfl.data.builtin) a site without a data root uses
NUM_SITES = "num_sites"          # how many sites the built-in data must have
DATA_SEED = "data_seed"          # seed of the built-in data
FREE_RIDERS = "free_riders"      # {free rider: site whose one image it repeats} (the FedCE paper's Fig. 4)
LOO_WEIGHTS = "loo_weights"      # FedCE: {site: its weight in the global model sent}; asks for the LOO error
START_FROM = "start_from"        # train from FROM_GLOBAL (the params sent) or FROM_LOCAL (the site's own model)
EVALUATE = "evaluate"            # evaluate FROM_GLOBAL or FROM_LOCAL
SEND_PARAMS = "send_params"      # whether the site returns its trained weights
FROM_GLOBAL, FROM_LOCAL = "global", "local"

# site -> server
NUM_SAMPLES = "num_samples"
NUM_STEPS = "num_steps"
CKA = "cka"                      # {layer name: CKA(local, anchor)}
LOO_ERROR = "loo_error"          # FedCE: 1 - Dice of the leave-one-out model on the validation split

LOCAL_MODEL_FILE = "local_model.pt"
