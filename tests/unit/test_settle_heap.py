"""`serve` settles the heap once its app is built (gateway/__main__.py `settle_heap`): what
exists by then is frozen out of the collector's walks, and young objects are collected far less
often than Python's default, which under a streaming load mostly collected nothing."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from gateway.__main__ import YOUNG_GC_THRESHOLD, settle_heap


@pytest.fixture
def collector() -> Iterator[None]:
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def test_settling_freezes_the_heap_and_collects_young_objects_less_often(collector: None) -> None:
    gc.unfreeze()
    older = gc.get_threshold()[1:]
    settle_heap()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (YOUNG_GC_THRESHOLD, *older)
    assert YOUNG_GC_THRESHOLD > 700


def test_garbage_in_cycles_is_still_collected_after_settling(collector: None) -> None:
    settle_heap()

    class Node:
        def __init__(self) -> None:
            self.me = self

    gc.collect()
    Node()
    assert gc.collect() >= 1
