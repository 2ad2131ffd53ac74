"""The sites' accepted metrics as NVFlare's federated analytics events, fired on the server by the round engine, so
that NVFlare's receivers (TensorBoard, MLflow: fairfl.tracking) record exactly what results.json does."""

from __future__ import annotations

from nvflare.apis.analytix import ANALYTIC_EVENT_TYPE, AnalyticsDataType
from nvflare.apis.fl_component import FLComponent
from nvflare.apis.fl_constant import FedEventHeader, ReservedKey
from nvflare.apis.utils.analytix_utils import create_analytic_dxo
from nvflare.app_common.widgets.convert_to_fed_event import FED_EVENT_PREFIX

from fairfl.results import site_key

FED_ANALYTIC_EVENT = FED_EVENT_PREFIX + ANALYTIC_EVENT_TYPE  # what NVFlare's receivers take from the sites


def fire_site_metrics(component: FLComponent, round_num: int, per_site: dict | None, train_metrics: dict) -> None:
    """Every site's accepted metrics of the round (training, then evaluation; each under its own name, the round as
    step) as NVFlare's federated analytics event from that site, fired by `component` on the server: never a rejected
    site's own numbers. The event looks as NVFlare delivers a site's event to the server (direction "in"), so it is
    not sent on."""
    for site in sorted(set(per_site or {}) | set(train_metrics), key=site_key):
        for name, value in {**train_metrics.get(site, {}), **(per_site or {}).get(site, {})}.items():
            data = create_analytic_dxo(name, value, AnalyticsDataType.SCALAR, global_step=round_num).to_shareable()
            data.set_peer_props({ReservedKey.IDENTITY_NAME: site})
            data.set_header(FedEventHeader.DIRECTION, "in")
            with component.engine.new_context() as fl_ctx:
                component.fire_fed_event(FED_ANALYTIC_EVENT, data, fl_ctx)
