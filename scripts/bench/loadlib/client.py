"""Send a workload to an OpenAI-compatible server and time every streamed chunk.

Each request is a streaming chat completion (temperature 0) sent at its arrival
time, at most `concurrency` in flight; the whole run stops at `time_limit_s`, and
whatever is still open then counts as an error. Only loopback addresses are
accepted: a load test must never leave this machine.
"""

import asyncio
import json
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

import httpx

from .workload import LoadRequest

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass
class Outcome:
    """What one client saw. sent: when its request went out (perf_counter);
    chunk_times: when each content chunk arrived; tokens: completion tokens (the
    usage the server reported, else the content chunks); error: why it failed (None
    when it finished or was cancelled on purpose)."""

    index: int
    kind: str
    sent: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    tokens: int = 0
    prompt_tokens: int = 0
    status: int | None = None
    error: str | None = None
    cancelled: bool = False
    finish_reason: str | None = None

    @property
    def ttft_s(self) -> float | None:
        if self.sent is None or not self.chunk_times:
            return None
        return self.chunk_times[0] - self.sent

    @property
    def itl_s(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]


def require_loopback(url: str) -> None:
    host = urlparse(url).hostname
    if host not in LOOPBACK:
        raise ValueError(
            f"{url} is not a loopback address: the load test only runs against "
            "127.0.0.1 or localhost"
        )


class Unreachable(Exception):
    """Nothing answers at the load test's URL: no request was sent."""


async def model_id(client: httpx.AsyncClient) -> str | None:
    """The first model GET /v1/models lists, or None (then no model is sent).
    Unreachable when the address does not answer at all."""
    try:
        response = await client.get("/v1/models")
    except httpx.TransportError as error:
        raise Unreachable(f"cannot reach {client.base_url} ({error})") from None
    try:
        data = response.json().get("data") or []
    except (ValueError, AttributeError):
        return None
    return data[0]["id"] if data else None


async def one_request(
    client: httpx.AsyncClient, request: LoadRequest, model: str | None
) -> Outcome:
    outcome = Outcome(request.index, request.kind)
    body = {
        "messages": [{"role": "user", "content": request.question}],
        "max_tokens": request.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if model is not None:
        body["model"] = model
    outcome.sent = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            outcome.status = response.status_code
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                outcome.error = f"HTTP {response.status_code}: {text[:200]}"
                return outcome
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    outcome.error = f"stream error: {chunk['error']}"
                    return outcome
                read_chunk(chunk, outcome)
                if request.cancel_after is not None and (
                    len(outcome.chunk_times) >= request.cancel_after
                ):
                    outcome.cancelled = True
                    return outcome  # leaving the block closes the connection
    except (httpx.HTTPError, json.JSONDecodeError) as error:
        outcome.error = f"{type(error).__name__}: {error}"
    if not outcome.tokens:
        outcome.tokens = len(outcome.chunk_times)
    return outcome


def read_chunk(chunk: dict, outcome: Outcome) -> None:
    for choice in chunk.get("choices") or []:
        if (choice.get("delta") or {}).get("content"):
            outcome.chunk_times.append(time.perf_counter())
        if choice.get("finish_reason"):
            outcome.finish_reason = choice["finish_reason"]
    usage = chunk.get("usage")
    if usage:
        outcome.tokens = usage.get("completion_tokens", 0)
        outcome.prompt_tokens = usage.get("prompt_tokens", 0)


async def run_load(
    url: str,
    requests: list[LoadRequest],
    concurrency: int,
    time_limit_s: float,
    api_key: str | None = None,
    model: str | None = None,
) -> tuple[list[Outcome], float]:
    """Send every request at its arrival time; returns the outcomes (in request
    order) and the wall-clock seconds from the first arrival to the last finish.
    Unreachable, before any request, when nothing answers at `url`."""
    require_loopback(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=concurrency + 4)
    timeout = httpx.Timeout(time_limit_s)
    async with httpx.AsyncClient(
        base_url=url, headers=headers, timeout=timeout, limits=limits
    ) as client:
        listed = await model_id(client)  # first: Unreachable before any request
        model = model or listed
        gate = asyncio.Semaphore(concurrency)
        start = time.perf_counter()

        async def at_arrival(request: LoadRequest) -> Outcome:
            await asyncio.sleep(
                max(0.0, start + request.arrival_s - time.perf_counter())
            )
            async with gate:
                return await one_request(client, request, model)

        tasks = [asyncio.create_task(at_arrival(r)) for r in requests]
        done, pending = await asyncio.wait(tasks, timeout=time_limit_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        wall = time.perf_counter() - start
    outcomes = []
    for request, task in zip(requests, tasks):
        if task in done and task.exception() is None:
            outcomes.append(task.result())
        else:
            reason = "time limit" if task in pending else repr(task.exception())
            outcomes.append(Outcome(request.index, request.kind, error=reason))
    return outcomes, wall
