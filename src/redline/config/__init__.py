"""``redline.yaml`` → typed settings.

Loading is strict: an unknown key or a value of the wrong type is a :class:`ConfigError` that
names the key path and the line of the file, because a typo in a latency setting silently falling
back to a default is worse than a refusal to start.

Three layers, later ones win: the defaults (:mod:`redline.config.settings`, every default in one
place), ``redline.yaml``, then environment variables ``REDLINE_<SECTION>__<KEY>``
(``REDLINE_SERVER__HTTP_PORT=9000``, ``REDLINE_FEATURES__REDIS_URL=...``,
``REDLINE_MODELS__FRAUD__SLO_MS=20``; a top-level key is ``REDLINE_REPOSITORY``); values are read
as YAML, so ``[1, 8]`` is a list. Command-line options win over all three.

Paths (fields whose metadata says ``path``) in a ``redline.yaml`` resolve relative to that file,
so ``redline serve --config examples/fraud/redline.yaml`` works from any folder. The model
repository and the feature registry default to ``models/`` and ``features/`` in one project
folder, ``.redline`` next to the file (or in the current folder without one).

- :mod:`~redline.config.settings`: the settings classes, one per area, with their defaults;
- :mod:`~redline.config.rules`: what a numeric or named setting accepts;
- :mod:`~redline.config.typed`: a YAML node → a typed settings object, strictly;
- :mod:`~redline.config.loading`: finding and loading the file, its paths, the project folder;
- :mod:`~redline.config.overrides`: the environment and command-line layers.
"""

from redline.config.loading import DEFAULT_CONFIG_FILE, load_settings
from redline.config.overrides import ENV_PREFIX, apply_env, apply_serve_options
from redline.config.rules import (
    AT_LEAST_0,
    AT_LEAST_1,
    PORT,
    POSITIVE,
    SHARE,
    OneOf,
    Range,
    Rules,
)
from redline.config.settings import (
    BatchingSettings,
    CacheSettings,
    FeatureSettings,
    ModelSettings,
    MonitoringSettings,
    OptimizeSettings,
    PipelineSettings,
    RuntimeSettings,
    ScalingSettings,
    ServerSettings,
    Settings,
)

__all__ = [
    "AT_LEAST_0", "AT_LEAST_1", "DEFAULT_CONFIG_FILE", "ENV_PREFIX", "PORT", "POSITIVE", "SHARE",
    "BatchingSettings", "CacheSettings", "FeatureSettings", "ModelSettings",
    "MonitoringSettings", "OneOf", "OptimizeSettings", "PipelineSettings", "Range", "Rules",
    "RuntimeSettings", "ScalingSettings", "ServerSettings", "Settings", "apply_env",
    "apply_serve_options", "load_settings",
]
