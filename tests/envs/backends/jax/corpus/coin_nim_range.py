import random
import re


class CoinNimEnv:
    """Take 1-3 coins; whoever takes the last coin wins. The house plays a fixed greedy rule."""

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.coins = rng.randint(9, 21)
        self.done = False
        self.moves = 0
        return self._obs("New game."), {}

    def _obs(self, msg):
        pile = " ".join("o" for _ in range(self.coins)) if self.coins <= 25 else str(self.coins)
        return f"{msg}\nCoins left: {self.coins} [{pile}]\nTake 1, 2 or 3 coins: \\boxed{{k}}."

    def step(self, action):
        if self.done:
            return "The game has ended.", 0.0, True, False, {}
        m = re.findall(r"\\boxed\{\s*(\d+)\s*\}", action)
        take = int(m[-1]) if m else 0
        if take < 1 or take > 3 or take > self.coins:
            return self._obs("Illegal move, you lose."), -1.0, True, False, {}
        self.coins -= take
        self.moves += 1
        if self.coins == 0:
            self.done = True
            return f"You took the last coin after {self.moves} moves. You win!", 1.0, True, False, {}
        house = self.coins % 4
        if house == 0:
            house = 1
        self.coins -= house
        if self.coins == 0:
            self.done = True
            return f"The house took {house} and the last coin. You lose.", 0.0, True, False, {}
        return self._obs(f"You took {take}, the house took {house}."), 0.0, False, False, {}

    def solution(self):
        return ["\\boxed{" + str(self.coins % 4 if self.coins % 4 else 1) + "}"]
