"""FedFloor's task field: the grid of mixes a site scores."""

# server -> site
MIX_GRID = "mix_grid"  # validate scores the mix (1 - a) w_sent + a v (Ditto's personal model) for every a of this
# list on the validation split, and is scored with the best (fairfl.methods.fedfloor.mixing)
