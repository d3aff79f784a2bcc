# hostile: writes files outside its scratch dir
import os


def attack():
    report = []
    targets = ["/tmp/spade-sandbox-pwned.txt", "/var/tmp/spade-sandbox-pwned.txt", "/dev/shm/spade-sandbox-pwned.txt",
               "/work/main/spade-sandbox-pwned.txt", "/usr/spade-sandbox-pwned.txt", "/spade-sandbox-pwned.txt",
               os.path.expanduser("~/spade-sandbox-pwned.txt"), "/etc/spade-sandbox-pwned.txt"]
    for path in targets:
        try:
            with open(path, "w") as f:
                f.write("pwned")
            report.append(f"{path}:written")
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
