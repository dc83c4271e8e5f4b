"""A trivial OpenAI-style completions server that answers at once, streaming, for load-generator checks.

python -m benchmarks.trivial_server --port 8000 [--fail-every 5]

/health answers {"status": "ok"}; /v1/completions streams `max_tokens` chunks of one token each, then
a last chunk with the usage, with no model behind it. `--fail-every K` answers every K-th completion
request with HTTP 500, so that failed requests can be checked too.
"""

from __future__ import annotations

import argparse
import itertools
import json

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


def build_app(fail_every: int = 0) -> Starlette:
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--fail-every", type=int, default=0)
    args = parser.parse_args()
    uvicorn.run(build_app(args.fail_every), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
