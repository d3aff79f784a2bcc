"""Spatial reasoning: put a scrambled 3x3 sliding-tile puzzle back in order by moving the gap."""

import random
import re


class SlidingPuzzleEnv:
    MAX_TURNS = 25  # hard cap on steps, invalid ones included (then truncated)
    MAX_MOVES = 20  # moves (bumps included) before the game is lost
    SIZE = 3
    SCRAMBLE = 8  # random gap moves applied to the solved board, never undoing the previous one
    PARTIAL = 0.5  # a loss scores PARTIAL x the share of tiles in their place (a win scores 1)

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.board = [i + 1 for i in range(self.SIZE * self.SIZE)]
        self.board[self.SIZE * self.SIZE - 1] = 0
        self.gap = self.SIZE * self.SIZE - 1
        self.scramble = [0] * self.SCRAMBLE
        last = -1
        for i in range(self.SCRAMBLE):
            first = rng.randrange(4)
            chosen = -1
            for k in range(4):
                d = (first + k) % 4
                if chosen < 0 and self._can_move(d) and d != self._inverse(last):
                    chosen = d
            self._move(chosen)
            self.scramble[i] = chosen
            last = chosen
        self.moves = 0
        self.turn = 0
        self.done = False
        intro = (
            "Slide the tiles back to 1 2 3 / 4 5 6 / 7 8 _ with the gap (_) in the bottom-right corner. Each action "
            f"moves the gap one cell, swapping it with that neighbour tile. You have {self.MAX_MOVES} moves."
        )
        return self._observe(intro), {}

    def step(self, action):
        if self.done:
            return self._observe("The episode is over; call reset()."), 0.0, True, False, {}
        self.turn += 1
        cmd = self._parse(action)
        if cmd in ("up", "down", "left", "right"):
            d = 0 if cmd == "up" else 1 if cmd == "down" else 2 if cmd == "left" else 3
            self.moves += 1
            if self._can_move(d):
                self._move(d)
                message = f"The gap moves {cmd}."
            else:
                message = f"The gap is at the edge and cannot move {cmd}."
            if all(self.board[i] == (i + 1) % (self.SIZE * self.SIZE) for i in range(self.SIZE * self.SIZE)):
                self.done = True
                return self._observe(message + " Solved, you win!"), 1.0, True, False, {}
            if self.moves >= self.MAX_MOVES:
                self.done = True
                placed = sum(1 for i in range(self.SIZE * self.SIZE) if self.board[i] == i + 1)
                reward = self.PARTIAL * placed / (self.SIZE * self.SIZE - 1)
                return self._observe(message + " No moves left; you lose."), reward, True, False, {}
        else:
            message = "Invalid action (turn lost): use \\boxed{up}, \\boxed{down}, \\boxed{left} or \\boxed{right}."
        if self.turn >= self.MAX_TURNS:
            self.done = True
            return self._observe(message + " Out of turns."), 0.0, False, True, {}
        return self._observe(message), 0.0, False, False, {}

    def solution(self):
        names = ["up", "down", "left", "right"]
        undo = [self._inverse(self.scramble[self.SCRAMBLE - 1 - i]) for i in range(self.SCRAMBLE)]
        return ["\\boxed{" + names[d] + "}" for d in undo]

    def close(self):
        pass

    def _inverse(self, d):
        # up <-> down and left <-> right; -1 (no previous move) maps outside 0..3.
        return d + 1 if d % 2 == 0 else d - 1

    def _can_move(self, d):
        row = self.gap // self.SIZE
        col = self.gap % self.SIZE
        if d == 0:
            return row > 0
        if d == 1:
            return row < self.SIZE - 1
        if d == 2:
            return col > 0
        return col < self.SIZE - 1

    def _move(self, d):
        target = self.gap + (-self.SIZE if d == 0 else self.SIZE if d == 1 else -1 if d == 2 else 1)
        self.board[self.gap] = self.board[target]
        self.board[target] = 0
        self.gap = target

    def _tile(self, value):
        return str(value) if value > 0 else "_"

    def _observe(self, message):
        rows = "\n".join(
            " ".join(self._tile(self.board[r * self.SIZE + c]) for c in range(self.SIZE))
            for r in range(self.SIZE)
        )
        return (
            f"{message}\n{rows}\nMoves used: {self.moves}/{self.MAX_MOVES}. Turn {self.turn}/{self.MAX_TURNS}.\n"
            "Actions: \\boxed{up}, \\boxed{down}, \\boxed{left}, \\boxed{right} move the gap."
            "\nWrite your action inside \\boxed{...}."
        )

    def _parse(self, action):
        found = re.findall(r"\\boxed\{([^{}]*)\}", action)
        if not found:
            return None
        return found[-1].strip().lower()
