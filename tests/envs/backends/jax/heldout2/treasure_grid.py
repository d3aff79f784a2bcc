import random
import re


class TreasureHuntEnv:
    """Dig on a 4x4 grid; each miss tells the Manhattan distance to the treasure."""

    def __init__(self, size=4, max_turns=8):
        self.size = size
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.tx, self.ty = rng.randint(0, self.size - 1), rng.randint(0, self.size - 1)
        self.dug = [[False] * self.size for _ in range(self.size)]
        self.turns = 0
        return f"A treasure hides on a {self.size}x{self.size} grid. Dig with \\boxed{{row,col}}.", {}

    def _render(self):
        return "\n".join("".join("x" if self.dug[r][c] else "." for c in range(self.size)) for r in range(self.size))

    def step(self, action):
        self.turns += 1
        m = re.search(r"\\boxed\{\s*(\d+)\s*,\s*(\d+)\s*\}", action)
        if not m:
            return "Use \\boxed{row,col}.\n" + self._render(), -0.1, False, self.turns >= self.max_turns, {}
        r, c = int(m.group(1)), int(m.group(2))
        if not (0 <= r < self.size and 0 <= c < self.size):
            return "Off the grid.\n" + self._render(), -0.1, False, self.turns >= self.max_turns, {}
        if (r, c) == (self.tx, self.ty):
            return "You found the treasure!", 1.0, True, False, {}
        self.dug[r][c] = True
        dist = abs(r - self.tx) + abs(c - self.ty)
        return f"Nothing here. Distance: {dist}.\n" + self._render(), 0.0, False, self.turns >= self.max_turns, {}

    def solution(self):
        return [f"\\boxed{{{self.tx},{self.ty}}}"]
