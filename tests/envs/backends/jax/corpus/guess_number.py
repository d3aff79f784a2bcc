import random
import re


class GuessNumberEnv:
    """Guess a hidden number with higher/lower hints."""

    def __init__(self, low=1, high=50, max_turns=8):
        self.low = low
        self.high = high
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.secret = rng.randint(self.low, self.high)
        self.turns = 0
        self.last_hint = "none yet"
        return self._obs("I picked a number."), {}

    def _obs(self, msg):
        return (f"{msg} It is between {self.low} and {self.high}. Turns used: {self.turns}/{self.max_turns}. "
                f"Last hint: {self.last_hint}. Answer with \\boxed{{n}}.")

    def step(self, action):
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        if match is None:
            return self._obs("Please put your guess in \\boxed{}."), -0.1, False, False, {}
        try:
            guess = int(match.group(1).strip())
        except ValueError:
            return self._obs("That is not a number."), -0.1, False, False, {}
        self.turns += 1
        if guess == self.secret:
            return f"Correct! The number was {self.secret}.", 1.0, True, False, {}
        if guess < self.secret:
            self.last_hint = "higher"
        else:
            self.last_hint = "lower"
        if self.turns >= self.max_turns:
            return f"Out of turns. The number was {self.secret}.", 0.0, False, True, {}
        return self._obs(f"Your guess {guess} is wrong."), 0.0, False, False, {}

    def solution(self):
        return [f"\\boxed{{{self.secret}}}"]

    def close(self):
        pass
