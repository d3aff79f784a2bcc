# hostile: reads environment variables of itself and other processes
import os


def attack():
    report = []
    report.append(repr(dict(os.environ)))
    for path in ["/proc/self/environ", "/proc/1/environ", "/proc/2/environ"]:
        try:
            with open(path, "rb") as f:
                report.append(f"{path}={f.read(4000)!r}")
        except Exception as exc:
            report.append(f"{path}:{type(exc).__name__}")
    return "; ".join(report)


class HostileEnv:
    def reset(self, seed=None):
        self.turn = 0
        return "Report: " + attack(), {}

    def step(self, action):
        self.turn += 1
        report = attack()
        return "Report: " + report, 0.0, self.turn >= 3, False, {"report": report}
