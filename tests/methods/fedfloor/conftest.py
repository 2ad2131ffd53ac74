"""FedFloor's test fixtures."""

import pytest
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

from fairfl.flare.site_task import SiteTask
from fairfl.methods.fedfloor.controller import FedFloorController
from fairfl.models import initial_state

import helpers
from helpers import segmentation_task_meta

TINY = {"model_channels": [8, 16, 32], "model_strides": [2, 2], "num_rounds": 2}


@pytest.fixture
def trained(cache_dir, tmp_path):
    """site-2 after one FedFloor round (Ditto's personal step with lambda 0.1), and the model it was sent."""
    controller = FedFloorController(**TINY)
    meta = segmentation_task_meta(controller.model_spec())
    executor = helpers.tiny_executor()
    sent = initial_state(controller.model_spec(), 0)
    task = FLModel(params_type=ParamsType.FULL, params=sent, current_round=0, meta={**meta, **controller.train_meta(0)})
    executor._train(SiteTask.of("site-2", task), str(tmp_path))
    return executor, meta, sent, tmp_path
