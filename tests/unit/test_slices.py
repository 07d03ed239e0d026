"""`slices` (persistence/slices.py): every item once, in order, no slice over the size."""

from __future__ import annotations

import pytest

from persistence.slices import slices


@pytest.mark.parametrize("count", [0, 1, 399, 400, 401, 1200])
def test_slices_cover_every_item_once_in_order(count: int) -> None:
    items = list(range(count))
    cut = list(slices(items, 400))
    assert [item for part in cut for item in part] == items
    assert all(0 < len(part) <= 400 for part in cut)
    assert len(cut) == -(-count // 400)
