"""FedBN's task field."""

# server -> site
LOCAL_NORM = "local_norm"  # the site trains and is evaluated with its own normalisation layers
