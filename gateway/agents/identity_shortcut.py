"""The SDK's agent identities, without their cost for agents whose name is their own.

`RunState.to_json`, `RunState.from_json` and the SDK's tool tracking key every agent of the
graph by an identity (the SDK's `agents/_run_state_agent_identity.py`): its name and, among
agents that share a name, a rank settled by a signature of everything the agent is made of
(instructions, model settings, tools, handoffs, guardrails), normalised and dumped as JSON. The
SDK computes that signature for every agent of the graph each time, though it ranks only agents
of the same name: 107 µs for the demo's one agent, four times in each checkpoint's
serialisation and three in each restore, 570 of the 800 µs `to_json` takes and a tenth of the
gateway's CPU for a story run (docs/benchmarks.md, figure 1). It grows with every agent of the
graph.

`install()` wraps the signature's one caller, the sort key of an agent among those of its name
(`_agent_identity_sort_key`, used to rank a name's agents and to find agents told apart only by
their order). For an agent no other agent of the graph is named like, it answers with an empty
signature: that agent's group holds it alone, so the key ranks nothing and groups nothing with
it, and every identity, ambiguity and checkpoint comes out as the SDK's own (tests/unit/
test_identity_shortcut.py compares both on graphs with and without shared names). Agents that
share a name get the SDK's own key.

The SDK keeps no state here to patch around, and the wrapper keeps none: it is installed once
per process, and an SDK release without that function is left as it is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

SortKey = Callable[..., tuple[int, str, int]]
# Marks the wrapper, so a second `install()` (another app in the same process) leaves it be.
_WRAPS = "__gateway_wraps__"


def install() -> bool:
    """Wrap the SDK's sort key (once per process). False when this SDK release has none."""
    try:
        from agents import _run_state_agent_identity as identities
    except ImportError:
        return False
    original = getattr(identities, "_agent_identity_sort_key", None)
    graph = getattr(identities, "_iter_agent_graph", None)
    if original is None or graph is None:
        log.debug("this release of the Agents SDK has no agent identity sort key to shortcut")
        return False
    if hasattr(original, _WRAPS):
        return True
    identities._agent_identity_sort_key = shortcut_sort_key(original, graph)
    return True


def sdk_sort_key() -> SortKey:
    """The SDK's own sort key, whether or not `install()` has wrapped it."""
    from agents import _run_state_agent_identity as identities

    key = identities._agent_identity_sort_key
    return getattr(key, _WRAPS, key)


def shortcut_sort_key(original: SortKey, graph: Callable[[Any], Any]) -> SortKey:
    """`original`, except for an agent whose name no other agent of `root_agent`'s graph has."""

    def sort_key(agent: Any, *, root_agent: Any, original_index: int) -> tuple[int, str, int]:
        name = agent.name
        named_alike = 0
        for other in graph(root_agent):
            if other.name == name:
                named_alike += 1
                if named_alike > 1:
                    return original(agent, root_agent=root_agent, original_index=original_index)
        return (0 if agent is root_agent else 1, "", original_index)

    setattr(sort_key, _WRAPS, original)
    return sort_key
