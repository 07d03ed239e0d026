"""`python -m client_demo chat|review`: a terminal client for the gateway.

    python -m client_demo chat --url http://127.0.0.1:8000 [--token T | --user alice --tenant demo]
                               [--thread THREAD_ID] [--agent NAME]
    python -m client_demo review --url http://127.0.0.1:8000 [--token T | --user bob]
                                 [--auto approve|reject [--reason TEXT]] [--once]

Without a token (`--token` or the GATEWAY_TOKEN environment variable) the client asks the
gateway for a development token (`POST /v1/dev/token`, only offered while GATEWAY_SECRET is
unset) with roles ["user"] for chat and ["reviewer"] for review, and for a new one, sent in a new
`hello`, before the current one expires (`--dev-token-ttl` sets their lifetime). A token passed
in is not renewed: the client warns before it expires and exits when the gateway ends the
session for it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from client_demo.chat import ChatOptions, run_chat
from client_demo.review import ReviewOptions, run_review
from client_demo.terminal import FatalError, TokenSource, endpoints, run_app

DEFAULT_URL = "http://127.0.0.1:8000"


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="python -m client_demo", description="Terminal client for the agents gateway."
    )
    commands = root.add_subparsers(dest="command", required=True)

    def common(sub: argparse.ArgumentParser, default_user: str) -> None:
        sub.add_argument(
            "--url",
            default=os.environ.get("GATEWAY_URL", DEFAULT_URL),
            help=f"gateway address, http(s):// or ws(s):// (GATEWAY_URL, default {DEFAULT_URL})",
        )
        sub.add_argument(
            "--token",
            default=os.environ.get("GATEWAY_TOKEN") or None,
            help="JWT to authenticate with (GATEWAY_TOKEN); else a development token is fetched",
        )
        sub.add_argument(
            "--user", default=default_user, help="development token user (default %(default)s)"
        )
        sub.add_argument(
            "--tenant", default="demo", help="development token tenant (default %(default)s)"
        )
        sub.add_argument(
            "--dev-token-ttl",
            type=int,
            default=None,
            metavar="S",
            help="lifetime of development tokens in seconds, 5 to 86400 (default: the "
            "gateway's, one hour); they are renewed before they expire",
        )
        sub.add_argument(
            "--max-backoff",
            type=float,
            default=10.0,
            help="longest wait between reconnect attempts, in seconds (default %(default)s)",
        )

    chat = commands.add_parser("chat", help="send stdin lines to an agent, stream the answers")
    common(chat, "alice")
    chat.add_argument("--thread", default=None, help="continue this thread (shows its history)")
    chat.add_argument("--agent", default=None, help="agent for new runs (default: the gateway's)")

    review = commands.add_parser("review", help="decide pending approvals")
    common(review, "bob")
    review.add_argument(
        "--auto",
        choices=["approve", "reject"],
        default=None,
        help="decide every approval this way without asking",
    )
    review.add_argument("--reason", default=None, help="rejection reason used by --auto reject")
    review.add_argument("--once", action="store_true", help="exit after the first decision")
    return root


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        http_base, ws_url = endpoints(args.url)
    except FatalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.max_backoff <= 0:
        print("error: --max-backoff must be positive", file=sys.stderr)
        return 2
    roles = ["user"] if args.command == "chat" else ["reviewer"]
    tokens = TokenSource(
        http_base=http_base,
        token=args.token,
        user=args.user,
        tenant=args.tenant,
        roles=roles,
        ttl_s=args.dev_token_ttl,
    )
    if args.command == "chat":
        chat_options = ChatOptions(
            ws_url=ws_url,
            tokens=tokens,
            thread_id=args.thread,
            agent=args.agent,
            max_backoff=args.max_backoff,
        )
        return run_app(lambda: run_chat(chat_options, sys.stdout, sys.stderr))
    review_options = ReviewOptions(
        ws_url=ws_url,
        tokens=tokens,
        auto=args.auto,
        reason=args.reason,
        once=args.once,
        max_backoff=args.max_backoff,
    )
    return run_app(lambda: run_review(review_options, sys.stdout, sys.stderr))


if __name__ == "__main__":
    sys.exit(main())
