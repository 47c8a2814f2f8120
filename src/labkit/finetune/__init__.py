"""Your fine-tune: a learner's own model and data audited, planned, measured, laddered and recommended (`Finetune`)."""

from .audit import Audit, audit_examples, packing_leak
from .ladder import FinetuneLadder, climb
from .measure import Measurement, RankMeasurement, measure_methods, measure_ranks
from .plan import Plan, make_plan
from .recommend import Recommendation, recommend_from
from .session import Finetune
from .target import Target, parse_target

__all__ = ["Audit", "Finetune", "FinetuneLadder", "Measurement", "Plan", "RankMeasurement", "Recommendation", "Target",
           "audit_examples", "climb", "make_plan", "measure_methods", "measure_ranks", "packing_leak", "parse_target",
           "recommend_from"]
