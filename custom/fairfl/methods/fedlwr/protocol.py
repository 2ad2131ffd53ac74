"""Fed-LWR's own site task and its fields: CKA of the site's local model to the anchor the server sends."""

TASK_CKA = "cka"  # after training: CKA(local model, anchor) per layer

# server -> site
CKA_SPLIT = "cka_split"  # the split the CKA sample is drawn from ...
CKA_MAX_SAMPLES = "cka_max_samples"  # ... at most this many of its images ...
CKA_BATCH_SIZE = "cka_batch_size"  # ... in minibatches of this size ...
CKA_MAX_POSITIONS = "cka_max_positions"  # ... reading 3-D feature maps at most at this many voxel positions

# site -> server
CKA = "cka"  # {layer name: CKA(local, anchor)}
