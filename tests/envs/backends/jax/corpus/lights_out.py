import random
import re


class LightsOutEnv:
    SIZE = 3
    MAX_TURNS = 12

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.board = [[0] * self.SIZE for _ in range(self.SIZE)]
        self.presses = []
        for _ in range(3):
            r = rng.randrange(self.SIZE)
            c = rng.randrange(self.SIZE)
            self._toggle(r, c)
            self.presses.append((r, c))
        self.turn = 0
        return self._render("Turn all lights off. Press a cell with \\boxed{row col} (1-based)."), {}

    def _toggle(self, r, c):
        for dr, dc in [(0, 0), (1, 0), (-1, 0), (0, 1), (0, -1)]:
            rr, cc = r + dr, c + dc
            if 0 <= rr < self.SIZE and 0 <= cc < self.SIZE:
                self.board[rr][cc] = 1 - self.board[rr][cc]

    def _render(self, msg):
        rows = []
        for r in range(self.SIZE):
            line = ""
            for c in range(self.SIZE):
                line += "#" if self.board[r][c] == 1 else "."
            rows.append(line)
        lit = sum(sum(row) for row in self.board)
        return msg + "\n" + "\n".join(rows) + f"\nLights on: {lit}. Turn {self.turn}/{self.MAX_TURNS}."

    def step(self, action):
        found = re.findall(r"\\boxed\{([^{}]*)\}", action)
        if not found:
            return self._render("No move found."), 0.0, False, False, {}
        parts = found[-1].replace(",", " ").split()
        if len(parts) != 2 or not parts[0].isdigit() or not parts[1].isdigit():
            return self._render("Give two numbers: row and column."), 0.0, False, False, {}
        r, c = int(parts[0]) - 1, int(parts[1]) - 1
        if not (0 <= r < self.SIZE and 0 <= c < self.SIZE):
            return self._render("That cell is off the board."), 0.0, False, False, {}
        self.turn += 1
        self._toggle(r, c)
        if all(self.board[i][j] == 0 for i in range(self.SIZE) for j in range(self.SIZE)):
            return self._render(f"You pressed ({r + 1}, {c + 1}). All lights are off, you win!"), 1.0, True, False, {}
        if self.turn >= self.MAX_TURNS:
            return self._render("Out of turns."), 0.0, False, True, {}
        return self._render(f"You pressed ({r + 1}, {c + 1})."), 0.0, False, False, {}

    def solution(self):
        return [f"\\boxed{{{r + 1} {c + 1}}}" for r, c in self.presses]
