"""Names shared by the server controllers and the client executor: task names and task-meta keys."""

TASK_TRAIN = "train"
TASK_VALIDATE = "validate"
TASK_CKA = "cka"

# server -> site
MODEL_SPEC = "model_spec"        # dict understood by fairfl.models.build_model
NUM_SITES = "num_sites"          # how many sites the built-in data must have
DATA_SEED = "data_seed"          # seed of the built-in data
START_FROM = "start_from"        # train from FROM_GLOBAL (the params sent) or FROM_LOCAL (the site's own model)
EVALUATE = "evaluate"            # evaluate FROM_GLOBAL or FROM_LOCAL
SEND_PARAMS = "send_params"      # whether the site returns its trained weights
FROM_GLOBAL, FROM_LOCAL = "global", "local"

# site -> server
NUM_SAMPLES = "num_samples"
NUM_STEPS = "num_steps"
CKA = "cka"                      # {layer name: CKA(local, anchor)}

LOCAL_MODEL_FILE = "local_model.pt"
