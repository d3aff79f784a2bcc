import random
import re

WORDS = ["orange", "umbrella", "eagle", "island", "onion", "avocado", "igloo"]
VOWELS = "aeiou"


class VowelCountEnv:
    """Count the vowels in a word, then name its first vowel."""

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.word = rng.choice(WORDS)
        self.stage = 0
        self.turns = 0
        return f"Word: {self.word.upper()}. Stage 1: how many vowels does it have? \\boxed{{n}}", {}

    def _vowels(self):
        return sum(1 for ch in self.word if ch in VOWELS)

    def step(self, action):
        self.turns += 1
        found = re.findall(r"\\boxed\{([^}]*)\}", action)
        answer = found[-1].strip().lower() if found else ""
        if self.turns > 8:
            return "Too many turns.", 0.0, False, True, {}
        if self.stage == 0:
            if answer.isdigit() and int(answer) == self._vowels():
                self.stage = 1
                return f"Right. Stage 2: which vowel comes first in {self.word.upper()}? \\boxed{{v}}", 0.5, False, \
                    False, {}
            return f"Not {answer}. Count the vowels of {self.word.upper()}.", 0.0, False, False, {}
        first = ""
        for ch in self.word:
            if ch in VOWELS:
                first = ch
                break
        if answer == first:
            return "Correct, well done.", 1.0, True, False, {}
        return "No, try another vowel.", 0.0, False, False, {}

    def solution(self):
        first = [ch for ch in self.word if ch in VOWELS][0]
        return ["\\boxed{" + str(self._vowels()) + "}", "\\boxed{" + first + "}"]
