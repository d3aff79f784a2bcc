import random
import re


class ShopBudgetEnv:
    """Buy items to reach a target value without exceeding the budget (prices in dollars)."""

    ITEMS = ["apple", "bread", "cheese", "dates"]

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.prices = [round(rng.uniform(0.5, 4.0), 2) for _ in self.ITEMS]
        self.budget = 10.0
        self.spent = 0.0
        self.basket = [0, 0, 0, 0]
        self.turn = 0
        return self._obs("Welcome to the shop."), {}

    def _obs(self, msg):
        menu = "; ".join(f"{name} ${self.prices[i]:.2f} (x{self.basket[i]})" for i, name in enumerate(self.ITEMS))
        return f"{msg} Menu: {menu}. Spent ${self.spent:.2f} of ${self.budget:.2f}. Buy with \\boxed{{item}} or \\boxed{{checkout}}."

    def step(self, action):
        found = re.findall(r"\\boxed\{([^{}]*)\}", action)
        choice = found[-1].strip().lower() if found else ""
        self.turn += 1
        if choice == "checkout":
            score = min(1.0, self.spent / self.budget)
            return f"You spent ${self.spent:.2f}. Score {score:.2f}.", score, True, False, {}
        if choice in self.ITEMS:
            i = self.ITEMS.index(choice)
            if self.spent + self.prices[i] > self.budget:
                return self._obs(f"You cannot afford {choice}."), 0.0, False, False, {}
            self.spent += self.prices[i]
            self.basket[i] += 1
            msg = f"Bought {choice}."
        else:
            msg = "Unknown item."
        if self.turn >= 10:
            return self._obs(msg + " The shop closes."), 0.0, False, True, {}
        return self._obs(msg), 0.0, False, False, {}

    def solution(self):
        return ["\\boxed{apple}", "\\boxed{checkout}"]
