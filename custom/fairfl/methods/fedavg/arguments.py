"""FedAvg's job arguments (fairfl.methods.fedavg.controller.FedAvgController): the round's alone."""

from fairfl.methods.spec import ControllerArguments

CONTROLLERS = {"fairfl.methods.fedavg.controller.FedAvgController": ControllerArguments()}
