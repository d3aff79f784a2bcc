import random
import re


class DigitSumEnv:
    """Find the digit sum of a number after it is multiplied by a factor."""

    def __init__(self, max_turns=5):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.base = rng.randint(100, 999)
        self.factor = rng.randint(2, 9)
        self.turns = 0
        self._answer = sum(int(d) for d in str(self.base * self.factor))
        return f"Compute {self.base} x {self.factor}, then add up the digits of the product. Answer in \\boxed{{}}.", {}

    def step(self, action):
        self.turns += 1
        m = re.search(r"\\boxed\{(\d+)\}", action)
        if not m:
            return "Please answer with \\boxed{number}.", -0.1, False, self.turns >= self.max_turns, {}
        if int(m.group(1)) == self._answer:
            return "Correct!", 1.0, True, False, {}
        return f"Incorrect. Compute {self.base} x {self.factor} and sum the digits.", 0.0, False, \
            self.turns >= self.max_turns, {}

    def solution(self):
        return f"\\boxed{{{self._answer}}}"
