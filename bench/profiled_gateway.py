"""Run `python -m gateway ...` under cProfile and write the profile on SIGTERM.

    python bench/profiled_gateway.py OUT.prof serve --port 0

`python -m cProfile` loses the profile of a uvicorn server: uvicorn re-raises the SIGTERM it
caught once it has shut down, and the default action kills the process before cProfile writes
anything. Here that re-raised signal becomes a normal exit, so the profile is always written.
Profiling starts on SIGUSR1, which the benchmark sends once the server listens, so start-up
(imports, schema building) stays out of the profile. Started as a script (not `-m bench...`)
so that the gateway is imported from PYTHONPATH, which may point at another source tree
(BENCH_GATEWAY_ROOT).
"""

from __future__ import annotations

import cProfile
import signal
import sys
from collections.abc import Callable
from types import FrameType


def _exit(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def run_recorded(args: list[str], start: Callable[[], None], finish: Callable[[], None]) -> int:
    """`python -m gateway *args`, with `start()` on SIGUSR1 and `finish()` however it ends
    (a SIGTERM re-raised by uvicorn included); the gateway's exit status. Shared with
    bench/traced_gateway.py."""
    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGUSR1, lambda _signum, _frame: start())
    from gateway.__main__ import main as gateway_main

    try:
        return gateway_main(args)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0
    finally:
        finish()


def main(argv: list[str]) -> int:
    out, args = argv[0], argv[1:]
    profile = cProfile.Profile()

    def finish() -> None:
        profile.disable()
        profile.dump_stats(out)

    return run_recorded(args, profile.enable, finish)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
