import random
import re

WORDS = ["planet", "garden", "silver", "rocket", "castle", "bridge"]


class ScrambleEnv:
    """Unscramble the word; wrong guesses reveal how many letters are in the right spot."""

    def __init__(self, max_turns=5):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.word = rng.choice(WORDS)
        letters = list(self.word)
        rng.shuffle(letters)
        self.scrambled = "".join(letters)
        self.turns = 0
        return f"Unscramble: {self.scrambled.upper()}. Answer with \\boxed{{word}}.", {}

    def step(self, action):
        self.turns += 1
        m = re.findall(r"\\boxed\{([a-zA-Z]+)\}", action)
        guess = m[-1].lower() if m else ""
        if guess == self.word:
            return "Solved!", 1.0, True, False, {}
        same = sum(1 for a, b in zip(guess, self.word) if a == b)
        return f"{same} letters in place. Scrambled: {self.scrambled.upper()}", 0.0, False, \
            self.turns >= self.max_turns, {}

    def solution(self):
        return "\\boxed{" + self.word + "}"
