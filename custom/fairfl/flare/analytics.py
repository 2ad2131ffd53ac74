"""The sites' accepted metrics as NVFlare's federated analytics events, fired on the server by the round engine, so
that NVFlare's receivers (TensorBoard, MLflow: fairfl.tracking) record exactly what results.json does; and each
evaluated round's fairness summary across sites as the series of one more source, `fairfl.tracking.SUMMARY_SOURCE`.
Steps are rounds as fairfl shows them to people, from 1 (`fairfl.progress.shown_round`)."""

from __future__ import annotations

from nvflare.apis.analytix import ANALYTIC_EVENT_TYPE, AnalyticsDataType
from nvflare.apis.fl_component import FLComponent
from nvflare.apis.fl_constant import FedEventHeader, ReservedKey
from nvflare.apis.utils.analytix_utils import create_analytic_dxo
from nvflare.app_common.widgets.convert_to_fed_event import FED_EVENT_PREFIX

from fairfl.progress import shown_round
from fairfl.results import site_key
from fairfl.tracking import SUMMARY_SOURCE, summary_series

FED_ANALYTIC_EVENT = FED_EVENT_PREFIX + ANALYTIC_EVENT_TYPE  # what NVFlare's receivers take from the sites


def fire_site_metrics(component: FLComponent, round_num: int, per_site: dict | None, train_metrics: dict) -> None:
    """Every site's accepted metrics of the round (training, then evaluation; each under its own name, the round as
    step) as NVFlare's federated analytics event from that site, fired by `component` on the server: never a rejected
    site's own numbers."""
    for site in sorted(set(per_site or {}) | set(train_metrics), key=site_key):
        _fire(component, site, round_num, {**train_metrics.get(site, {}), **(per_site or {}).get(site, {})})


def fire_round_summary(component: FLComponent, round_num: int, record: dict, metric: str) -> None:
    """The fairness summary results.json's round `record` holds for the main `metric` (mean, std, worst, best,
    spread, Gini: `fairfl.fairness.summarize`), as the series `<metric>_<statistic>` of SUMMARY_SOURCE; nothing for
    a round that was not evaluated."""
    _fire(component, SUMMARY_SOURCE, round_num, summary_series(record, metric))


def _fire(component: FLComponent, source: str, round_num: int, scalars: dict) -> None:
    """Each of `scalars` as an analytics event from `source`, looking as NVFlare delivers a site's event to the
    server (direction "in"), so it is recorded here and not sent on."""
    for name, value in scalars.items():
        step = shown_round(round_num)
        data = create_analytic_dxo(name, value, AnalyticsDataType.SCALAR, global_step=step).to_shareable()
        data.set_peer_props({ReservedKey.IDENTITY_NAME: source})
        data.set_header(FedEventHeader.DIRECTION, "in")
        with component.engine.new_context() as fl_ctx:
            component.fire_fed_event(FED_ANALYTIC_EVENT, data, fl_ctx)
