"""The README's registry example is code that works: it builds, and its tool waits for a
reviewer."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_registry_builds_an_agent_whose_tool_needs_approval() -> None:
    [source] = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    module = ModuleType("readme_example")
    exec(compile(source, str(README), "exec"), module.__dict__)
    registry = module.registry()
    assert registry.names() == ["support"]
    agent = registry.get("support").build()
    [tool] = agent.tools
    assert tool.name == "cancel_subscription"
    assert tool.needs_approval is True
