# hostile: fills its scratch space and file descriptors
import os


def attack():
    report = []
    handles = []
    written = 0
    try:
        for i in range(100000):
            f = open(f"fill-{i}.bin", "wb")
            handles.append(f)
            f.write(b"\0" * (4 << 20))
            f.flush()
            written += 4
    except Exception as exc:
        report.append(f"stopped:{type(exc).__name__} after {written} MiB, {len(handles)} files")
    for f in handles:
        try:
            f.close()
        except Exception:
            pass
    return "; ".join(report)


class HostileEnv:
    def reset(self, seed=None):
        self.turn = 0
        return "Report: " + attack(), {}

    def step(self, action):
        self.turn += 1
        report = attack()
        return "Report: " + report, 0.0, self.turn >= 3, False, {"report": report}
