"""fairfl: fair federated learning for medical imaging on NVIDIA FLARE."""

__version__ = "0.1.0"
