"""Spatial reasoning: walk across a walled grid with pits from one corner to the opposite one."""

import random
import re


class GridMazeEnv:
    MAX_TURNS = 24  # hard cap on steps, invalid ones included (then truncated)
    MAX_MOVES = 18  # moves (bumps included) before the walker is exhausted (a loss)
    SIZE = 6
    PARTIAL = 0.5  # a loss scores PARTIAL x the share of the way covered towards the goal (a win scores 1)
    SYMBOLS = [".", "#", "O", "A", "G"]  # floor, wall, pit, walker, goal

    def reset(self, seed=None):
        rng = random.Random(seed)
        # A hidden shortest path (SIZE-1 vertical and SIZE-1 horizontal steps in random order) is kept clear.
        self.plan = [0] * (self.SIZE - 1) + [1] * (self.SIZE - 1)
        rng.shuffle(self.plan)
        self.down = rng.random() < 0.5
        self.right = rng.random() < 0.5
        self.row = 0 if self.down else self.SIZE - 1
        self.col = 0 if self.right else self.SIZE - 1
        self.goal_row = self.SIZE - 1 - self.row
        self.goal_col = self.SIZE - 1 - self.col
        clear = [[False] * self.SIZE for _ in range(self.SIZE)]
        r = self.row
        c = self.col
        clear[r][c] = True
        for step in self.plan:
            if step == 0:
                r = r + (1 if self.down else -1)
            else:
                c = c + (1 if self.right else -1)
            clear[r][c] = True
        # 0 = floor, 1 = wall, 2 = pit.
        self.grid = [[0] * self.SIZE for _ in range(self.SIZE)]
        for r in range(self.SIZE):
            for c in range(self.SIZE):
                roll = rng.random()
                if not clear[r][c] and roll < 0.35:
                    self.grid[r][c] = 1
                elif not clear[r][c] and roll < 0.5:
                    self.grid[r][c] = 2
        self.moves = 0
        self.turn = 0
        self.done = False
        intro = (
            f"Walk from A to G on a {self.SIZE}x{self.SIZE} grid within {self.MAX_MOVES} moves. '#' is a wall "
            "(you bump and stay), 'O' is a pit (you fall and lose), '.' is floor. Row 1 is the top."
        )
        return self._observe(intro), {}

    def step(self, action):
        if self.done:
            return self._observe("The episode is over; call reset()."), 0.0, True, False, {}
        self.turn += 1
        cmd = self._parse(action)
        if cmd in ("up", "down", "left", "right"):
            r = self.row + (1 if cmd == "down" else 0) - (1 if cmd == "up" else 0)
            c = self.col + (1 if cmd == "right" else 0) - (1 if cmd == "left" else 0)
            self.moves += 1
            if r < 0 or r >= self.SIZE or c < 0 or c >= self.SIZE:
                message = "You bump into the edge and stay."
            elif self.grid[r][c] == 1:
                message = "You bump into a wall and stay."
            else:
                self.row = r
                self.col = c
                message = f"You move {cmd}."
            if self.row == self.goal_row and self.col == self.goal_col:
                self.done = True
                return self._observe(message + " You reached the goal, you win!"), 1.0, True, False, {}
            if self.grid[self.row][self.col] == 2:
                self.done = True
                reward = self.PARTIAL * self._progress()
                return self._observe(message + " You fell into a pit; you lose."), reward, True, False, {}
            if self.moves >= self.MAX_MOVES:
                self.done = True
                reward = self.PARTIAL * self._progress()
                return self._observe(message + " You are exhausted; you lose."), reward, True, False, {}
        else:
            message = "Invalid action (turn lost): use \\boxed{up}, \\boxed{down}, \\boxed{left} or \\boxed{right}."
        if self.turn >= self.MAX_TURNS:
            self.done = True
            return self._observe(message + " Out of turns."), 0.0, False, True, {}
        return self._observe(message), 0.0, False, False, {}

    def solution(self):
        vertical = "\\boxed{down}" if self.down else "\\boxed{up}"
        horizontal = "\\boxed{right}" if self.right else "\\boxed{left}"
        return [vertical if step == 0 else horizontal for step in self.plan]

    def close(self):
        pass

    def _progress(self):
        # 0 at the start corner, 1 at the goal: the share of the Manhattan distance already covered.
        left = abs(self.row - self.goal_row) + abs(self.col - self.goal_col)
        return 1 - left / max(1, 2 * (self.SIZE - 1))

    def _cell(self, r, c):
        here = r == self.row and c == self.col
        goal = r == self.goal_row and c == self.goal_col
        return self.SYMBOLS[3 if here else 4 if goal else self.grid[r][c]]

    def _observe(self, message):
        rows = "\n".join(" ".join(self._cell(r, c) for c in range(self.SIZE)) for r in range(self.SIZE))
        return (
            f"{message}\n{rows}\nYou are at row {self.row + 1}, column {self.col + 1}. "
            f"Moves used: {self.moves}/{self.MAX_MOVES}. Turn {self.turn}/{self.MAX_TURNS}.\n"
            "Actions: \\boxed{up}, \\boxed{down}, \\boxed{left}, \\boxed{right}."
            "\nWrite your action inside \\boxed{...}."
        )

    def _parse(self, action):
        found = re.findall(r"\\boxed\{([^{}]*)\}", action)
        if not found:
            return None
        return found[-1].strip().lower()
