"""One call that loads any model version: ONNX Runtime's session, or a Python model's runner.

The server loads every version through ``load_runner``; which engine runs it is decided here,
by what the version folder holds (``model.onnx``, ``model.py`` or a general ``graph.yaml``), and
nowhere else.
"""

from __future__ import annotations

from redline.config import RuntimeSettings
from redline.models.python.session import PythonSession
from redline.models.repository import ModelRepository
from redline.models.runner import ModelRunner
from redline.models.runtime import InferenceSession


def load_runner(
    repo: ModelRepository,
    name: str,
    version: int | str | None = None,
    settings: RuntimeSettings | None = None,
    *,
    python_runtime: str | None = None,
    python_workers: int | None = None,
) -> ModelRunner:
    """Load a version, its files checked against the sha256 recorded at ``add``.

    ``python_runtime`` (``thread`` or ``process``) and ``python_workers`` apply to a Python
    model only; unset, it runs as recorded at ``add``, else in this process.
    """
    meta = repo.metadata(name, version)
    if repo.is_dag(name, meta.version):
        from redline.models.dag.check import check_repository_steps
        from redline.models.dag.runner import DagRunner

        runner = DagRunner.load(meta, repo.version_dir(name, meta.version), settings,
                                lambda model, number: load_runner(repo, model, number, settings))
        try:
            check_repository_steps(meta, runner.spec, repo)
        except BaseException:
            runner.close()
            raise
        return runner
    if repo.is_python(name, meta.version):
        return PythonSession.load(meta, repo.version_dir(name, meta.version), settings,
                                  runtime=python_runtime, workers=python_workers)
    return InferenceSession.load(repo, name, meta.version, settings)
