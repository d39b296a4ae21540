"""What a model version that ``/v1`` serves must pass when it loads, and the graph it loads then.

The registry runs these checks on every version it loads (``ModelRegistry``'s ``checks``), on
the loading thread, before the version is warmed: a model that would always answer 409 or 400
fails to load instead, with the reason. An inference graph's catalogue, index and encoder are
read here too, once, not per request; the pipeline finds them with :meth:`VersionChecks.graph`.
Built before the registry (it needs none), so the registry takes it through its constructor.
"""

from __future__ import annotations

from redline.config import Settings
from redline.errors import ModelNotReady
from redline.features.definitions import FeatureDefinitions
from redline.features.online.base import OnlineStore
from redline.models import ModelRepository
from redline.models.graph import GraphSpec
from redline.serving.handle import ModelHandle
from redline.serving.predict.graph import GraphRunner
from redline.serving.predict.latency import LatencyWindow


class VersionChecks:
    """The feature checks and graph loading of loaded versions (a ``registry.LoadChecks``)."""

    def __init__(self, settings: Settings, definitions: FeatureDefinitions | None,
                 store: OnlineStore | None, repository: ModelRepository | None) -> None:
        self.settings = settings
        self.defs = definitions
        self.store = store
        self.repository = repository  # where a graph's files are (None: no graph loads)
        # id(handle) -> the handle (held, so its id is not reused) and its loaded graph
        self._graphs: dict[int, tuple[ModelHandle, GraphRunner]] = {}

    def admit(self, handle: ModelHandle) -> None:
        """Pinned view versions must be the live ones, NaN defaults must meet a model that
        allows NaN; a graph loads its parts."""
        meta = handle.metadata
        if isinstance(meta.extra, dict) and "graph" in meta.extra:
            self._load_graph(handle)
            return
        names = meta.feature_names or []
        if self.defs is None or not (meta.feature_views or any(
                ":" in n or n in self.defs.transforms for n in names)):
            return
        from redline.features.versioning import check_model_features

        check_model_features(meta.name, names, meta.feature_views, meta.missing_values,
                             self.defs)

    def retired(self, handle: ModelHandle) -> None:
        """``handle`` no longer serves (swapped out, unloaded, or it failed to warm)."""
        entry = self._graphs.pop(id(handle), None)
        if entry is not None:
            entry[1].close()

    def graph(self, handle: ModelHandle) -> GraphRunner | None:
        """The graph ``handle`` loaded, or None: not a graph."""
        entry = self._graphs.get(id(handle))
        return entry[1] if entry is not None else None

    def _load_graph(self, handle: ModelHandle) -> None:
        """Load an inference graph's catalogue, index and encoder (at load, not per request)."""
        if self.repository is None:
            raise ModelNotReady(f"model '{handle.name}' is a graph, which needs a repository")
        spec = GraphSpec.from_dict(handle.metadata.extra["graph"])
        folder = self.repository.version_dir(handle.name, handle.version)
        cfg = self.settings.pipeline
        runner = GraphRunner(folder, spec, handle.name,
                             LatencyWindow(cfg.latency_window, cfg.latency_window_s,
                                           cfg.probe_interval_ms / 1000.0),
                             self.settings.batching_for(handle.name))
        runner.read_entity(self.store, self.defs, handle)
        runner.batch_ranker(handle)
        self._graphs[id(handle)] = (handle, runner)
