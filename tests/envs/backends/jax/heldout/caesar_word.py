import random
import re

WORDS = ["apple", "river", "stone", "cloud", "tiger", "lemon", "frost", "bread"]


class CaesarShiftEnv:
    """Decode a word shifted by a secret Caesar offset; feedback says how many letters are right."""

    ALPHABET = "abcdefghijklmnopqrstuvwxyz"

    def __init__(self, max_turns=5):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.plain = rng.choice(WORDS)
        self.shift = rng.randint(1, 25)
        self.cipher = "".join(self.ALPHABET[(self.ALPHABET.index(ch) + self.shift) % 26] for ch in self.plain)
        self.turns = 0
        return f"Decode the Caesar-shifted word '{self.cipher}'. Answer with \\boxed{{word}}.", {}

    def step(self, action):
        self.turns += 1
        m = re.findall(r"\\boxed\{([^}]*)\}", action)
        guess = m[-1].strip().lower() if m else ""
        if guess == self.plain:
            return "Decoded!", 1.0, True, False, {}
        right = 0
        for i in range(min(len(guess), len(self.plain))):
            if guess[i] == self.plain[i]:
                right += 1
        done = self.turns >= self.max_turns
        return f"{right} letters in place. Cipher: '{self.cipher}'.", 0.0, False, done, {}

    def solution(self):
        return "\\boxed{" + self.plain + "}"
