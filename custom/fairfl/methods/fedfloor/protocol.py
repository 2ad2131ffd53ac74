"""FedFloor's task fields: the grid of mixes a site scores and, guarded, how far a mix must stand out."""

# server -> site
MIX_GRID = "mix_grid"  # validate scores the mix (1 - a) w_sent + a v (Ditto's personal model) for every a of this
# list on the validation split, and is scored with the best (fairfl.methods.fedfloor.mixing)
MIX_GUARD = "mix_guard"  # present and > 0: the site leaves the global model only for the mix whose validation gain
# minus this many standard errors of the gain is largest and above 0 (mixing.choose_alpha_guarded); absent: the best
