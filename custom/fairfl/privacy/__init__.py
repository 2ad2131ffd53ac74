"""Record-level differential privacy of the model a site sends: DP-SGD (per-item gradient clipping, Gaussian noise,
Poisson subsampling) in the site's local training, with an RDP accountant (Opacus's). Plain functions, no FLARE.

`settings`: the three round arguments' kinds and the settings a site's task carries (no torch import, so the command
line checks a job without it); `accountant`: the noise multiplier for a budget and the budget spent; `dp_sgd`: the
private training loop that `fairfl.training.train_local` runs when a task asks for DP."""
