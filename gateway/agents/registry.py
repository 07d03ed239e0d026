"""Named agent graphs the gateway can run.

A checkpoint is only meaningful against the exact agent graph that produced it: a renamed agent
or tool breaks a restore, sometimes silently (docs/architecture.md "SDK behaviours"). Every graph
therefore carries a version that is stored with each checkpoint and compared before a restore.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
from agents import Agent

from gateway.agents.approval_rules import ApprovalRule
from gateway.agents.run_caller import RunCaller
from gateway.agents.run_settings import RunSettings
from gateway.auth.access import DecidedBy
from gateway.protocol.error_codes import CodedError, ErrorCode


class UnknownAgentError(CodedError, LookupError):
    """No graph is registered under the requested name."""

    CODE = ErrorCode.BAD_REQUEST


class GraphMismatchError(CodedError, RuntimeError):
    """A checkpoint was written by a graph version the registry no longer accepts."""

    CODE = ErrorCode.GRAPH_MISMATCH

    def __init__(self, name: str, stored_version: str, registered_version: str) -> None:
        super().__init__(
            f"checkpoint of agent graph {name!r} was written by version {stored_version!r}, "
            f"but version {registered_version!r} is registered"
        )
        self.name = name
        self.stored_version = stored_version
        self.registered_version = registered_version


ContextSerializer = Callable[[Any], Mapping[str, Any]]
# `(data)`, or `(data, caller)` to rebuild the context with the caller as of the restore.
ContextDeserializer = (
    Callable[[Mapping[str, Any]], Any] | Callable[[Mapping[str, Any], RunCaller], Any]
)
# `(caller)`, or `()` as before the caller existed.
ContextFactory = Callable[[RunCaller], Any] | Callable[[], Any]
RunSettingsFactory = Callable[[RunCaller], RunSettings]


def _takes_caller(function: Callable[..., Any], given: int) -> bool:
    """Whether `function` takes one more positional argument than the `given` ones: the caller.

    Context factories and deserializers written before the caller existed take none, and keep
    working as they are.
    """
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: called as before
        return False
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        return True
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in parameters if p.kind in positional) > given


@dataclass(frozen=True)
class AgentGraph:
    """One runnable agent graph.

    `build` returns the starting agent with its tools, handoffs and nested agent-tools. The
    gateway calls it once per graph version and shares the agent between runs and restores
    (SDK agents hold no per-run state), so it must not capture per-run data.
    `compatible_versions` lists older versions whose checkpoints this build can still restore.
    `sensitive_arguments` maps a tool name (any agent of the graph, nested agent-tools
    included) to the names of its top-level arguments to mask in events, views for
    non-reviewers and logs; `"*"` masks all of that tool's arguments
    (gateway/run_lifecycle/sensitive_arguments.py). `reviewer_roles` maps a tool name to roles of
    which whoever decides its approvals must hold at least one, on top of being allowed to decide at
    all (gateway/run_lifecycle/review_rules.py); tools not listed can be decided by any reviewer. It
    is policy, not part of the checkpoint: changing it needs no new version and applies to approvals
    already waiting. `decided_by` maps a tool name to who decides its calls: `"user"` (the run's
    own user confirms, as in "send this email?"), `"reviewer"` or `"either"`; tools not listed
    follow GATEWAY_SELF_APPROVAL (gateway/auth/access.py `DecidedBy`). It is policy too. A tool
    only its user decides takes no reviewer roles. `approval_rules` maps a tool name to a rule
    that decides its calls by itself before the run pauses, on the real arguments and the caller
    (gateway/agents/approval_rules.py); policy as well.

    The run context (docs/agents.md "Context"): `make_context(caller)` builds the context of
    each new run from its `RunCaller` (gateway/agents/run_caller.py); without it the context is the
    caller itself. `context_claims` names the token claims (paths) callers carry into it.
    A `context_deserializer(data, caller)` rebuilds the context at every continuation with the
    caller as of then (`decided_by` filled in); a one-argument one keeps the caller as saved.
    `run_settings(caller)` gives the run's hooks, guardrails, model settings and trace names
    (gateway/agents/run_settings.py).
    """

    name: str
    version: str
    build: Callable[[], Agent[Any]]
    context_serializer: ContextSerializer | None = None
    context_deserializer: ContextDeserializer | None = None
    make_context: ContextFactory | None = None
    context_claims: frozenset[str] = field(default_factory=frozenset)
    run_settings: RunSettingsFactory | None = None
    max_turns: int = 100
    compatible_versions: frozenset[str] = field(default_factory=frozenset)
    # hash=False: a dict value must not make the (frozen, hashable) graph unhashable.
    sensitive_arguments: Mapping[str, frozenset[str]] = field(default_factory=dict, hash=False)
    reviewer_roles: Mapping[str, frozenset[str]] = field(default_factory=dict, hash=False)
    decided_by: Mapping[str, DecidedBy | str] = field(default_factory=dict, hash=False)
    approval_rules: Mapping[str, ApprovalRule] = field(default_factory=dict, hash=False)
    # Tools of the starting agent whose calls a reviewer may approve with edited arguments
    # (gateway/agents/edited_arguments.py).
    editable_arguments: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        for tool_name, who in self.decided_by.items():
            try:
                decider = DecidedBy(who)
            except ValueError:
                raise ValueError(
                    f"agent graph {self.name!r}: decided_by[{tool_name!r}] is {who!r}, not one of "
                    f"{', '.join(d.value for d in DecidedBy)}"
                ) from None
            # Roles would narrow reviewers who may not decide it anyway: a mistake to report.
            if decider is DecidedBy.USER and self.reviewer_roles.get(tool_name):
                raise ValueError(
                    f"agent graph {self.name!r}: {tool_name!r} is decided by the run's own user, "
                    "so it cannot also have reviewer_roles"
                )

    # -- the run context -------------------------------------------------------------------

    def new_context(self, caller: RunCaller) -> Any:
        """The context of a new run (or of one restarted from its input)."""
        if self.make_context is None:
            return caller
        if _takes_caller(self.make_context, 0):
            return self.make_context(caller)  # type: ignore[call-arg]
        return self.make_context()  # type: ignore[call-arg]

    @property
    def serialize_context(self) -> ContextSerializer | None:
        """How a checkpoint saves the context (None: the SDK's own way, for a dict)."""
        if self.make_context is None:
            return _caller_json
        return self.context_serializer

    @property
    def rebuilds_context(self) -> bool:
        """Whether a continuation rebuilds the context with its caller (`resumed_context`)."""
        if self.make_context is None:
            return True
        deserializer = self.context_deserializer
        return deserializer is not None and _takes_caller(deserializer, 1)

    @property
    def restore_context(self) -> Callable[[Mapping[str, Any]], Any] | None:
        """How a checkpoint's context is read back on restore. A context the continuation
        rebuilds stays the saved data until then: the caller is not known yet when a pause's
        checkpoint is restored in advance (gateway/run_lifecycle/restored_checkpoints.py)."""
        if self.rebuilds_context:
            return dict
        # One argument: `rebuilds_context` is true for those taking the caller.
        return cast(Callable[[Mapping[str, Any]], Any] | None, self.context_deserializer)

    def resumed_context(self, saved_state: str, caller: RunCaller) -> Any:
        """The context a continuation from the checkpoint `saved_state` runs with; None keeps
        the one restored with the state (the SDK then runs on that)."""
        if self.make_context is None:
            return caller
        if not self.rebuilds_context:
            return None
        assert self.context_deserializer is not None
        # Where RunState.to_json keeps what the serializer returned.
        saved = orjson.loads(saved_state).get("context") or {}
        data = saved.get("context") or {}
        return self.context_deserializer(data, caller)  # type: ignore[call-arg]

    def settings_for(self, caller: RunCaller) -> RunSettings:
        if self.run_settings is None:
            return RunSettings()
        settings = self.run_settings(caller)
        if not isinstance(settings, RunSettings):
            raise TypeError(
                f"run_settings of agent graph {self.name!r} returned "
                f"{type(settings).__name__}, not RunSettings"
            )
        return settings

    def roles_for(self, tool_name: str) -> frozenset[str]:
        return frozenset(self.reviewer_roles.get(tool_name, ()))

    def decider_for(self, tool_name: str) -> DecidedBy | None:
        """Who decides `tool_name`'s calls; None: the global default (GATEWAY_SELF_APPROVAL)."""
        who = self.decided_by.get(tool_name)
        return None if who is None else DecidedBy(who)

    def accepts(self, stored_version: str) -> bool:
        return stored_version == self.version or stored_version in self.compatible_versions

    def check_version(self, stored_version: str) -> None:
        if not self.accepts(stored_version):
            raise GraphMismatchError(self.name, stored_version, self.version)


class AgentRegistry:
    """Maps agent names (as clients send them in `run.start`) to graphs."""

    def __init__(self, graphs: Iterable[AgentGraph] = (), default: str | None = None) -> None:
        self._graphs: dict[str, AgentGraph] = {}
        self._default = default
        for graph in graphs:
            self.register(graph)

    def register(self, graph: AgentGraph) -> None:
        """Add or replace a graph (replacing is how a compatible new version is deployed)."""
        self._graphs[graph.name] = graph
        if self._default is None:
            self._default = graph.name

    @property
    def default_name(self) -> str:
        if self._default is None:
            raise UnknownAgentError("no agent graph is registered")
        return self._default

    def names(self) -> list[str]:
        return sorted(self._graphs)

    def reviewer_role_names(self) -> frozenset[str]:
        """Every role a graph names for its tools (reviewer roles, and the caller roles its
        approval rules read): tokens carrying them must be accepted."""
        return frozenset(
            role
            for graph in self._graphs.values()
            for roles in [
                *graph.reviewer_roles.values(),
                *(rule.caller_roles for rule in graph.approval_rules.values()),
            ]
            for role in roles
        )

    def context_claim_paths(self) -> frozenset[str]:
        """Every token claim a graph takes into its run contexts: verified tokens keep them."""
        return frozenset(path for graph in self._graphs.values() for path in graph.context_claims)

    def get(self, name: str | None = None) -> AgentGraph:
        key = self.default_name if name is None else name
        try:
            return self._graphs[key]
        except KeyError:
            raise UnknownAgentError(f"unknown agent {key!r}") from None


def _caller_json(caller: Any) -> Mapping[str, Any]:
    return caller.to_json() if isinstance(caller, RunCaller) else dict(caller)


def load_registry(spec: str, **factory_kwargs: Any) -> AgentRegistry:
    """Load a user registry from `module.path:attribute`.

    The attribute may be an `AgentRegistry`, or a callable returning one; a callable receives
    `factory_kwargs` it declares by name (for example `model_name`), so users can build their
    graphs against the configured model without importing gateway settings.
    """
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"agent registry {spec!r} must look like 'package.module:attribute'")
    module = importlib.import_module(module_name)
    try:
        target = getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if callable(target) and not isinstance(target, AgentRegistry):
        params = inspect.signature(target).parameters
        kwargs = {k: v for k, v in factory_kwargs.items() if k in params}
        target = target(**kwargs)
    if not isinstance(target, AgentRegistry):
        raise ValueError(f"{spec!r} is not an AgentRegistry (got {type(target).__name__})")
    return target


def agent_names(starting: Agent[Any]) -> set[str]:
    """The names of `starting` and of every agent it can hand off to, however deep: the agents
    whose model calls a run of its graph can make (the metrics count them by agent)."""
    names: set[str] = set()
    pending: list[Any] = [starting]
    while pending:
        agent = pending.pop()
        if agent is None or agent.name in names:
            continue
        names.add(agent.name)
        for target in getattr(agent, "handoffs", ()):
            if isinstance(target, Agent):
                pending.append(target)
                continue
            # A `Handoff`: its agent when it keeps a reference to it, else its name alone.
            name = getattr(target, "agent_name", None)
            reference = getattr(target, "_agent_ref", None)
            found = reference() if callable(reference) else None
            if isinstance(found, Agent):
                pending.append(found)
            elif isinstance(name, str):
                names.add(name)
    return names
