"""A stand-in env and renderer for `rl.loop.eval_rows` (tests only): eval problem i is the prompt
[prefix, i]; a response is correct when its first token is even. The fake samplers of the tests
answer [i, 0, ...] to a prompt ending in i, so item i is correct when i is even."""

from __future__ import annotations

from tinker import types


class FakeEvalEnv:
    name = "fake"

    def __init__(self, prefix: int = 1000) -> None:
        self.prefix = prefix

    def build_prompt(self, renderer, problem):
        return types.ModelInput.from_ints([self.prefix, int(problem.id)])

    def stop_sequences(self, renderer):
        return []

    def grade(self, renderer, problem, tokens_T):
        return tokens_T[0] % 2 == 0, str(tokens_T[0])


class FakeRenderer:
    def parse_response(self, tokens):
        return {"role": "assistant", "content": " ".join(map(str, tokens))}, True
