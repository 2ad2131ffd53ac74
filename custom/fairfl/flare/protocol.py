"""Names shared by the server controllers and the client executor: task names and task-meta keys."""

import os

from fairfl.names import safe_name

TASK_TRAIN = "train"
TASK_VALIDATE = "validate"
TASK_CKA = "cka"

# server -> site
TASK = "task"  # "segmentation" or "classification": which loaders, loss and metrics a site uses
MODEL_SPEC = "model_spec"  # dict understood by fairfl.models.build_model
DATASET = "dataset"  # which built-in dataset (fairfl.data.builtin) a site without a data root uses
NUM_SITES = "num_sites"  # how many sites the built-in data must have
DATA_SEED = "data_seed"  # seed of the built-in data
TEST_SCALE = "test_scale"  # the built-in data's test splits hold this many times their items (1 to 20; absent: 1)
LOO_WEIGHTS = "loo_weights"  # FedCE: {site: its weight in the global model sent}; asks for the LOO error
START_FROM = "start_from"  # train from FROM_GLOBAL (the params sent) or FROM_LOCAL (the site's own model)
EVALUATE = "evaluate"  # evaluate FROM_GLOBAL or FROM_LOCAL
SEND_PARAMS = "send_params"  # whether the site returns its trained weights
FROM_GLOBAL, FROM_LOCAL = "global", "local"
FROM_PERSONAL = "personal"  # EVALUATE only: the site's Ditto personal model (PERSONAL_MODEL_FILE); a site that
# has none yet (never trained) is scored with the model sent, Ditto's v_k start
SCORE_GLOBAL = "score_global"  # validate: a site scored with a model of its own also scores the model sent, as it
# is, and reports those metrics prefixed fairfl.results.GLOBAL_PREFIX (global_dice, ...) beside its own
HELD_OUT = "held_out"  # validate: the sites held out of training (exclude_sites); such a site scores the model sent as
# it is, never a model of its own (a personal model, a kept head or normalisation layers)
SUBMIT_MODEL = "submit_model"  # validate (cross-site evaluation): the site returns the model it is scored with, as
# its params, instead of scores
SALT_RHO = "salt_rho"  # FedISM(+): train with GSAM (SALT) at this search distance ...
SALT_ALPHA = "salt_alpha"  # ... and this surrogate-gap weight alpha
SHARPNESS_RHO = "sharpness_rho"  # FedISM(+): before training, measure the sharpness of the model sent at this rho
MEASURE_LOSS = "measure_loss"  # q-FedAvg: before training, measure the loss of the model sent (True)
NPR = "npr"  # FedNPR: {"k", "weight", "epsilon", "iterations", "temperature"}: train with
# balanced softmax + weight * NPR on prototypes of the model sent
PROX_MU = "prox_mu"  # FedProx: add (mu / 2) ||w - w_sent||^2 to the local loss
DITTO_LAMBDA = "ditto_lambda"  # Ditto: after training the model sent, also train the site's personal model v on
# loss(v) + (lambda / 2) ||v - w_sent||^2 (kept in PERSONAL_MODEL_FILE)
MIX_GRID = "mix_grid"  # FedFloor: validate scores the mix (1 - a) w_sent + a v (the personal model) for every a of
# this list on the validation split, and is scored with the best (fairfl.methods.fedfloor)
PERSONAL_HEAD = "personal_head"  # FedNPR-Per: the site trains and is evaluated with its own classifier head
LOCAL_NORM = "local_norm"  # FedBN: the site trains and is evaluated with its own normalisation layers
RUN_NAME = "run_name"  # a named (resumable) run: sites keep their state in run_state_dir(...) of it
OPTIMIZER = "optimizer"  # {"name": "adam" or "sgd", "momentum", "keep_state"}: the local optimiser; keep_state
# carries its state (Adam's moments) from round to round (OPTIMIZER_STATE_FILE)
VALIDATE_TRAINED = "validate_trained"  # CFFL: after training, score the trained model on the validation split (True)

# site -> server
NUM_SAMPLES = "num_samples"
NUM_STEPS = "num_steps"
CKA = "cka"  # {layer name: CKA(local, anchor)}
LOO_ERROR = "loo_error"  # FedCE: 1 - Dice (classification: 1 - balanced accuracy) of the leave-one-out
# model on the validation split
SHARPNESS = "sharpness"  # FedISM(+): {"loss", "perturbed_loss", "sharpness", "rho", "grad_norm", "samples"}
GLOBAL_LOSS = "global_loss"  # q-FedAvg: mean loss of the model sent over the site's training set
LR = "lr"  # the site's local learning rate (q-FedAvg's L = 1 / lr)
VAL_METRIC = "val_metric"  # CFFL: Dice (classification: balanced accuracy) of the trained model on the
# validation split; None when it cannot be scored
FREE_RIDER = "free_rider"  # training metric 1.0: this site is a free rider (its own test switch, the FedCE
# paper's Fig. 4: the site's FAIRFL_FREE_RIDERS)

# what a site keeps between rounds (fairfl.flare.site_state): {"round", ...} after its last round, and the round before
LOCAL_MODEL_FILE = "local_model.pt"  # the site's model after its local training, {"round", "model"} ...
PREVIOUS_LOCAL_MODEL_FILE = "local_model_previous.pt"  # ... (Solo, FedCE, Fed-LWR, the parts FedBN/FedNPR-Per keep)
PERSONAL_MODEL_FILE = "ditto_personal_model.pt"  # Ditto: the site's personal model v_k, {"round", "model"} ...
PREVIOUS_PERSONAL_MODEL_FILE = "ditto_personal_model_previous.pt"
OPTIMIZER_STATE_FILE = "optimizer_state.pt"  # the site's optimiser state (keep_state), {"round", "optimizer", ...}
PREVIOUS_OPTIMIZER_STATE_FILE = "optimizer_state_previous.pt"
LOCAL_MODEL_FILES = (LOCAL_MODEL_FILE, PREVIOUS_LOCAL_MODEL_FILE)
PERSONAL_MODEL_FILES = (PERSONAL_MODEL_FILE, PREVIOUS_PERSONAL_MODEL_FILE)
OPTIMIZER_STATE_FILES = (OPTIMIZER_STATE_FILE, PREVIOUS_OPTIMIZER_STATE_FILE)

STATE_ROOT_ENV = "FAIRFL_STATE_ROOT"


def run_state_dir(workspace_root: str, participant: str, run_name: str) -> str:
    """Where the server's checkpoint or a site's state of the named run `run_name` lives: outside the job's run
    directory, so a resubmitted job (a new job id after a server restart) finds it. Default
    `<participant's workspace>/fairfl_runs/<run_name>`; FAIRFL_STATE_ROOT moves it to `<root>/<participant>/<run_name>`
    (the simulator wipes its workspace at every start). Both names must be safe names (fairfl.names): the run name
    comes from the job and, on a site, from the server's task."""
    participant, run_name = safe_name(participant, "participant name"), safe_name(run_name, "run_name")
    root = os.environ.get(STATE_ROOT_ENV)
    if root:
        return os.path.join(root, participant, run_name)
    return os.path.join(workspace_root, "fairfl_runs", run_name)
