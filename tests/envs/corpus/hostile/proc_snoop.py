# hostile: walks /proc for other processes' command lines and environments
import os


def attack():
    report = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        for item in ("cmdline", "environ"):
            try:
                with open(f"/proc/{pid}/{item}", "rb") as f:
                    report.append(f"{pid}/{item}={f.read(2000)!r}")
            except Exception as exc:
                report.append(f"{pid}/{item}:{type(exc).__name__}")
    return "; ".join(report)


class HostileEnv:
    def reset(self, seed=None):
        self.turn = 0
        return "Report: " + attack(), {}

    def step(self, action):
        self.turn += 1
        report = attack()
        return "Report: " + report, 0.0, self.turn >= 3, False, {"report": report}
