# expect: valid solvable
import re

import numpy as np


class MatrixTraceEnv:
    """Compute the trace of a small integer matrix (numpy inside the sandbox)."""

    max_turns = 3

    def reset(self, seed=None):
        rng = np.random.default_rng(seed)
        self.matrix = rng.integers(-9, 10, size=(3, 3))
        self.turn = 0
        rows = "\n".join(" ".join(f"{v:3d}" for v in row) for row in self.matrix)
        return f"What is the trace of this matrix? Answer as \\boxed{{N}}.\n{rows}", {}

    def step(self, action):
        self.turn += 1
        m = re.findall(r"\\boxed\{\s*(-?\d+)\s*\}", action)
        correct = bool(m) and int(m[-1]) == int(np.trace(self.matrix))
        if correct:
            return "Correct.", 1.0, True, False, {"trace": int(np.trace(self.matrix))}
        if self.turn >= self.max_turns:
            return "Out of attempts.", 0.0, True, False, {}
        return "Wrong, try again.", 0.0, False, False, {"attempts_left": self.max_turns - self.turn}

    def solution(self):
        return [str(int(np.trace(self.matrix)))]
