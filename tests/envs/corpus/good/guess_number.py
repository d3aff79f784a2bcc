# expect: valid solvable
import random
import re


class GuessNumberEnv:
    """Find a hidden number in 1..50 from higher/lower feedback."""

    MAX_TURNS = 10

    def __init__(self):
        self.target = 0
        self.turn = 0
        self.done = False

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.target = rng.randint(1, 50)
        self.turn = 0
        self.done = False
        self.low, self.high = 1, 50
        return ("Guess the hidden integer between 1 and 50. Answer with \\boxed{N}. "
                f"You have {self.MAX_TURNS} guesses."), {"low": 1, "high": 50}

    def _parse(self, action):
        found = re.findall(r"\\boxed\{([^{}]*)\}", action)
        if not found:
            return None
        text = found[-1].strip()
        return int(text) if text.lstrip("-").isdigit() else None

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        guess = self._parse(action)
        if guess is None:
            obs = "Invalid action: answer with \\boxed{N} where N is an integer."
            reward, terminated = 0.0, False
        elif guess == self.target:
            obs, reward, terminated = f"Correct, it was {self.target}!", 1.0, True
        else:
            hint = "higher" if guess < self.target else "lower"
            obs, reward, terminated = f"{guess} is wrong; the number is {hint}.", 0.0, False
        truncated = not terminated and self.turn >= self.MAX_TURNS
        self.done = terminated or truncated
        return obs, reward, terminated, truncated, {"turn": self.turn}

    def solution(self):
        return f"\\boxed{{{self.target}}}"

    def close(self):
        pass
