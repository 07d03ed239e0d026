"""`SurvivorFreezing` (gateway/server/gc_policy.py) on the interpreter's own collector: what a
full collection leaves is frozen, so later ones do not walk it; a reference cycle that becomes
garbage while frozen waits for the thaw, and the full collection after it frees it; full
collections follow each collection of the middle generation while it is installed."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from gateway.server.gc_policy import FULL_AFTER_MIDDLE, SurvivorFreezing


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def policy() -> Iterator[tuple[SurvivorFreezing, Clock]]:
    clock = Clock()
    freezing = SurvivorFreezing(60.0, clock=clock)
    gc.collect()
    freezing.install()
    try:
        yield freezing, clock
    finally:
        freezing.remove()
        gc.unfreeze()  # the test process's collector as it was


def test_only_a_full_collection_s_end_freezes(policy: tuple[SurvivorFreezing, Clock]) -> None:
    freezing, _ = policy
    before = gc.get_freeze_count()
    freezing("start", {"generation": 2})
    freezing("stop", {"generation": 1})
    assert gc.get_freeze_count() == before
    gc.collect(1)
    assert gc.get_freeze_count() == before
    gc.collect()
    assert gc.get_freeze_count() > before


def test_a_cycle_frozen_alive_is_freed_after_the_thaw(
    policy: tuple[SurvivorFreezing, Clock],
) -> None:
    _, clock = policy
    node = Node()
    alive = weakref.ref(node)
    gc.collect()  # `node` survives it, and is frozen with the rest
    del node
    gc.collect()
    assert alive() is not None  # garbage now, but frozen: not walked
    clock.now = 61.0
    gc.collect()  # ends with the thaw
    assert gc.get_freeze_count() == 0
    gc.collect()  # walks everything again, and freezes what it leaves
    assert alive() is None
    assert gc.get_freeze_count() > 0


def test_removed_it_freezes_nothing_more(policy: tuple[SurvivorFreezing, Clock]) -> None:
    freezing, _ = policy
    freezing.remove()
    gc.unfreeze()
    gc.collect()
    assert gc.get_freeze_count() == 0


def test_full_collections_follow_each_middle_one_while_installed() -> None:
    """Installed, the policy asks for a full collection after each collection of the middle
    generation (the first two thresholds kept); removed, it puts the thresholds back."""
    before = gc.get_threshold()
    freezing = SurvivorFreezing(60.0)
    freezing.install()
    try:
        assert gc.get_threshold() == (*before[:2], FULL_AFTER_MIDDLE)
        assert FULL_AFTER_MIDDLE < before[2]
    finally:
        freezing.remove()
        gc.unfreeze()
    assert gc.get_threshold() == before
