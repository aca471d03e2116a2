"""Demand: bounded request features in, per-model desired replica counts out.

Public API: :class:`DemandTracker`, :class:`ModelDemand`, :class:`ForecastPolicy`,
:class:`DemandSeries`, :class:`Forecast`.
"""

from grid_core.demand.features import RequestFeatures
from grid_core.demand.series import Bucket, DemandSeries, Forecast, ForecastPolicy
from grid_core.demand.tracker import DemandTracker
from grid_core.demand.types import ModelDemand, Watermark

__all__ = [
    "Bucket",
    "DemandSeries",
    "DemandTracker",
    "Forecast",
    "ForecastPolicy",
    "ModelDemand",
    "RequestFeatures",
    "Watermark",
]
