"""General graphs: a model version made of named steps (models, Python functions, ensembles,
cascades) with fallbacks, declared in ``graph.yaml`` (``docs/graphs.md``).

``spec`` parses and checks the file, ``check`` adds a graph to the repository, ``runner`` loads
a version and ``execute`` is what one request through it does; the server runs the same
``execute`` with batchers and budgets (``serving/dag.py``).
"""

from redline.models.dag.execute import GraphRun, NotNow, Schedule, StepEnv, answer_now
from redline.models.dag.runner import DagRunner, model_source
from redline.models.dag.spec import ANSWERED_BY, DEGRADED, DagSpec, Step, is_dag, parse_dag

__all__ = [
    "ANSWERED_BY",
    "DEGRADED",
    "DagRunner",
    "DagSpec",
    "GraphRun",
    "NotNow",
    "Schedule",
    "Step",
    "StepEnv",
    "answer_now",
    "is_dag",
    "model_source",
    "parse_dag",
]
