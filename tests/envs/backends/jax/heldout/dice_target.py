import random
import re


class DiceTargetEnv:
    """Two dice are rolled (re-rolled until they differ); name the larger die and the sum."""

    def __init__(self, max_turns=3):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.a = rng.randint(1, 6)
        self.b = rng.randint(1, 6)
        while self.a == self.b:
            self.b = rng.randint(1, 6)
        self.scores = {"sum": self.a + self.b, "max": max(self.a, self.b), "diff": abs(self.a - self.b)}
        self.ask = rng.choice(list(self.scores.keys()))
        self.turns = 0
        return f"Dice show {self.a} and {self.b}. What is their {self.ask}? Answer with \\boxed{{n}}.", {}

    def step(self, action):
        self.turns += 1
        m = re.search(r"\\boxed\{(-?\d+)\}", action)
        if m is None:
            return "Answer with a number in \\boxed{}.", -0.1, False, self.turns >= self.max_turns, {}
        value = int(m.group(1))
        if value == self.scores[self.ask]:
            return f"Yes, the {self.ask} is {value}.", 1.0, True, False, {}
        return f"No. Dice: {self.a} and {self.b}; asked: {self.ask}.", 0.0, False, self.turns >= self.max_turns, {}

    def solution(self):
        return "\\boxed{" + str(self.scores[self.ask]) + "}"
