import random
import re


class HistoryEnv:
    def reset(self, seed=None):
        rng = random.Random(seed)
        self.target = rng.randint(1, 9)
        self.history = []
        return "Guess a digit: \\boxed{d}", {}

    def step(self, action):
        m = re.findall(r"\\boxed\{(\d)\}", action)
        if not m:
            return "Invalid.", 0.0, False, False, {}
        self.history.append(int(m[-1]))
        if int(m[-1]) == self.target:
            return "Yes!", 1.0, True, False, {}
        return "Guesses so far: " + ", ".join(str(g) for g in self.history), 0.0, False, len(self.history) >= 5, {}
