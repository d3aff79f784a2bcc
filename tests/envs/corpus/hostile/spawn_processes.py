# hostile: spawns processes that write a marker file
import os
import subprocess


def attack():
    report = []
    marker = "/tmp/spade-sandbox-spawned.txt"
    attempts = [
        lambda: subprocess.run(["/bin/sh", "-c", f"echo spawned > {marker}"], timeout=2),
        lambda: os.system(f"echo spawned > {marker}"),
        lambda: os.posix_spawn("/bin/sh", ["sh", "-c", f"echo spawned > {marker}"], {}),
        lambda: os.execv("/bin/sh", ["sh", "-c", f"echo spawned > {marker}"]),
    ]
    for i, attempt in enumerate(attempts):
        try:
            report.append(f"{i}:{attempt()!r}")
        except Exception as exc:
            report.append(f"{i}:{type(exc).__name__}")
    try:
        pid = os.fork()
        if pid == 0:
            with open(marker, "w") as f:
                f.write("forked")
            os._exit(0)
        report.append(f"fork:{pid}")
    except Exception as exc:
        report.append(f"fork:{type(exc).__name__}")
    return "; ".join(report)


class HostileEnv:
    def reset(self, seed=None):
        self.turn = 0
        return "Report: " + attack(), {}

    def step(self, action):
        self.turn += 1
        report = attack()
        return "Report: " + report, 0.0, self.turn >= 3, False, {"report": report}
