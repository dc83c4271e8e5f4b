"""Write the bundled demo trace (autotune/data/demo-trace.jsonl), seeded: the same file every run.

It imitates the shapes BurstGPT (Wang et al., arXiv 2401.17644, Azure OpenAI traces) reports of real traffic, scaled
into the demo model's 512 positions: arrivals in bursts (Gamma inter-arrival times of shape 0.5, a coefficient of
variation of 1.4 where Poisson arrivals have 1), long-tailed request and response lengths (bounded Zipf draws), and a
few multi-turn conversations (ShareGPT-like: each turn resends the conversation so far). Prompts are text: passages
of the bundled corpus, cut at whole words to the drawn length in the demo tokenizer's tokens, so that quality is
judged on the trace's own prompts.

    python benchmarks/traffic/make_demo_trace.py [--check]

--check: exit 1 when the committed file differs from what this script writes (the file and the script agree).
Needs the demo model's tokenizer (built by `make demo` or the tests, in the autotune cache).
"""

from __future__ import annotations

import argparse
import json
import random
import sys

from transformers import AutoTokenizer

from autotune.data import CORPUS, DATA_DIR
from autotune.paths import DEMO_MAX_POSITIONS, default_cache_dir, demo_model_path

OUT = DATA_DIR / "demo-trace.jsonl"
SEED = 2026
SINGLE_TURN = 36  # requests alone
CONVERSATIONS = 4  # of TURNS turns each
TURNS = 3
GAMMA_SHAPE = 0.5  # inter-arrival times: Gamma(shape, scale) of mean shape * scale
MEAN_GAP_S = 0.5
INPUT_TOKENS = (16, 300)  # a single turn's prompt, bounded Zipf
OUTPUT_TOKENS = (4, 160)  # a response, bounded Zipf
TURN_TOKENS = (8, 48)  # a later turn's own message
ZIPF_EXPONENT = 1.1


def zipf(rng: random.Random, low: int, high: int) -> int:
    """A draw of a bounded Zipf law: P(k) proportional to k^-a on [low, high]."""
    values = range(low, high + 1)
    return rng.choices(values, weights=[k**-ZIPF_EXPONENT for k in values])[0]


class Passages:
    """Text of the corpus cut to a number of tokens, at whole words, from places the draws pick."""

    def __init__(self, tokenizer: object, rng: random.Random) -> None:
        self.tokenizer = tokenizer
        self.words = CORPUS.read_text().split()
        self.rng = rng

    def text(self, tokens: int) -> str:
        start = self.rng.randrange(len(self.words) - 4 * tokens)
        words: list[str] = []
        for word in self.words[start:]:
            candidate = " ".join([*words, word])
            if len(self.tokenizer(candidate, add_special_tokens=False)["input_ids"]) > tokens:
                break
            words.append(word)
        return " ".join(words)

    def tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def requests(tokenizer: object) -> list[dict]:
    rng = random.Random(SEED)
    passages = Passages(tokenizer, rng)
    singles = [
        {"prompt": passages.text(zipf(rng, *INPUT_TOKENS)), "output_tokens": zipf(rng, *OUTPUT_TOKENS)}
        for _ in range(SINGLE_TURN)
    ]
    clock = 0.0
    for request in singles:
        request["arrival_s"] = round(clock, 3)
        clock += rng.gammavariate(GAMMA_SHAPE, MEAN_GAP_S / GAMMA_SHAPE)
    turns = []
    for number in range(CONVERSATIONS):
        at = rng.uniform(0, clock / 4)  # early, so that a window of the first requests holds whole conversations
        held = 0  # the conversation so far: every turn's prompt and reply
        for _ in range(TURNS):
            prompt = passages.text(zipf(rng, *TURN_TOKENS))
            reply = passages.text(zipf(rng, *OUTPUT_TOKENS))
            held += passages.tokens(prompt)
            output = passages.tokens(reply)
            if held + output > DEMO_MAX_POSITIONS:
                break
            turns.append({"prompt": prompt, "reply": reply, "arrival_s": round(at, 3), "conversation": f"c{number}"})
            held += output
            at += rng.uniform(1.0, 3.0)  # the user reads the reply, then writes the next turn
    return sorted(singles + turns, key=lambda request: request["arrival_s"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with the committed file; write nothing")
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(demo_model_path(default_cache_dir()))
    text = "".join(json.dumps(request) + "\n" for request in requests(tokenizer))
    if args.check:
        same = OUT.read_text() == text
        print(f"{OUT}: {'as this script writes it' if same else 'differs from what this script writes'}")
        return 0 if same else 1
    OUT.write_text(text)
    print(f"wrote {OUT}: {text.count(chr(10))} requests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
