import random
import re
from typing import Tuple


def verify_answer(player_answer, solution):
    return str(player_answer).strip() == str(solution).strip()


class HiddenNumberEnv:
    """Guess the hidden number between 1 and 100 with higher/lower hints."""

    def __init__(self, max_turns=8, **kwargs):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None) -> Tuple[str, dict]:
        rng = random.Random(seed)
        self._answer = rng.randint(1, 100)
        self.low, self.high = 1, 100
        self.turn_count = 0
        return "I am thinking of a number from 1 to 100. Guess it with \\boxed{n}.", {}

    def solution(self) -> str:
        return str(self._answer)

    def step(self, action: str) -> Tuple[str, float, bool, bool, dict]:
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]+)\}", action)
        if match and verify_answer(match.group(1), self.solution()):
            return "Correct! You found the number.", 1.0, True, False, {}
        if not match:
            return f"Use \\boxed{{n}}. Range: {self.low}-{self.high}.", -0.1, False, truncated, {}
        try:
            guess = int(match.group(1).strip())
        except ValueError:
            return f"'{match.group(1)}' is not a number. Range: {self.low}-{self.high}.", -0.1, False, truncated, {}
        if guess < self._answer:
            self.low = max(self.low, guess + 1)
            hint = "higher"
        else:
            self.high = min(self.high, guess - 1)
            hint = "lower"
        if truncated:
            return f"Time's up. The answer was {self.solution()}.", 0.0, False, True, {}
        return f"Wrong, go {hint}. Range: {self.low}-{self.high}.", 0.0, False, False, {}
