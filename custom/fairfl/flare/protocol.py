"""Names shared by the server controllers and the client executor: the task names and task-meta keys every method
uses, and where a site keeps its state. A method's own keys are its unit's (fairfl.methods.<name>.protocol)."""

import os

from fairfl.names import safe_name

TASK_TRAIN = "train"
TASK_VALIDATE = "validate"
# a method's own site tasks (fairfl.methods.steps.MethodTask) and its own task fields live in its unit
# (fairfl.methods.<name>.protocol)

# server -> site
TASK = "task"  # "segmentation" or "classification": which loaders, loss and metrics a site uses
MODEL_SPEC = "model_spec"  # dict understood by fairfl.models.build_model
DATASET = "dataset"  # which built-in dataset (fairfl.data.builtin) a site without a data root uses
NUM_SITES = "num_sites"  # how many sites the built-in data must have
DATA_SEED = "data_seed"  # seed of the built-in data
TEST_SCALE = "test_scale"  # the built-in data's test splits hold this many times their items (1 to 20; absent: 1)
START_FROM = "start_from"  # train from FROM_GLOBAL (the params sent) or FROM_LOCAL (the site's own model)
EVALUATE = "evaluate"  # evaluate FROM_GLOBAL, FROM_LOCAL or FROM_PERSONAL
SEND_PARAMS = "send_params"  # whether the site returns its trained weights
FROM_GLOBAL, FROM_LOCAL = "global", "local"
FROM_PERSONAL = "personal"  # EVALUATE only: a model of the site's own that a method's step keeps and scores
# (fairfl.methods.steps: `evaluated_model`); a site that has none yet is scored with the model sent
SCORE_GLOBAL = "score_global"  # validate: a site scored with a model of its own also scores the model sent, as it
# is, and reports those metrics prefixed fairfl.results.GLOBAL_PREFIX (global_dice, ...) beside its own
HELD_OUT = "held_out"  # validate: the sites held out of training (exclude_sites); such a site scores the model sent as
# it is, never a model of its own (a kept part of the model or a model a method keeps beside it)
SUBMIT_MODEL = "submit_model"  # validate (cross-site evaluation): the site returns the model it is scored with, as
# its params, instead of scores
PREPROCESSING = "preprocessing"  # a MONAI bundle's pre-processing (fairfl.bundle), in place of fairfl's normalisation
RUN_NAME = "run_name"  # a named (resumable) run: sites keep their state in run_state_dir(...) of it
OPTIMIZER = "optimizer"  # {"name": "adam" or "sgd", "momentum", "keep_state", "betas"}: the local optimiser;
# keep_state carries its state (Adam's moments) from round to round (OPTIMIZER_STATE_FILE); betas: Adam's
PRIVACY = "dp"  # {"epsilon", "delta", "clip", "rounds"}: train with DP-SGD for this budget over the run's rounds
# (fairfl.privacy); absent: no DP

# site -> server
NUM_SAMPLES = "num_samples"
NUM_STEPS = "num_steps"
LR = "lr"  # the site's local learning rate (a method may read it: an update's step size)
TEST_INFLUENCE = "test_influence"  # validate: {metric: {"cases", "values"}}: each test patient's influence on the
# site's score (fairfl.uncertainty.case_influence_record), so that comparisons count the test split's noise
FREE_RIDER = "free_rider"  # training metric 1.0: this site is a free rider (its own test switch, the site's
# FAIRFL_FREE_RIDERS)

# what a site keeps between rounds (fairfl.flare.site_state): {"round", ...} after its last round, and the round before
LOCAL_MODEL_FILE = "local_model.pt"  # the site's model after its local training, {"round", "model"} ...
PREVIOUS_LOCAL_MODEL_FILE = "local_model_previous.pt"  # ... (training from it, probes of it, the parts a site keeps)
OPTIMIZER_STATE_FILE = "optimizer_state.pt"  # the site's optimiser state (keep_state), {"round", "optimizer", ...}
PREVIOUS_OPTIMIZER_STATE_FILE = "optimizer_state_previous.pt"
LOCAL_MODEL_FILES = (LOCAL_MODEL_FILE, PREVIOUS_LOCAL_MODEL_FILE)
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
