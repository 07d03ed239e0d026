"""An agent registry of your own: the example of docs/agents.md.

    GATEWAY_AGENTS=support_agents:registry PYTHONPATH=docs/examples python -m gateway serve

One graph, `support`, with a plain tool and a tool that waits for a reviewer holding the
`billing` role; the customer id is masked for everyone but reviewers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agents import Agent, function_tool
from agents.tool_context import ToolContext

from gateway.ledger import Policy, run_once
from gateway.registry import AgentGraph, AgentRegistry


@dataclass
class SupportContext:
    """The run context: saved in every checkpoint, so it must round-trip through a dict."""

    tier: str


def lookup_invoice(invoice_id: str) -> str:
    """Look up an invoice.

    Args:
        invoice_id: The invoice number.
    """
    return f"Invoice {invoice_id} is paid."


async def cancel_subscription(ctx: ToolContext[Any], customer_id: str) -> str:
    """Cancel a customer's subscription.

    Args:
        customer_id: The customer's id.
    """

    def cancel(idempotency_key: str) -> str:
        # Call your billing system here, passing it `idempotency_key`: the same for this call
        # across retries and restarts, so the system can refuse a repeat.
        return f"Subscription of {customer_id} cancelled."

    # Once per call, even when the run is continued after a crash (docs/agents.md).
    return await run_once(ctx, cancel, policy=Policy.RECONCILE)


def build_support_agent() -> Agent[Any]:
    # Called once per graph version: every run and every restore reuses the agent, so keep
    # per-run state in the run context, not in the agent or its tools.
    return Agent(
        name="support",
        instructions="You help customers with invoices and subscriptions.",
        tools=[
            function_tool(lookup_invoice),
            function_tool(cancel_subscription, needs_approval=True),  # pauses for a reviewer
        ],
    )


def support_graph(build: Any = build_support_agent) -> AgentGraph:
    return AgentGraph(
        name="support",
        # Bump whenever the agents, their tools or their handoffs change.
        version="2026-12",
        build=build,
        make_context=lambda: SupportContext(tier="standard"),
        context_serializer=lambda context: {"tier": context.tier},
        context_deserializer=lambda data: SupportContext(**data),
        reviewer_roles={"cancel_subscription": frozenset({"billing"})},
        sensitive_arguments={"cancel_subscription": frozenset({"customer_id"})},
    )


registry = AgentRegistry([support_graph()])
