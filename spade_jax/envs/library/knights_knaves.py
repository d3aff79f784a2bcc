"""Logical deduction: tell knights (always truthful) from knaves (always lying) by asking them about each other."""

import random
import re


class KnightsKnavesEnv:
    MAX_TURNS = 10  # hard cap on steps, invalid ones included (then truncated)
    PEOPLE = 5
    QUESTIONS = 4  # questions allowed; exactly enough to link all five people
    PARTIAL = 0.5  # a loss scores PARTIAL x the share of islanders named right (a win scores 1)

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.knight = [rng.random() < 0.5 for _ in range(self.PEOPLE)]
        self.count = sum(1 for k in self.knight if k)
        self.ask_from = [0] * self.QUESTIONS
        self.ask_about = [0] * self.QUESTIONS
        self.ask_says = [False] * self.QUESTIONS
        self.asked = 0
        self.turn = 0
        self.done = False
        intro = (
            f"{self.PEOPLE} islanders, numbered 1..{self.PEOPLE}, are each a knight (always tells the truth) or a "
            f"knave (always lies). Exactly {self.count} of them are knights. You may ask up to {self.QUESTIONS} "
            "questions of the form 'person i, is person j a knight?', then name everyone's kind."
        )
        return self._observe(intro), {}

    def step(self, action):
        if self.done:
            return self._observe("The episode is over; call reset()."), 0.0, True, False, {}
        self.turn += 1
        cmd = self._parse(action)
        digits = cmd is not None and cmd.isdecimal() and len(cmd) <= self.PEOPLE
        size = len(cmd) if digits else 0
        number = int(cmd) if digits else 0
        if size == 2 and self._is_question(number // 10, number % 10) and self.asked < self.QUESTIONS:
            i = number // 10 - 1
            j = number % 10 - 1
            # A knight reports j's kind truthfully and a knave flips it: "yes" exactly when both are alike.
            says = self.knight[i] == self.knight[j]
            self.ask_from[self.asked] = i
            self.ask_about[self.asked] = j
            self.ask_says[self.asked] = says
            self.asked += 1
            message = f"Person {i + 1} says: person {j + 1} is a {'knight' if says else 'knave'}."
        elif size == self.PEOPLE and self._is_answer(number):
            self.done = True
            if all((self._digit(number, p) == 1) == self.knight[p] for p in range(self.PEOPLE)):
                return self._observe("Every kind is right, you win!"), 1.0, True, False, {}
            right = sum(1 for p in range(self.PEOPLE) if (self._digit(number, p) == 1) == self.knight[p])
            reward = self.PARTIAL * right / self.PEOPLE
            return self._observe(f"Wrong; the truth was {self._truth()}. You lose."), reward, True, False, {}
        else:
            message = (
                "Invalid action (turn lost): write digits, not letters: for example \\boxed{12} asks person 1 "
                "about person 2 (questions left) and "
                f"\\boxed{{{''.join(str(1 + p % 2) for p in range(self.PEOPLE))}}} answers ({self.PEOPLE} digits, "
                "1 = knight and 2 = knave)."
            )
        if self.turn >= self.MAX_TURNS:
            self.done = True
            return self._observe(message + " Out of turns."), 0.0, False, True, {}
        return self._observe(message), 0.0, False, False, {}

    def solution(self):
        # Ask person 1 about everyone else, then name the kinds (the count fixes person 1's own kind).
        return [f"\\boxed{{1{j + 1}}}" for j in range(1, self.PEOPLE)] + ["\\boxed{" + self._truth() + "}"]

    def close(self):
        pass

    def _is_question(self, i, j):
        return 1 <= i <= self.PEOPLE and 1 <= j <= self.PEOPLE and i != j

    def _is_answer(self, number):
        return all(1 <= self._digit(number, p) <= 2 for p in range(self.PEOPLE))

    def _digit(self, number, p):
        return (number // 10 ** (self.PEOPLE - 1 - p)) % 10

    def _truth(self):
        return "".join("1" if k else "2" for k in self.knight)

    def _observe(self, message):
        heard = " ".join(
            f"[{self.ask_from[q] + 1} says {self.ask_about[q] + 1} is a {'knight' if self.ask_says[q] else 'knave'}]"
            for q in range(self.QUESTIONS)
            if q < self.asked
        )
        return (
            f"{message}\nKnights: exactly {self.count} of {self.PEOPLE}. "
            f"Answers so far: {heard if self.asked > 0 else 'none'}. "
            f"Questions left: {self.QUESTIONS - self.asked}. Turn {self.turn}/{self.MAX_TURNS}.\n"
            "Actions: \\boxed{ij} asks person i whether person j is a knight; "
            f"\\boxed{{a}} answers with a of {self.PEOPLE} digits, the k-th for person k (1 = knight, 2 = knave). "
            f"For example \\boxed{{{1 + self.turn % self.PEOPLE}{1 + (self.turn + 1) % self.PEOPLE}}} or "
            f"\\boxed{{{''.join(str(1 + (p + self.turn) % 2) for p in range(self.PEOPLE))}}}."
            "\nWrite your action inside \\boxed{...}."
        )

    def _parse(self, action):
        found = re.findall(r"\\boxed\{([^{}]*)\}", action)
        if not found:
            return None
        return found[-1].strip().lower()
