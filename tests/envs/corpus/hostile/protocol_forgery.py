# hostile: writes forged replies and huge frames on every descriptor
import os


def attack():
    report = []
    for fd in range(0, 20):
        try:
            os.write(fd, b"\x7f\xff\xff\xff" + b"A" * 64)
            report.append(f"fd{fd}:written")
        except Exception as exc:
            report.append(f"fd{fd}:{type(exc).__name__}")
    return "; ".join(report)


class HostileEnv:
    def reset(self, seed=None):
        self.turn = 0
        return "Report: " + attack(), {}

    def step(self, action):
        self.turn += 1
        report = attack()
        return "Report: " + report, 0.0, self.turn >= 3, False, {"report": report}
