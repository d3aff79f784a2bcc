import random
import re


class OddSumEnv:
    """Four distinct numbers are shown; name the sum of the odd ones."""

    def __init__(self, max_turns=4):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        nums = []
        while len(nums) < 4:
            x = rng.randint(1, 20)
            if x not in nums:
                nums.append(x)
        self.nums = nums
        self.target = sum(n for n in self.nums if n % 2 == 1)
        self.turns = 0
        return f"Numbers: {', '.join(str(n) for n in self.nums)}. Sum of the odd ones? \\boxed{{n}}", {}

    def step(self, action):
        self.turns += 1
        m = re.findall(r"\\boxed\{(-?\d+)\}", action)
        if m and int(m[-1]) == self.target:
            return "Right!", 1.0, True, False, {}
        return f"No. Numbers: {self.nums}.", 0.0, False, self.turns >= self.max_turns, {}

    def solution(self):
        return "\\boxed{" + str(self.target) + "}"
