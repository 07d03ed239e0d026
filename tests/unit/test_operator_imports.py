"""The operator's read-only commands start without the Agents SDK: importing it costs about a
second, paid by every `runs list`, `approvals list` or `threads export` an operator (or a
monitoring script) runs. Only `runs cancel` needs it (it restores checkpoints), and imports it
when it runs."""

from __future__ import annotations

import subprocess
import sys

from tests.support.gateway import ROOT

CHECK = (
    "import sys\n"
    "import gateway.__main__, gateway.operator.commands, gateway.operator.output\n"
    "loaded = sorted(m for m in sys.modules if m == 'agents' or m.startswith('agents.'))\n"
    "print(len(loaded), loaded[:5])\n"
)


def test_the_operator_commands_import_no_agents_sdk() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.startswith("0 "), done.stdout
