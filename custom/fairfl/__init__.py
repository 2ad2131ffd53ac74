"""fairfl: fair federated learning for medical imaging on NVIDIA FLARE."""

import os

__version__ = "0.1.0"

# Several FLARE client processes with torch share a few cores; OpenMP threads that spin while waiting
# slowed such runs up to tenfold on our 2-core machine. Must be set before torch is first imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
