import random
import re

SYMBOLS = {"A": 1, "B": 2, "C": 3, "D": 4}


class SymbolSumEnv:
    """Each symbol has a value; find the total of a random symbol string."""

    def __init__(self, length=4, max_turns=5):
        self.length = length
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.symbols = [rng.choice(list(SYMBOLS)) for _ in range(self.length)]
        self.total = 0
        for s in self.symbols:
            self.total += SYMBOLS[s]
        self.turns = 0
        legend = ", ".join(f"{k}={v}" for k, v in SYMBOLS.items())
        return f"Values: {legend}. Sum of {''.join(self.symbols)}? Answer \\boxed{{n}}.", {}

    def step(self, action):
        self.turns += 1
        m = re.findall(r"\\boxed\{(\d+)\}", action)
        if not m:
            return "Answer with \\boxed{n}.", -0.1, False, self.turns >= self.max_turns, {}
        guess = int(m[-1])
        if guess == self.total:
            return "Correct!", 1.0, True, False, {}
        direction = "high" if guess > self.total else "low"
        return f"Too {direction}. Symbols: {' '.join(self.symbols)}.", 0.0, False, self.turns >= self.max_turns, {}

    def solution(self):
        return f"\\boxed{{{self.total}}}"
