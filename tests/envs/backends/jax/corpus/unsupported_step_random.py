import random
import re


class DiceDuelEnv:
    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.score = 0
        return "Roll with \\boxed{roll} or stop with \\boxed{stop}.", {}

    def step(self, action):
        if "roll" in action:
            roll = self.rng.randint(1, 6)
            self.score += roll
            return f"You rolled {roll}; total {self.score}.", 0.0, False, False, {}
        return f"Final score {self.score}.", min(1.0, self.score / 20), True, False, {}
