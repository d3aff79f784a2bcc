# expect: valid unknown
import random


class ParityEnv:
    """Say whether a number is even or odd; no solution() method."""

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.number = self.rng.randint(0, 10**6)
        self.turns = 0
        return f"Is {self.number} even or odd? Reply \\boxed{{even}} or \\boxed{{odd}}.", {"number": self.number}

    def step(self, action):
        self.turns += 1
        answer = "even" if self.number % 2 == 0 else "odd"
        if f"\\boxed{{{answer}}}" in action:
            return "Right.", 1.0, True, False, {}
        if self.turns >= 5:
            return "Too many tries.", 0.0, False, True, {}
        return "Not right.", 0.0, False, False, {}
