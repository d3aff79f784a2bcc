import random
import re

WORDS = ["crane", "slate", "pious", "mango", "brick", "flute", "gravy", "shore"]


class WordMatchEnv:
    """Find the hidden five-letter word; feedback counts letters in the right place."""

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.secret = rng.choice(WORDS)
        self.tries = 0
        self.best = 0
        self.finished = False
        return f"Guess the hidden word. Candidates: {', '.join(WORDS)}. Use \\boxed{{word}}.", {}

    def step(self, action):
        if self.finished:
            return "Game over.", 0.0, True, False, {}
        boxed = re.findall(r"\\boxed\{([^{}]*)\}", action)
        word = boxed[-1].strip().lower() if boxed else ""
        if word not in WORDS:
            return f"'{word}' is not a candidate. Tries: {self.tries}.", 0.0, False, False, {}
        self.tries += 1
        exact = sum(1 for i in range(5) if word[i] == self.secret[i])
        self.best = max(self.best, exact)
        if word == self.secret:
            self.finished = True
            return f"Yes, it is {self.secret.upper()}! Solved in {self.tries} tries.", 1.0, True, False, {}
        if self.tries >= 6:
            self.finished = True
            return f"No more tries; the word was {self.secret}.", 0.0, True, False, {}
        return f"{word}: {exact} letters in place (best so far {self.best}). Tries: {self.tries}/6.", 0.0, False, False, {}

    def solution(self):
        return "\\boxed{" + self.secret + "}"
