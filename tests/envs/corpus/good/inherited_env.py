# expect: valid solvable
"""A designer habit: a small base class, the environment subclasses it, the turn limit is set in
reset (30, above the default 25), and solution() returns a bare number."""
import random
import re
from dataclasses import dataclass, field


@dataclass
class Ledger:
    entries: list = field(default_factory=list)


class BaseEnv:
    def _parse(self, action):
        found = re.findall(r"\\boxed\{([^{}]*)\}", action)
        return found[-1].strip() if found else None

    def close(self):
        pass


class SumTargetEnv(BaseEnv):
    def reset(self, seed=None, options=None):
        self.rng = random.Random(seed)
        self.max_turns = 30
        self.numbers = [self.rng.randint(1, 20) for _ in range(3)]
        self.ledger = Ledger()
        self.turn = 0
        return f"Add up {self.numbers} and answer \\boxed{{N}}. Turns: {self.max_turns}.", {"n": len(self.numbers)}

    def step(self, action):
        self.turn += 1
        answer = self._parse(action)
        self.ledger.entries.append(answer)
        if answer == str(sum(self.numbers)):
            return "Correct.", 1.0, True, False, {}
        truncated = self.turn >= self.max_turns
        return f"Not {answer!r}. Try again.", 0.0, False, truncated, {"tries": len(self.ledger.entries)}

    def solution(self):
        return sum(self.numbers)
