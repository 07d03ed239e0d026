"""The run lifecycle's moves (persistence/run_status.py): terminal statuses have no way out,
every status a run can be in is reachable from the first and can end, every status change the
gateway writes is a move of the table, and an illegal move is refused before anything is
written, naming both statuses."""

from __future__ import annotations

import ast
import importlib
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from persistence.checkpoints import CheckpointRecord, CheckpointRepository
from persistence.clock import utcnow
from persistence.run_status import (
    ACTIVE,
    INITIAL,
    MOVES,
    TERMINAL,
    IllegalRunTransition,
    RunStatus,
    check_moves,
    moves_into,
)
from persistence.runs import RunRepository
from persistence.store import Store
from tests.support.storage import insert_running_run, migrated_store

ROOT = Path(__file__).resolve().parents[2]
# The calls that change a run's status, and where each takes the status it moves to.
SWAPS = {"transition": 1, "transition_in": 2, "save_in": None}


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with migrated_store(f"sqlite:///{tmp_path / 'runs.db'}") as store:
        yield store


def test_every_status_has_its_moves() -> None:
    assert set(MOVES) == set(RunStatus)


def test_a_terminal_status_has_no_way_out() -> None:
    for status in TERMINAL:
        assert MOVES[status] == frozenset(), status
        for target in RunStatus:
            with pytest.raises(IllegalRunTransition):
                check_moves([status], target)


def test_every_status_is_reachable_and_every_active_one_can_end() -> None:
    reached = {INITIAL}
    frontier = [INITIAL]
    while frontier:
        for target in MOVES[frontier.pop()]:
            if target not in reached:
                reached.add(target)
                frontier.append(target)
    assert reached == set(RunStatus)
    for status in ACTIVE:
        assert TERMINAL <= MOVES[status], status


def test_moves_into_is_the_table_read_backwards() -> None:
    for target in RunStatus:
        assert moves_into(target) == {s for s in RunStatus if target in MOVES[s]}
    assert moves_into(RunStatus.RESUMING) == {RunStatus.WAITING_FOR_REVIEW, RunStatus.SUSPENDED}
    assert moves_into(RunStatus.CANCELLED) == ACTIVE


def test_an_illegal_move_names_both_statuses() -> None:
    with pytest.raises(IllegalRunTransition) as raised:
        check_moves([RunStatus.RUNNING, RunStatus.SUSPENDED], RunStatus.WAITING_FOR_REVIEW)
    assert raised.value.source is RunStatus.SUSPENDED
    assert raised.value.target is RunStatus.WAITING_FOR_REVIEW
    assert "from suspended to waiting_for_review" in str(raised.value)


async def test_the_swaps_refuse_an_illegal_move_before_writing(store: Store) -> None:
    await insert_running_run(store, "r_1", "t_1")
    runs = RunRepository(store)
    with pytest.raises(IllegalRunTransition, match="from completed to running"):
        await runs.transition("r_1", RunStatus.RUNNING, expected=(RunStatus.COMPLETED,))
    with pytest.raises(IllegalRunTransition, match="from running to resuming"):
        await runs.transition("r_1", RunStatus.RESUMING, expected=(RunStatus.RUNNING,))
    checkpoint = CheckpointRecord(
        run_id="r_1",
        version=1,
        state="{}",
        sdk_schema_version="1",
        graph_name="assistant",
        graph_version="1",
        reason="turn",
        session_mark=0,
        created_at=utcnow(),
    )
    save = partial(
        CheckpointRepository.save_in,
        checkpoint=checkpoint,
        status=RunStatus.SUSPENDED,
        expected=(RunStatus.WAITING_FOR_REVIEW,),
    )
    with pytest.raises(IllegalRunTransition, match="from waiting_for_review to suspended"):
        await store.write(save)
    run = await runs.get("r_1")
    assert run is not None
    assert (run.status, run.checkpoint_version) == (RunStatus.RUNNING, 0)
    # A legal move still goes through.
    assert await runs.transition("r_1", RunStatus.SUSPENDED, expected=(RunStatus.RUNNING,))


# --- the moves the code performs ---------------------------------------------------------


@dataclass(frozen=True)
class SwapCall:
    where: str
    target: ast.expr
    expected: ast.expr


def swap_calls() -> Iterator[tuple[str, SwapCall]]:
    """Every status compare-and-swap written in the gateway and persistence packages."""
    for package in ("gateway", "persistence"):
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                if node.func.attr not in SWAPS:
                    continue
                keywords = {k.arg: k.value for k in node.keywords}
                if "expected" not in keywords:
                    continue
                position = SWAPS[node.func.attr]
                target = keywords.get("to", keywords.get("status"))
                if target is None and position is not None:
                    target = node.args[position]
                assert target is not None, f"{module}:{node.lineno}"
                yield module, SwapCall(f"{module}:{node.lineno}", target, keywords["expected"])


def statuses(module: str, node: ast.expr) -> set[RunStatus] | None:
    """The statuses an expression names, when it names them without running code."""
    match node:
        case ast.Attribute(value=ast.Name(id="RunStatus"), attr=name):
            return {RunStatus[name]}
        case ast.Tuple(elts=items) | ast.List(elts=items) | ast.Set(elts=items):
            found: set[RunStatus] = set()
            for item in items:
                named = statuses(module, item)
                if named is None:
                    return None
                found |= named
            return found
        case ast.Name(id=name):
            value = getattr(importlib.import_module(module), name, None)
            if isinstance(value, RunStatus):
                return {value}
            if isinstance(value, Iterable) and all(isinstance(v, RunStatus) for v in value):
                return set(value)
    return None


def test_every_move_the_code_performs_is_in_the_table() -> None:
    calls = list(swap_calls())
    # The swaps of recovery, continuation, cancellation and execution, at least.
    assert len(calls) >= 10
    performed: set[tuple[RunStatus, RunStatus]] = set()
    for module, call in calls:
        match call.expected:
            # Expected statuses read from the table: legal by construction.
            case ast.Call(func=ast.Name(id="moves_into"), args=[argument]):
                assert ast.dump(argument) == ast.dump(call.target), call.where
                continue
        targets = statuses(module, call.target)
        sources = statuses(module, call.expected)
        assert targets is not None and sources is not None, (
            f"{call.where}: the statuses of this swap cannot be read; name them or take the "
            "expected statuses from moves_into"
        )
        for target in targets:
            for source in sources:
                assert target in MOVES[source], f"{call.where}: {source} -> {target}"
                performed.add((source, target))
    # The pauses' rollbacks, the continuations and recovery are among them.
    assert (RunStatus.RESUMING, RunStatus.WAITING_FOR_REVIEW) in performed
    assert (RunStatus.SUSPENDED, RunStatus.RESUMING) in performed
    assert (RunStatus.RECOVERING, RunStatus.RUNNING) in performed
    assert (RunStatus.WAITING_FOR_REVIEW, RunStatus.CANCELLED) in performed
