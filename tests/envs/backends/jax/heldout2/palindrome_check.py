import random
import re

WORDS = ["level", "rotor", "apple", "civic", "stone", "kayak", "robot", "radar"]


class PalindromeEnv:
    """Is the shown word a palindrome? Then give its reverse."""

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.word = rng.choice(WORDS)
        self.is_pal = self.word == self.word[::-1]
        self.stage = 0
        self.turns = 0
        return f"Word: {self.word}. Is it a palindrome? \\boxed{{yes}} or \\boxed{{no}}.", {}

    def step(self, action):
        self.turns += 1
        m = re.findall(r"\\boxed\{([^}]*)\}", action)
        ans = m[-1].strip().lower() if m else ""
        if self.stage == 0:
            expected = "yes" if self.is_pal else "no"
            if ans == expected:
                self.stage = 1
                return f"Right. Now type {self.word} backwards.", 0.0, False, False, {}
            return f"Wrong. Look at {self.word} again.", 0.0, False, self.turns >= 6, {}
        if ans == self.word[::-1]:
            return "Perfect!", 1.0, True, False, {}
        return "Not the reverse.", 0.0, False, self.turns >= 6, {}

    def solution(self):
        return ["\\boxed{" + ("yes" if self.is_pal else "no") + "}", "\\boxed{" + self.word[::-1] + "}"]
