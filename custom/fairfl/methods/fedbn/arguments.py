"""FedBN's job arguments (fairfl.methods.fedbn.controller.FedBNController): the round's alone."""

from fairfl.methods.spec import ControllerArguments

CONTROLLERS = {"fairfl.methods.fedbn.controller.FedBNController": ControllerArguments()}
