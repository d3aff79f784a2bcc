# hostile: signals every process it can reach
import os
import signal


def attack():
    report = []
    for target, sig in [(-1, signal.SIGKILL), (1, signal.SIGKILL), (os.getppid(), signal.SIGKILL)]:
        try:
            os.kill(target, sig)
            report.append(f"kill({target}):ok")
        except Exception as exc:
            report.append(f"kill({target}):{type(exc).__name__}")
    return "; ".join(report)


class HostileEnv:
    def reset(self, seed=None):
        self.turn = 0
        return "Report: " + attack(), {}

    def step(self, action):
        self.turn += 1
        report = attack()
        return "Report: " + report, 0.0, self.turn >= 3, False, {"report": report}
