"""The seed of the randomized tests (the kill -9 soak, the live fuzz, schemathesis, the frame
parser's property tests).

By default every run uses the same seed, so CI sees the same kills and the same frames each
time and a failure repeats. `GATEWAY_TEST_SEED=random` draws a fresh one for a run (explore);
`GATEWAY_TEST_SEED=<n>` repeats run n. The seed is printed in the run's header and by each test
that uses it, so a failure found with a random seed can be replayed.
"""

from __future__ import annotations

import os
import random

SEED_VARIABLE = "GATEWAY_TEST_SEED"
DEFAULT_SEED = 20261129


def draw_if_random() -> None:
    """`GATEWAY_TEST_SEED=random` becomes one drawn number, in this process's environment:
    called once before the test workers start, so they all inherit the same seed."""
    if os.environ.get(SEED_VARIABLE, "").strip().lower() == "random":
        os.environ[SEED_VARIABLE] = str(random.SystemRandom().randrange(1, 2**32))


def run_seed() -> int:
    """The run's seed: GATEWAY_TEST_SEED, or DEFAULT_SEED when unset."""
    value = os.environ.get(SEED_VARIABLE, "").strip()
    if not value:
        return DEFAULT_SEED
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{SEED_VARIABLE} must be an integer or 'random', not {value!r}") from None


def is_default() -> bool:
    return run_seed() == DEFAULT_SEED


def replay_hint() -> str:
    """What to print beside a result: the seed and how to repeat it."""
    seed = run_seed()
    return f"seed={seed} (repeat with {SEED_VARIABLE}={seed})"
