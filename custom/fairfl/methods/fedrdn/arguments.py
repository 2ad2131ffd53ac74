"""FedRDN's job arguments (fairfl.methods.fedrdn.controller.FedRDNController): the round's alone (the paper's method
has no setting of its own)."""

from fairfl.methods.spec import ControllerArguments

CONTROLLERS = {"fairfl.methods.fedrdn.controller.FedRDNController": ControllerArguments()}
