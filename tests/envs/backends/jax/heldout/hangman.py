import random
import re

WORDS = ["python", "jigsaw", "garden", "rocket", "planet", "violet"]


class HangmanEnv:
    """Guess the letters of a six-letter word before running out of lives."""

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.word = rng.choice(WORDS)
        self.revealed = [False] * 6
        self.lives = 6
        self.turns = 0
        return f"Word: {self._pattern()} Lives: {self.lives}. Guess a letter with \\boxed{{x}}.", {}

    def _pattern(self):
        return " ".join(ch if self.revealed[i] else "_" for i, ch in enumerate(self.word))

    def step(self, action):
        self.turns += 1
        m = re.findall(r"\\boxed\{([a-zA-Z])\}", action)
        if not m:
            return f"Guess one letter. Word: {self._pattern()}", -0.1, False, self.turns >= 12, {}
        letter = m[-1].lower()
        hit = False
        for i in range(6):
            if self.word[i] == letter and not self.revealed[i]:
                self.revealed[i] = True
                hit = True
        if not hit:
            self.lives -= 1
        if all(self.revealed):
            return f"You solved it: {self.word}!", 1.0, True, False, {}
        if self.lives <= 0:
            return f"Out of lives. The word was {self.word}.", 0.0, True, False, {}
        verdict = "Yes" if hit else "No"
        return f"{verdict}. Word: {self._pattern()} Lives: {self.lives}.", 0.0, False, self.turns >= 12, {}

    def solution(self):
        return ["\\boxed{" + ch + "}" for ch in sorted(set(self.word))]
