import random
import re


class GridWalkEnv:
    """Walk from a random start to a random goal on a 5x5 grid; the start is redrawn until it
    differs from the goal."""

    SIZE = 5
    MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}

    def __init__(self, max_turns=12):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.goal_r = rng.randint(0, self.SIZE - 1)
        self.goal_c = rng.randint(0, self.SIZE - 1)
        self.r = rng.randint(0, self.SIZE - 1)
        self.c = rng.randint(0, self.SIZE - 1)
        while self.r == self.goal_r and self.c == self.goal_c:
            self.r = rng.randint(0, self.SIZE - 1)
            self.c = rng.randint(0, self.SIZE - 1)
        self.turns = 0
        return self._board() + "\nMove with \\boxed{up}, \\boxed{down}, \\boxed{left} or \\boxed{right}.", {}

    def _board(self):
        rows = []
        for r in range(self.SIZE):
            row = ""
            for c in range(self.SIZE):
                if r == self.r and c == self.c:
                    row += "P"
                elif r == self.goal_r and c == self.goal_c:
                    row += "G"
                else:
                    row += "."
            rows.append(row)
        return "\n".join(rows)

    def step(self, action):
        self.turns += 1
        m = re.search(r"\\boxed\{([^}]*)\}", action)
        move = m.group(1).strip().lower() if m else ""
        if move not in self.MOVES:
            return "Unknown move. Use \\boxed{up}/down/left/right.\n" + self._board(), -0.1, False, \
                self.turns >= self.max_turns, {}
        dr, dc = self.MOVES[move]
        self.r = min(self.SIZE - 1, max(0, self.r + dr))
        self.c = min(self.SIZE - 1, max(0, self.c + dc))
        if self.r == self.goal_r and self.c == self.goal_c:
            return "You reached the goal!\n" + self._board(), 1.0, True, False, {}
        return f"Moved {move}.\n" + self._board(), 0.0, False, self.turns >= self.max_turns, {}

    def solution(self):
        moves = []
        r, c = self.r, self.c
        while r != self.goal_r:
            moves.append("\\boxed{down}" if r < self.goal_r else "\\boxed{up}")
            r += 1 if r < self.goal_r else -1
        while c != self.goal_c:
            moves.append("\\boxed{right}" if c < self.goal_c else "\\boxed{left}")
            c += 1 if c < self.goal_c else -1
        return moves
