"""The post-wake check: a short greedy probe of an instance, recorded at its first ready and replayed after
every wake, before the instance is reported awake.

A sleep/wake cycle can corrupt a model while every route keeps answering 200 (garbage output was reported
for torch_memory_saver after a few cycles). So at its first ready the launcher asks the instance for a
greedy completion of PROBE_TOKENS tokens of a fixed prompt, through vLLM's `/v1/completions`
(`temperature 0`, the token IDs of prompt and answer with `return_token_ids`, and where the runtime gives
them the log-probabilities of each token and its runner-up, `logprobs` with `return_tokens_as_token_ids`).
After a wake it sends the recorded prompt token IDs and compares the answer:

- every generated token must be the recorded one, with a log-probability within LOGPROB_TOLERANCE of the
  recorded one;
- but at a near tie — where the recorded token and its runner-up were within LOGPROB_TOLERANCE of each
  other and the replay took the runner-up — greedy decoding may go either way (a GPU's arithmetic
  changes with the batch), so the two answers part there and the check passes.

Anything else (other tokens, another length, log-probabilities off, no answer) is a failure; what to do
about it is the caller's (the launcher kills the instance).
"""

import json
import math
from dataclasses import dataclass
from typing import Any

import aiohttp

from api.launcher import WakeProbe

PROBE_PROMPT = "A model woken from sleep should answer this prompt exactly as it did before it slept:"
PROBE_TOKENS = 4
TOP_LOGPROBS = 2  # each token's and its runner-up's
LOGPROB_TOLERANCE = 0.1  # nats
# A replay after a wake answers in under a second (vLLM on a CPU); 60 s tells a stuck server from a busy one. The
# first answer, recorded at the first ready, carries the runtime's own warm-up: vLLM on a CPU takes 2-5 s quiet, but
# 23-53 s were seen on 2 busy cores (load average 5-11), so its bound is 300 s: 60x the quiet figure.
PROBE_TIMEOUT_S, FIRST_PROBE_TIMEOUT_S = 60.0, 300.0
PROBE_TIMEOUT = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S, connect=5)
FIRST_PROBE_TIMEOUT = aiohttp.ClientTimeout(total=FIRST_PROBE_TIMEOUT_S, connect=5)
COMPLETIONS_PATH = "/v1/completions"
_TOKEN_ID_PREFIX = "token_id:"  # how return_tokens_as_token_ids names a token


class ProbeError(Exception):
    """The server did not answer the probe as a model server does; the message says how."""


@dataclass(frozen=True)
class ProbeAnswer:
    """One answer to the probe: what was generated, and how likely each token and its runner-up were."""

    prompt_token_ids: list[int] | None
    token_ids: list[int]
    logprobs: list[float] | None = None
    runners_up: list[tuple[int, float] | None] | None = None  # per token: the next most likely one

    def recorded(self) -> WakeProbe:
        return WakeProbe(prompt_token_ids=self.prompt_token_ids, token_ids=self.token_ids, logprobs=self.logprobs)


def request_body(prompt: str | list[int], logprobs: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": PROBE_TOKENS, "temperature": 0, "return_token_ids": True}
    if logprobs:
        body |= {"logprobs": TOP_LOGPROBS, "return_tokens_as_token_ids": True}
    return body


async def ask(
    session: aiohttp.ClientSession, base_url: str, prompt: str | list[int], logprobs: bool, limit: aiohttp.ClientTimeout
) -> ProbeAnswer:
    """The instance's answer to the probe (`prompt`: the text the first time, the recorded token IDs after), within
    `limit` (FIRST_PROBE_TIMEOUT or PROBE_TIMEOUT)."""
    try:
        async with session.post(
            f"{base_url}{COMPLETIONS_PATH}", json=request_body(prompt, logprobs), timeout=limit
        ) as response:
            text = await response.text()
            status = response.status
    except TimeoutError:
        raise ProbeError(f"no answer to POST {COMPLETIONS_PATH} within {limit.total:g} s") from None
    except aiohttp.ClientError as err:
        raise ProbeError(f"no answer to POST {COMPLETIONS_PATH}: {err!r}") from None
    if status != 200:
        raise ProbeError(f"POST {COMPLETIONS_PATH} answered {status}: {text[:300]}")
    try:
        choice = json.loads(text)["choices"][0]
        return parse_choice(choice, logprobs)
    except (ValueError, KeyError, IndexError, TypeError) as err:
        raise ProbeError(f"POST {COMPLETIONS_PATH} answered what is not a completion ({err!r}): {text[:300]}") from None


def _token_id(name: object) -> int:
    if isinstance(name, str) and name.startswith(_TOKEN_ID_PREFIX):
        return int(name.removeprefix(_TOKEN_ID_PREFIX))
    raise ValueError(f"{name!r} is not a token named by its ID")


def _ints(value: object) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(f"{value!r} is not a list of token IDs")
    return value


def parse_choice(choice: dict[str, Any], logprobs: bool) -> ProbeAnswer:
    """The probe's answer in a completion choice: `token_ids` (or the tokens of `logprobs`), and with
    `logprobs` each token's log-probability and its best other candidate. An answer cut short (a sleep
    aborts what is running) is no answer."""
    finish_reason = choice.get("finish_reason", "length")
    if finish_reason not in ("length", "stop"):
        raise ValueError(f"the answer was cut short (finish_reason {finish_reason!r})")
    table = choice.get("logprobs") if logprobs else None
    if table is None:
        if logprobs:
            raise ValueError("no logprobs in the answer")
        token_ids = _ints(choice.get("token_ids"))
        return ProbeAnswer(_prompt_ids(choice), token_ids)
    named = [_token_id(t) for t in table["tokens"]]
    token_ids = _ints(choice["token_ids"]) if choice.get("token_ids") is not None else named
    values = [float(v) for v in table["token_logprobs"]]
    tops = table.get("top_logprobs") or [None] * len(token_ids)
    runners_up: list[tuple[int, float] | None] = []
    for token, top in zip(token_ids, tops, strict=True):
        others = sorted(((lp, _token_id(t)) for t, lp in (top or {}).items() if _token_id(t) != token), reverse=True)
        runners_up.append((others[0][1], float(others[0][0])) if others else None)
    if not len(values) == len(token_ids) == len(named):
        raise ValueError("the logprobs do not match the tokens")
    return ProbeAnswer(_prompt_ids(choice), token_ids, values, runners_up)


def _prompt_ids(choice: dict[str, Any]) -> list[int] | None:
    ids = choice.get("prompt_token_ids")
    return None if ids is None else _ints(ids)


def compare(recorded: ProbeAnswer, replayed: ProbeAnswer) -> str | None:
    """None when `replayed` answers as `recorded` did (see the module's rules); else what differs."""
    for position, (before, after) in enumerate(zip(recorded.token_ids, replayed.token_ids, strict=False)):
        lp_before = recorded.logprobs[position] if recorded.logprobs else None
        lp_after = replayed.logprobs[position] if replayed.logprobs else None
        if before == after:
            if lp_before is not None and lp_after is not None and not _close(lp_before, lp_after):
                return (
                    f"token {position} ({before}) has log-probability {lp_after:.4f}, recorded {lp_before:.4f} "
                    f"(tolerance {LOGPROB_TOLERANCE})"
                )
            continue
        if _near_tie(recorded, position, after):
            return None  # taken the other way: the answers part here
        answers = f"answer {replayed.token_ids}, recorded {recorded.token_ids}"
        return f"token {position} is {after}, recorded {before} ({answers})"
    if len(recorded.token_ids) != len(replayed.token_ids):
        return f"the answer has {len(replayed.token_ids)} tokens {replayed.token_ids}, recorded {recorded.token_ids}"
    return None


def _near_tie(recorded: ProbeAnswer, position: int, token: int) -> bool:
    """Whether `token` was the recorded runner-up at `position`, within the tolerance of the token taken."""
    runner_up = recorded.runners_up[position] if recorded.runners_up else None
    if runner_up is None or recorded.logprobs is None or runner_up[0] != token:
        return False
    return _close(runner_up[1], recorded.logprobs[position])


def _close(a: float, b: float) -> bool:
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= LOGPROB_TOLERANCE
