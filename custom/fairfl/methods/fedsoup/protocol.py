"""FedSoup's task field and what a site keeps of it: the round its soup starts, and the soup itself. (The site's local
model is the executor's own, fairfl.flare.protocol.LOCAL_MODEL_FILE.)"""

# server -> site
FEDSOUP_START_ROUND = "fedsoup_start_round"  # every task: from this round on (counted from 0) the site's `train`
# offers the model sent to its soup after its local training; `validate` (EVALUATE FROM_PERSONAL) scores the site's
# local model averaged with its soup (before the soup starts: its local model alone)

# what a site keeps between rounds (fairfl.flare.site_state): {"round", "soup": {tensor name: the mean of the global
# models in the soup} ({} while it is empty), "ingredients": [the rounds whose global models are in it]} after its
# soup step of a round, and the round before
SOUP_FILE = "fedsoup_soup.pt"
PREVIOUS_SOUP_FILE = "fedsoup_soup_previous.pt"
SOUP_FILES = (SOUP_FILE, PREVIOUS_SOUP_FILE)
