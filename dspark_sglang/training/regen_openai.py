"""Response regeneration against running SGLang servers (``data.generator: openai``).

Each prompt is one ``POST /v1/completions`` request (SGLang's OpenAI-compatible API):
the prompt goes as token ids (``prompt: [ids]``, the chat template already applied) and
``return_token_ids: true`` (an SGLang extension of that API) returns the sampled ids in
``choices[0].token_ids``, so no text round trip can change a token. Sampling is
``datagen``'s: ``data.temperature`` (1 unless set; 0 is greedy), no top-k / top-p /
min-p, stop at the EOS ids (``stop_token_ids``),
``seed = seed_for_prompt(data.seed, prompt id)`` (SGLang's ``sampling_seed``).

Invariants:

* At most ``max_in_flight`` requests are open at once, over all servers; request ``k``
  goes to ``urls[k % len(urls)]`` (round robin), so servers share the load evenly.
* Shards are yielded in batch order once all their prompts are back; a request that
  fails (after ``RETRIES`` tries on connection errors and 5xx answers) stops the run
  with the server and the prompt named, and cancels what was not sent yet. What was
  indexed stays; the next run resumes from there.
* A server samples reproducibly per seed only when it runs with
  ``--enable-deterministic-inference`` (a GPU server; see ``regen_sglang``). Which
  server served a prompt never matters when it does.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from dspark_sglang.training.datagen import (
    EncodedPrompt,
    GenerationSettings,
    ShardSampler,
    ShardWork,
    seed_for_prompt,
)

RETRIES = 3
#: Seconds to wait for one completion (a long response on a loaded CPU server is slow).
REQUEST_TIMEOUT = 3600.0


def completion_body(
    model: str, prompt: EncodedPrompt, settings: GenerationSettings, eos_token_ids: Sequence[int]
) -> dict[str, Any]:
    """The ``/v1/completions`` request for one training prompt (module docstring)."""
    return {
        "model": model,
        "prompt": list(prompt.prompt_ids),
        "max_tokens": settings.max_new_tokens,
        "temperature": float(settings.temperature),
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "seed": seed_for_prompt(settings.seed, prompt.id),
        "stop_token_ids": sorted({int(e) for e in eos_token_ids}),
        "ignore_eos": False,
        "return_token_ids": True,
        "stream": False,
    }


def _request(
    url: str, body: dict[str, Any] | None, timeout: float, tries: int = RETRIES
) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    last: Exception | None = None
    for attempt in range(tries):
        if attempt:
            time.sleep(min(2.0**attempt, 10.0))
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return dict(json.loads(r.read()))
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                detail = exc.read().decode(errors="replace")[:500]
                raise RuntimeError(f"{url} refused the request ({exc.code}): {detail}") from exc
            last = exc
        except (urllib.error.URLError, OSError) as exc:
            last = exc
    raise RuntimeError(
        f"{url} did not answer after {tries} tries ({last}); check that the SGLang server "
        "in data.generator_urls is up"
    )


def served_model(base_url: str, timeout: float = 30.0) -> str:
    """The model id a server serves (``GET /v1/models``); also checks it is reachable."""
    try:
        models = _request(base_url + "/v1/models", None, timeout, tries=1)
    except RuntimeError as exc:
        raise RuntimeError(f"data.generator_urls: {exc}") from exc
    data = models.get("data") or []
    if not data or not isinstance(data[0], dict) or "id" not in data[0]:
        raise RuntimeError(
            f"data.generator_urls: {base_url}/v1/models lists no model ({models!r}); "
            "is it an SGLang server?"
        )
    return str(data[0]["id"])


def _complete(
    base_url: str,
    model: str,
    prompt: EncodedPrompt,
    settings: GenerationSettings,
    eos_token_ids: Sequence[int],
    timeout: float,
) -> list[int]:
    out = _request(
        base_url + "/v1/completions",
        completion_body(model, prompt, settings, eos_token_ids),
        timeout,
    )
    choice = (out.get("choices") or [{}])[0]
    ids = choice.get("token_ids")
    if not isinstance(ids, list):
        raise RuntimeError(
            f"{base_url}/v1/completions returned no token_ids for prompt {prompt.id!r} "
            "(return_token_ids needs an SGLang server, 0.5.23 or later)"
        )
    if choice.get("finish_reason") == "abort":
        raise RuntimeError(f"{base_url} aborted prompt {prompt.id!r}: {choice}")
    return [int(t) for t in ids]


def server_sampler(
    base_urls: Sequence[str],
    settings: GenerationSettings,
    eos_token_ids: Sequence[int],
    max_in_flight: int,
    timeout: float = REQUEST_TIMEOUT,
) -> ShardSampler:
    """A ``ShardSampler`` over running SGLang servers (module invariants)."""
    urls = [u.rstrip("/") for u in base_urls]
    if not urls:
        raise ValueError("data.generator_urls is empty; list the SGLang servers' base URLs")

    def sample(todo: Sequence[ShardWork]) -> Iterator[tuple[int, list[list[int]], float]]:
        if not todo:
            return
        models = [served_model(u) for u in urls]  # every server is up before any work
        pool = ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="regen")
        try:
            futures: list[list[Future[list[int]]]] = []
            k = 0
            for _, batch in todo:
                row = []
                for p in batch:
                    s = k % len(urls)
                    row.append(
                        pool.submit(
                            _complete, urls[s], models[s], p, settings, eos_token_ids, timeout
                        )
                    )
                    k += 1
                futures.append(row)
            t_last = time.perf_counter()
            for (b, _), row in zip(todo, futures, strict=True):
                ids = [f.result() for f in row]
                now = time.perf_counter()
                # Wall time since the previous shard came back: the shards' seconds sum to
                # the run's wall time, so index throughput is what the servers delivered.
                secs, t_last = now - t_last, now
                yield b, ids, secs
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    return sample
