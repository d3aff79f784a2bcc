import random
import re

NAMES = ["ana", "ben", "cy"]


class LedgerEnv:
    """Transfers move money between accounts; report who ends with the most."""

    def __init__(self, max_turns=3, **kwargs):
        self.max_turns = max_turns
        self.accounts = {}
        self.log = []

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.accounts = {name: rng.randint(10, 50) for name in NAMES}
        lines = []
        for _ in range(3):
            src = rng.choice(NAMES)
            dst = rng.choice([n for n in NAMES if n != src])
            amount = rng.randint(1, 10)
            self.accounts[src] -= amount
            self.accounts[dst] += amount
            lines.append(f"{src} pays {dst} {amount}")
        start = ", ".join(f"{n}: {b}" for n, b in self.accounts.items())
        self.best = max(NAMES, key=lambda n: self.accounts[n])
        self.turns = 0
        return f"Final balances are hidden. Transfers: {'; '.join(lines)}. Balances now: {start}. " \
               "Who has the most? \\boxed{name}", {}

    def step(self, action):
        self.turns += 1
        m = re.findall(r"\\boxed\{(\w+)\}", action)
        name = m[-1].strip().lower() if m else ""
        if name == self.best:
            return "Correct!", 1.0, True, False, {}
        if name not in self.accounts:
            return f"Unknown account '{name}'.", -0.1, False, self.turns >= self.max_turns, {}
        return f"No, {name} has {self.accounts[name]}.", 0.0, False, self.turns >= self.max_turns, {}

    def solution(self):
        return "\\boxed{" + self.best + "}"
