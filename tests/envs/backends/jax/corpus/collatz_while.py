import random
import re


class CollatzEnv:
    def reset(self, seed=None):
        rng = random.Random(seed)
        self.n = rng.randint(2, 50)
        return f"How many Collatz steps does {self.n} take to reach 1? \\boxed{{k}}", {}

    def step(self, action):
        m = re.findall(r"\\boxed\{(\d+)\}", action)
        steps = 0
        x = self.n
        while x != 1:
            x = x // 2 if x % 2 == 0 else 3 * x + 1
            steps += 1
        ok = bool(m) and int(m[-1]) == steps
        return ("Right!" if ok else f"No, it takes {steps} steps."), 1.0 if ok else 0.0, True, False, {}
