"""Use cases written against the ports: the scheduler side and the worker side of the tier."""

from ec_connector.application.scheduler import TierScheduler
from ec_connector.application.stats import Occupancy, TierStats
from ec_connector.application.worker import TierWorker

__all__ = ["Occupancy", "TierScheduler", "TierStats", "TierWorker"]
