# hostile: attaches to its parent with ptrace via ctypes
import ctypes
import os


def attack():
    report = []
    libc = ctypes.CDLL(None, use_errno=True)
    for pid in (os.getppid(), 1):
        result = libc.ptrace(16, pid, None, None)  # PTRACE_ATTACH
        report.append(f"ptrace({pid})={result} errno={ctypes.get_errno()}")
    try:
        report.append(f"unshare={libc.unshare(0x10000000)} errno={ctypes.get_errno()}")  # CLONE_NEWUSER
    except Exception as exc:
        report.append(f"unshare:{type(exc).__name__}")
    return "; ".join(report)


class HostileEnv:
    def reset(self, seed=None):
        self.turn = 0
        return "Report: " + attack(), {}

    def step(self, action):
        self.turn += 1
        report = attack()
        return "Report: " + report, 0.0, self.turn >= 3, False, {"report": report}
