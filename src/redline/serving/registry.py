"""Which model versions are loaded, and hot swaps between them.

The registry mirrors the repository: every ``sync`` lists the models, asks the repository which
versions are live (its version policy, or ``models.<name>.version_policy`` in the config, plus
every alias target) and which one is the default (``production`` alias, else the latest). A new
version is loaded and warmed on a worker thread *beside* the old one; only when it is warm does
one dict assignment swap it in, so a request sees either the old table or the new one. Requests
hold the handle they started on, so in-flight work finishes on its version; a retired version
drains its queue before its thread is released. A version that fails to load or warm is recorded
with the reason (``failures``, shown by the repository index) and the old version keeps serving.
When nothing else serves a model (a fresh start with a tampered latest version under the default
``latest: 1`` policy), the newest intact version older than the wanted one is loaded and served,
with an error in the log, so one bad file never takes a model down while a good one is on disk.

Readiness (``readiness``): with ``server.strict_readiness`` (the default, as Triton's
``--strict-readiness``) the server is ready when every model in the repository serves; without
it, when every model that could load did. Either way a model that is not ready is named, with
why and what to do, in the not-ready answer and once in the log.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol

from redline.config import Settings
from redline.errors import ModelNotFound, ModelNotReady, RedlineError, VersionNotFound
from redline.models import ModelRepository, ModelRunner, VersionPolicy, load_runner
from redline.models.dag import DagRunner
from redline.models.repository import check_name
from redline.serving.handle import ModelHandle

log = logging.getLogger("redline.serving")


class HandleLookup(Protocol):
    """What the ``/v1`` pipeline asks of a registry: the handle serving a model (at a version,
    sticky to ``key`` under a rollout) and the loaded versions. :class:`ModelRegistry` is one;
    the warm-up's registry of twins (``serving/warmup.py``) is another."""

    def get(self, name: str, version: str | None = None, key: Any = None) -> ModelHandle: ...

    def loaded(self, name: str) -> list[ModelHandle]: ...


@dataclass
class _Plan:
    """What the repository says one model should look like."""

    versions: list[int] = field(default_factory=list)  # every version on disk
    live: list[int] = field(default_factory=list)
    aliases: dict[str, int] = field(default_factory=dict)  # incl. "latest"
    default: int | None = None
    error: str | None = None


class LoadChecks(Protocol):
    """What a loaded version must pass to serve (the ``/v1`` pipeline's feature-view and
    missing-value checks, ``predict/checks.py``): ``admit`` raising is a load failure, logged,
    not ready, with its reason; ``retired`` once the version no longer serves."""

    def admit(self, handle: ModelHandle) -> None: ...

    def retired(self, handle: ModelHandle) -> None: ...


class ModelRegistry:
    """Loaded model versions by name; ``get`` is the request path, ``sync`` the control path."""

    def __init__(self, repository: ModelRepository, settings: Settings,
                 checks: LoadChecks | None = None) -> None:
        self.repository = repository
        self.settings = settings
        self.checks = checks
        self._handles: dict[str, dict[int, ModelHandle]] = {}
        self._default: dict[str, ModelHandle] = {}
        self._versions: dict[str, list[int]] = {}
        self._aliases: dict[str, dict[str, int]] = {}
        self.failures: dict[tuple[str, int], str] = {}
        self.unloaded: set[str] = set()  # unloaded through the admin surface
        self._lock = asyncio.Lock()
        self._retiring: set[asyncio.Task[None]] = set()
        self._router: Any = None  # (name, key) -> ModelHandle | None: a rollout's choice
        self._logged_not_ready: dict[str, str] = {}  # model -> the reason last logged
        self._entry_errors: dict[str, str] = {}  # model -> why its repository entry is unreadable
        self._applied: set[str] = set()  # models a sync has tried to load

    def route_by(self, router: Any) -> Any:
        """Let ``router`` (``(name, key) -> ModelHandle | None``, a rollout's) pick the version
        of a request that names none; None: the version policy alone. Returns the one before,
        so a caller that sets one aside (the warm-up) can put it back."""
        before, self._router = self._router, router
        return before

    # ------------------------------------------------------------------ request path
    def get(self, name: str, version: str | None = None, key: Any = None) -> ModelHandle:
        """The handle serving ``name`` (at ``version``, a number or alias, when given).

        Without a version a rollout ``router`` (scaling/rollout.py) may pick a candidate version
        for this request; ``key`` (a /v1 request's entities) keeps that choice sticky.
        """
        if not version:
            if self._router is not None:
                routed = self._router(name, key)
                if routed is not None:
                    return routed  # type: ignore[no-any-return]
            handle = self._default.get(name)
            if handle is not None:
                return handle
            self._raise_missing(name, None)
        versions = self._handles.get(name)
        if versions is not None and _is_number(version):
            handle = versions.get(int(version))
            if handle is not None:
                return handle
        elif versions is not None:
            # An alias: resolved from the table read at the last sync, not from disk.
            handle = versions.get(self._aliases.get(name, {}).get(version, -1))
            if handle is not None:
                return handle
        self._raise_missing(name, version)

    def _raise_missing(self, name: str, version: str | None) -> NoReturn:
        known = self._versions.get(name)
        if known is None:
            served = ", ".join(sorted(self._versions)) or "none"
            raise ModelNotFound(
                f"model '{name}' is not served (models: {served}); add it to the repository "
                "with `redline models add`"
            )
        if name in self.unloaded:
            raise ModelNotReady(f"model '{name}' was unloaded; load it through the admin API")
        if version is None:
            reason = self._failure_text(name)
            raise ModelNotReady(f"model '{name}' has no version loaded yet{reason}")
        if _is_number(version) and int(version) not in known:
            raise VersionNotFound(f"model '{name}' has no version {version} (versions: {known})")
        if not version.isascii():  # never a version or an alias, whatever digits it shows
            raise VersionNotFound(f"model '{name}' has no version '{version}': versions are "
                                  f"ASCII numbers (versions: {known}) or aliases")
        if not _is_number(version):
            try:
                self.repository.resolve(name, version)
            except (RedlineError, ValueError) as exc:  # ValueError: non-ASCII digits
                raise VersionNotFound(str(exc)) from None
        loaded = sorted(self._handles.get(name, {}))
        reason = self._failure_text(name)
        raise ModelNotReady(
            f"model '{name}' version {version} is not loaded (loaded: {loaded}; the version "
            f"policy decides which versions are live){reason}"
        )

    def _failure_text(self, name: str) -> str:
        reasons = [f"v{v}: {why}" for (n, v), why in self.failures.items() if n == name]
        return f"; failed to load: {'; '.join(reasons)}" if reasons else ""

    def ready(self, name: str, version: str | None = None) -> bool:
        try:
            self.get(name, version)
        except RedlineError:
            return False
        return True

    def models(self) -> list[str]:
        return sorted(self._versions)

    def loaded(self, name: str) -> list[ModelHandle]:
        return [h for _, h in sorted(self._handles.get(name, {}).items())]

    def versions(self, name: str) -> list[int]:
        return list(self._versions.get(name, []))

    def provider_fallbacks(self) -> list[dict[str, str]]:
        """The loaded versions that run without a provider ``runtime.providers`` asks for (no
        GPU build, or CUDA did not start), and why: they serve, on the CPU."""
        return [{"model": h.name, "version": h.version_str, "reason": reason}
                for _, table in sorted(self._handles.items()) for _, h in sorted(table.items())
                if (reason := h.session.provider_fallback)]

    def all_ready(self) -> bool:
        """Whether the server is ready, by ``server.strict_readiness`` (see ``readiness``)."""
        return self.readiness()[0]

    def readiness(self) -> tuple[bool, list[dict[str, str]]]:
        """(ready, the models that are not ready: name, reason, fix). Strict: any such model
        makes the server not ready; otherwise only one still loading (not yet tried) does."""
        problems: list[dict[str, str]] = []
        waiting = False
        for name in self._versions:
            if name in self._default or name in self.unloaded:
                continue
            problem = self._not_ready(name)
            problems.append(problem)
            waiting = waiting or problem["state"] == "LOADING"
        strict = self.settings.server.strict_readiness
        return not (waiting or (strict and problems)), problems

    def _not_ready(self, name: str) -> dict[str, str]:
        if name not in self._applied:
            return {"model": name, "state": "LOADING", "reason": "not loaded yet",
                    "fix": "wait: its versions are loading"}
        reasons = [f"version {v}: {str(why).rstrip('. ')}"
                   for (n, v), why in sorted(self.failures.items()) if n == name]
        if name in self._entry_errors:
            reasons.insert(0, self._entry_errors[name])
        reason = "; ".join(reasons) or "no version of it is live (see its version policy)"
        return {"model": name, "state": "UNAVAILABLE", "reason": reason,
                "fix": ("remove the cause above, then add a fixed version (`redline models add "
                        f"-m {name} ...`) or reload it (admin API: POST "
                        f"/v2/repository/models/{name}/load), or remove the model from the "
                        "repository; with server.strict_readiness: false the server is ready "
                        "without it and serves the other models")}

    def log_readiness(self) -> None:
        """An ERROR line for each model that newly is not ready (and why), once per reason."""
        _, problems = self.readiness()
        now = {p["model"]: p["reason"] for p in problems if p["state"] != "LOADING"}
        strict = self.settings.server.strict_readiness
        for problem in problems:
            name = problem["model"]
            if problem["state"] == "LOADING" or self._logged_not_ready.get(name) == now[name]:
                continue
            log.error("model %s is not ready: %s. To fix: %s. %s", name,
                      str(problem["reason"]).rstrip(". "), str(problem["fix"]).rstrip(". "),
                      "The server answers not ready until it is (server.strict_readiness: "
                      "true)." if strict else "The server is ready without it "
                      "(server.strict_readiness: false).")
        for name in set(self._logged_not_ready) - set(now):
            log.info("model %s is ready", name)
        self._logged_not_ready = now

    # ------------------------------------------------------------------ control path
    async def sync(self, names: list[str] | None = None) -> None:
        """Bring the loaded versions in line with the repository (load, warm, swap, retire)."""
        async with self._lock:
            plans = await asyncio.to_thread(self._plan, names)
            for name, plan in plans.items():
                await self._apply(name, plan)
            if names is None:
                for gone in set(self._versions) - set(plans):
                    self._applied.discard(gone)
                    self._entry_errors.pop(gone, None)
                    self._versions.pop(gone, None)
                    self._aliases.pop(gone, None)
                    self._default.pop(gone, None)
                    for handle in self._handles.pop(gone, {}).values():
                        self._retire(handle)
            self.log_readiness()

    def _plan(self, names: list[str] | None) -> dict[str, _Plan]:
        repo = self.repository
        plans: dict[str, _Plan] = {}
        for name in names if names is not None else repo.list_models():
            plan = _Plan()
            try:
                plan.versions = repo.versions(name)
                if not plan.versions:
                    continue
                policy_text = self.settings.for_model(name).version_policy
                policy = VersionPolicy.parse(policy_text) if policy_text else None
                plan.live = repo.live_versions(name, policy)
                plan.default = repo.resolve(name, None)
                plan.aliases = {**repo.aliases(name), "latest": plan.versions[-1]}
            except RedlineError as exc:
                plan.error = exc.message
            plans[name] = plan
        return plans

    async def _apply(self, name: str, plan: _Plan) -> None:
        self._versions[name] = plan.versions
        self._aliases[name] = plan.aliases
        try:
            await self._apply_plan(name, plan)
        finally:
            self._applied.add(name)  # tried: from here on readiness says why, not "loading"

    async def _apply_plan(self, name: str, plan: _Plan) -> None:
        if plan.error is not None:
            if self._entry_errors.get(name) != plan.error:
                log.warning("model %s: cannot read its repository entry: %s", name, plan.error)
            self._entry_errors[name] = plan.error
            return
        self._entry_errors.pop(name, None)
        if name in self.unloaded:
            return
        current = self._handles.get(name, {})
        table: dict[int, ModelHandle] = {}
        for version in plan.live:
            handle = current.get(version)
            if handle is None and (name, version) not in self.failures:
                handle = await self._load(name, version)
            if handle is not None:
                table[version] = handle
        default = table.get(plan.default) if plan.default is not None else None
        if default is None:
            # The wanted default failed to load (or is not live): keep serving the old one.
            default = self._default.get(name)
            if default is not None:
                table.setdefault(default.version, default)
            elif table:
                default = table[max(table)]
            elif plan.default is not None:
                default = await self._last_intact(name, plan)
                if default is not None:
                    table[default.version] = default
        # The swap: new requests see the new table from here on.
        self._handles[name] = table
        if default is not None:
            if self._default.get(name) is not default:
                log.info("model %s: serving version %s", name, default.version)
            self._default[name] = default
        for version, handle in current.items():
            if table.get(version) is not handle:
                self._retire(handle)

    async def _last_intact(self, name: str, plan: _Plan) -> ModelHandle | None:
        """The newest version older than the wanted default that loads, when nothing else can
        serve: a tampered or broken latest version must not take the whole model down while an
        intact earlier one is on disk. Said loudly, since the policy's choice is not served."""
        assert plan.default is not None
        for version in sorted((v for v in plan.versions if v < plan.default), reverse=True):
            if (name, version) in self.failures:
                continue
            handle = await self._load(name, version)
            if handle is not None:
                log.error(
                    "model %s: version %s (the version policy's choice) cannot be served (%s); "
                    "serving version %s, the newest intact earlier version, until it is fixed",
                    name, plan.default, self.failures.get((name, plan.default), "not loaded"),
                    version)
                return handle
        return None

    async def _load(self, name: str, version: int) -> ModelHandle | None:
        def build() -> ModelHandle:
            model = self.settings.for_model(name)
            session = load_runner(self.repository, name, version, self.settings.runtime,
                                  python_runtime=model.runtime, python_workers=model.workers)
            try:
                handle = self._handle(session)
                if self.checks is None:
                    handle.warm()
                    return handle
                self.checks.admit(handle)
                try:
                    handle.warm()
                except BaseException:
                    self.checks.retired(handle)
                    raise
                return handle
            except BaseException:
                session.close()  # a Python model's worker processes, when it has them
                raise

        try:
            handle = await asyncio.to_thread(build)
        except Exception as exc:  # noqa: BLE001 - any load/warm failure keeps the old version
            reason = (
                exc.message if isinstance(exc, RedlineError) else f"{type(exc).__name__}: {exc}"
            )
            self.failures[(name, version)] = reason
            log.warning("model %s version %s failed to load, not serving it: %s",
                        name, version, reason)
            return None
        self.failures.pop((name, version), None)
        log.info("model %s version %s loaded and warm", name, version)
        return handle

    def _handle(self, session: ModelRunner) -> ModelHandle:
        """A model's handle; a general graph's runs its steps (``serving/dag.py``)."""
        if isinstance(session, DagRunner):
            from redline.serving.dag import GraphHandle

            return GraphHandle(session, self.settings, self)
        return ModelHandle(session, self.settings)

    def _retire(self, handle: ModelHandle) -> None:
        if self.checks is not None:
            self.checks.retired(handle)
        task = asyncio.get_running_loop().create_task(
            handle.retire(self.settings.server.drain_timeout_s)
        )
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def load(self, name: str) -> None:
        """Admin: (re)load a model now, retrying versions that failed before."""
        check_name(name)  # a name that cannot be a folder is a 400, not an OSError
        self.unloaded.discard(name)
        for key in [k for k in self.failures if k[0] == name]:
            del self.failures[key]
        await self.sync([name])
        if name not in self._versions:
            raise ModelNotFound(f"model '{name}' is not in the repository")
        if name not in self._default:
            raise ModelNotReady(f"model '{name}' did not load{self._failure_text(name)}")

    async def unload(self, name: str) -> None:
        """Admin: stop serving a model until it is loaded again."""
        check_name(name)
        async with self._lock:
            if name not in self._versions:
                raise ModelNotFound(f"model '{name}' is not served")
            self.unloaded.add(name)
            self._default.pop(name, None)
            for handle in self._handles.pop(name, {}).values():
                self._retire(handle)

    def index(self) -> list[dict[str, Any]]:
        """Triton's repository index: every version on disk with its state and reason."""
        rows: list[dict[str, Any]] = []
        for name in self.models():
            loaded = self._handles.get(name, {})
            for version in self._versions.get(name, []):
                row: dict[str, Any] = {"name": name, "version": str(version)}
                if version in loaded:
                    row["state"] = "READY"
                elif (name, version) in self.failures:
                    row["state"] = "UNAVAILABLE"
                    row["reason"] = self.failures[(name, version)]
                else:
                    # Deliberately not loaded (admin unload, or outside the version policy):
                    # UNLOADED, as Triton says; UNAVAILABLE is for versions that failed.
                    row["state"] = "UNLOADED"
                    row["reason"] = ("unloaded through the admin API" if name in self.unloaded
                                     else "not live (version policy)")
                rows.append(row)
        return rows

    async def watch(self, interval_s: float) -> None:
        """Poll the repository and sync; errors are logged, never fatal."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.sync()
            except Exception:  # noqa: BLE001 - the watcher must outlive a bad repository state
                log.exception("repository sync failed; will retry")

    async def close(self) -> None:
        """Drain and release every loaded version."""
        handles = [h for table in self._handles.values() for h in table.values()]
        self._handles.clear()
        self._default.clear()
        await asyncio.gather(
            *(h.retire(self.settings.server.drain_timeout_s) for h in handles),
            *self._retiring, return_exceptions=True,
        )


def _is_number(version: str) -> bool:
    """A version number: ASCII digits only (``str.isdigit`` also takes ``²`` and ``①``)."""
    return version.isascii() and version.isdigit()
