"""A trivial OpenAI-style completions server that answers at once, streaming, for the load generator's tests; and
how a test starts it, in a process of its own on the cores it is given.

python -m tests.servers --port 8000 [--fail-every 5]

/health answers {"status": "ok"}; /v1/completions streams `max_tokens` chunks of one token each, then
a last chunk with the usage, with no model behind it. `--fail-every K` answers every K-th completion
request with HTTP 500, so that failed requests can be checked too.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.applications import Starlette


def start_trivial_server(port: int, cores: list[int], fail_every: int = 0) -> subprocess.Popen:
    from autotune.serving.server import HOST

    command = [sys.executable, "-m", "tests.servers", "--port", str(port), "--fail-every", str(fail_every)]
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        server = subprocess.Popen(command, start_new_session=True)
    finally:
        os.sched_setaffinity(0, mine)
    wait_healthy(f"http://{HOST}:{port}/health")
    return server


def wait_healthy(url: str, timeout_s: float = 30.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1, trust_env=False).status_code == 200:  # never through HTTP_PROXY
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout_s:.0f}s")


def build_app(fail_every: int = 0) -> Starlette:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    counter = itertools.count(1)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def completions(request: Request) -> Response:
        body = await request.json()
        if fail_every and next(counter) % fail_every == 0:
            return JSONResponse({"error": "failing on purpose"}, status_code=500)
        tokens = int(body.get("max_tokens", 16))

        async def events():
            for _ in range(tokens):
                yield f"data: {json.dumps({'choices': [{'index': 0, 'text': ' x'}]})}\n\n"
            usage = {"completion_tokens": tokens}
            yield f"data: {json.dumps({'choices': [{'index': 0, 'text': ''}], 'usage': usage})}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/health", health), Route("/v1/completions", completions, methods=["POST"])])


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--fail-every", type=int, default=0)
    args = parser.parse_args()
    uvicorn.run(build_app(args.fail_every), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
