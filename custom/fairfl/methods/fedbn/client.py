"""FedBN's site side: the site's own normalisation layers on every model it trains or is scored with."""

from __future__ import annotations

from fairfl.kinds import Boolean
from fairfl.methods.fedbn.protocol import LOCAL_NORM
from fairfl.methods.local_parts import KeepPartLocal
from fairfl.models import norm_state_keys


class LocalNorm(KeepPartLocal):
    """FedBN (meta[LOCAL_NORM]): the model sent carries this site's own normalisation layers once it has trained
    them, and they are left out of what the site sends back."""

    meta_key = LOCAL_NORM
    fields = {meta_key: Boolean()}
    part_keys = staticmethod(norm_state_keys)
