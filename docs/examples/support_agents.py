"""An agent registry of your own: the example of docs/agents.md.

    GATEWAY_AGENTS=support_agents:registry PYTHONPATH=docs/examples python -m gateway serve

One graph, `support`, with a plain tool and a tool that waits for a reviewer holding the
`billing` role; the customer id is masked for everyone but reviewers. The run context carries
the caller: the cancellation says who asked for it and who approved it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agents import Agent, function_tool
from agents.tool_context import ToolContext

from gateway.agents.exactly_once import Policy, run_once
from gateway.agents.registry import AgentGraph, AgentRegistry
from gateway.agents.run_caller import RunCaller
from gateway.agents.run_settings import RunSettings


@dataclass
class SupportContext:
    """The run context: saved in every checkpoint, so it must round-trip through a dict."""

    caller: RunCaller
    tier: str


def support_context(caller: RunCaller) -> SupportContext:
    # Called for each new run, with who it runs for.
    return SupportContext(caller=caller, tier="standard")


def save_context(context: SupportContext) -> dict[str, Any]:
    # The caller is not saved: the gateway describes it again at every restore.
    return {"tier": context.tier}


def load_context(data: Mapping[str, Any], caller: RunCaller) -> SupportContext:
    # At every continuation: `caller.decided_by` is who decided the latest approval.
    return SupportContext(caller=caller, tier=data["tier"])


def lookup_invoice(invoice_id: str) -> str:
    """Look up an invoice.

    Args:
        invoice_id: The invoice number.
    """
    return f"Invoice {invoice_id} is paid."


async def cancel_subscription(ctx: ToolContext[SupportContext], customer_id: str) -> str:
    """Cancel a customer's subscription.

    Args:
        customer_id: The customer's id.
    """
    caller = ctx.context.caller

    def cancel(idempotency_key: str) -> str:
        # Call your billing system here, passing it `idempotency_key`: the same for this call
        # across retries and restarts, so the system can refuse a repeat.
        return (
            f"Subscription of {customer_id} cancelled for {caller.user} "
            f"(tenant {caller.tenant}), approved by {caller.decided_by}."
        )

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
        make_context=support_context,
        context_serializer=save_context,
        context_deserializer=load_context,
        # Traces of a run name the graph's workflow; a thread's runs are one group.
        run_settings=lambda caller: RunSettings(workflow_name="customer support"),
        reviewer_roles={"cancel_subscription": frozenset({"billing"})},
        sensitive_arguments={"cancel_subscription": frozenset({"customer_id"})},
    )


registry = AgentRegistry([support_graph()])
