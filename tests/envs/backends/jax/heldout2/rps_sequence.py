import random
import re

BEATS = {"rock": "scissors", "paper": "rock", "scissors": "paper"}


class PatternDuelEnv:
    """The opponent plays a repeating pattern; win three rounds by predicting it."""

    def reset(self, seed=None):
        rng = random.Random(seed)
        moves = list(BEATS.keys())
        self.pattern = [rng.choice(moves) for _ in range(3)]
        self.round = 0
        self.wins = 0
        self.history = "none"
        self.turns = 0
        return (f"The opponent repeats a 3-move pattern. It opened with {self.pattern[0]}. "
                "Play \\boxed{rock}, \\boxed{paper} or \\boxed{scissors}."), {}

    def step(self, action):
        self.turns += 1
        m = re.findall(r"\\boxed\{(\w+)\}", action)
        move = m[-1].lower() if m else ""
        if move not in BEATS:
            return "Invalid move.", -0.1, False, self.turns >= 9, {}
        opp = self.pattern[self.round % 3]
        self.round += 1
        if BEATS[move] == opp:
            self.wins += 1
            result = "win"
        elif move == opp:
            result = "draw"
        else:
            result = "loss"
        self.history = opp
        if self.wins >= 3:
            return f"Opponent played {opp}: {result}. You won 3 rounds!", 1.0, True, False, {}
        return f"Opponent played {opp}: {result}. Wins: {self.wins}. Round {self.round + 1}.", 0.0, False, \
            self.turns >= 9, {}

    def solution(self):
        counter = {v: k for k, v in BEATS.items()}
        return ["\\boxed{" + counter[self.pattern[i % 3]] + "}" for i in range(3)]
