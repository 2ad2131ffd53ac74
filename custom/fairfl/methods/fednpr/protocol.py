"""FedNPR's task fields: its objective's settings and FedNPR-Per's own classifier head."""

# server -> site
NPR = "npr"  # {"k", "weight", "epsilon", "iterations", "temperature", "logits"}: train with balanced softmax +
# weight * NPR on prototypes of the model sent
PERSONAL_HEAD = "personal_head"  # FedNPR-Per: the site trains and is evaluated with its own classifier head
