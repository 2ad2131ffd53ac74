"""Fed-LWR's job arguments (fairfl.methods.fedlwr.controller.FedLWRController), besides the round's."""

from fairfl.argument import Argument
from fairfl.kinds import Integer, ListOf, Nullable, OneOf, Real
from fairfl.methods.spec import ControllerArguments

# the sample each site measures CKA on, sent with the cka task: its fields (fairfl.methods.fedlwr.protocol) are named
# as these arguments, and a site accepts what they accept (fairfl.methods.fedlwr.client)
CKA_SAMPLE = (
    Argument(
        "cka_split",
        OneOf(("training", "validation")),
        "training",
        "the split Fed-LWR samples CKA's images from, drawn afresh every round",
    ),
    # fairfl.methods.fedlwr.cka.MIN_BATCH: the unbiased HSIC needs 4 samples
    Argument(
        "cka_max_samples",
        Integer(4, 100_000),
        64,
        "Fed-LWR measures CKA on a random sample of at most this many images of the site's cka_split",
    ),
    Argument(
        "cka_batch_size",
        Integer(4, 4096),
        32,
        "Fed-LWR's CKA minibatch (at least 4, for the unbiased HSIC; docs/methods/fedlwr.md: measured against 8, 64)",
    ),
    Argument(
        "cka_max_positions",
        Integer(1, 10_000_000),
        4096,
        "3-D networks: CKA reads each layer's output at most at this many voxel positions, the same random ones in "
        "both models, so its memory stays flat however large the feature maps (docs/methods/fedlwr.md: measured); "
        "2-D feature maps are read whole",
    ),
)
FEDLWR = (
    Argument(
        "cka_clip",
        Nullable(ListOf(Real(0, 1), 2, 2, increasing=True)),
        None,
        "[low, high] to clip CKA to before Eq. 5 (the authors' code: [1e-4, 0.99]); null = no clip, as in the paper's "
        "equations",
    ),
    *CKA_SAMPLE,
)
# the anchor is the sites' plain mean (1/K: the paper's Eq. 1 and the authors' code)
CONTROLLERS = {
    "fairfl.methods.fedlwr.controller.FedLWRController": ControllerArguments(FEDLWR, defaults={"weighting": "uniform"})
}
