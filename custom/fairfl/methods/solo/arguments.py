"""Solo's job arguments (fairfl.methods.solo.controller.SoloController): the round's alone."""

from fairfl.methods.spec import ControllerArguments

CONTROLLERS = {"fairfl.methods.solo.controller.SoloController": ControllerArguments()}
