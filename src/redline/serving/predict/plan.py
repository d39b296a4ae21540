"""The route plan: which model (and fallback) serves, and where each input column comes from.

A model's ``feature_names`` say where each input column comes from: ``view:feature`` is an online
feature, a transform's name is that transform, ``session:<counter>`` a session counter, anything
else a request field. Its ``feature_views`` pin view versions; serving it against other live
versions is refused (:class:`~redline.errors.VersionMismatch`, from the one check in
``features.versioning``), never silently skewed.
"""

from __future__ import annotations

import numpy as np

from redline.errors import FeatureNotFound, InvalidInput
from redline.features.definitions import FeatureDefinitions, FeatureView, RequestTransform
from redline.features.online.base import FeatureReader, OnlineStore
from redline.features.versioning import check_missing_policy, check_model_views
from redline.models.datatypes import V2_TO_NUMPY
from redline.serving.handle import ModelHandle

SESSION_PREFIX = "session:"

# One input column: ("feature", "view:feature") | ("request", field) | ("session", counter)
# | ("transform", RequestTransform).
Column = tuple[str, "str | RequestTransform"]


class ModelPlan:
    """How one model version's input row is built from features, transforms, session, request."""

    def __init__(self, handle: ModelHandle, defs: FeatureDefinitions | None) -> None:
        meta = handle.metadata
        self.handle = handle
        names = meta.feature_names
        if not names:
            raise InvalidInput(
                f"model '{meta.name}' version {meta.version} records no feature_names, so /v1 "
                "cannot assemble its input; register it with feature_names (or use /v2 infer)"
            )
        specs = handle.session.inputs
        if len(specs) != 1 or len(specs[0].shape) != 2:
            raise InvalidInput(
                f"model '{meta.name}' must have one 2-D input [rows, features] to serve on /v1; "
                f"it has {[t.to_dict() for t in specs]}"
            )
        self.input_name = specs[0].name
        self.dtype = V2_TO_NUMPY[specs[0].datatype]
        check_model_views(meta.name, meta.feature_views,
                          defs.versions() if defs is not None else {})
        if defs is not None:
            check_missing_policy(meta.name, names, meta.missing_values, defs)
        self.features: list[str] = []  # "view:feature" refs this model reads
        self.columns: list[Column] = []
        self.request_fields: list[str] = []
        self.views: dict[str, FeatureView] = {}
        transforms = defs.transforms if defs is not None else {}
        for name in names:
            if name in transforms:
                t = transforms[name]
                for ref in t.features:
                    self._feature(ref, defs)
                for f in t.request:
                    self._field(f)
                self.columns.append(("transform", t))
            elif name.startswith(SESSION_PREFIX):
                self.columns.append(("session", name[len(SESSION_PREFIX):]))
            elif ":" in name:
                self._feature(name, defs)
                self.columns.append(("feature", name))
            else:
                self._field(name)
                self.columns.append(("request", name))
        self.width = len(names)
        self.classification = meta.task == "classification"
        self.output_names = handle.output_names

    def _feature(self, ref: str, defs: FeatureDefinitions | None) -> None:
        if defs is None:
            raise FeatureNotFound(
                f"model '{self.handle.name}' reads feature '{ref}' but no feature definitions "
                "are loaded; set features.definitions in redline.yaml"
            )
        view, _ = defs.resolve(ref)
        self.views[view.name] = view
        if ref not in self.features:
            self.features.append(ref)

    def _field(self, name: str) -> None:
        if name not in self.request_fields:
            self.request_fields.append(name)


class Route:
    """A primary model and its fallback: one reader over the views both need, entity key map."""

    def __init__(self, primary: ModelPlan, fallback: ModelPlan | None,
                 store: OnlineStore | None) -> None:
        self.primary = primary
        self.fallback = fallback
        plans = [primary] + ([fallback] if fallback is not None else [])
        views: dict[str, FeatureView] = {}
        for p in plans:
            views.update(p.views)
        self.views = list(views.values())
        self.reader: FeatureReader | None = (
            store.reader(self.views) if self.views and store is not None else None)
        refs = self.reader.plan.features if self.reader is not None else []
        self.col = {ref: i for i, ref in enumerate(refs)}
        self.defaults = (self.reader.plan.defaults[self.reader.plan.take].astype(np.float32)
                         if self.reader is not None else np.zeros(0, np.float32))
        # Entity key accepted in requests (join key or entity name) -> entity name.
        self.entity_names: list[str] = []
        self.keys: dict[str, str] = {}
        for v in self.views:
            ent = v.entity
            if ent.name not in self.entity_names:
                self.entity_names.append(ent.name)
            self.keys[ent.join_key] = ent.name
            self.keys[ent.name] = ent.name
        self.request_fields = list(dict.fromkeys(f for p in plans for f in p.request_fields))
        self.cache_key = (primary.handle.name, primary.handle.version,
                          fallback.handle.name if fallback else None,
                          fallback.handle.version if fallback else None)

    @property
    def model(self) -> str:
        return self.primary.handle.name
