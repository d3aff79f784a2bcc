# hostile: thread that keeps writing after the call returned
import os
import threading
import time


def attack():
    report = []
    def scribble():
        time.sleep(0.3)
        for fd in range(1, 12):
            try:
                os.write(fd, b"\x00\x00\x00\x10GARBAGE-FROM-THREAD")
            except Exception:
                pass
        with open("/tmp/spade-sandbox-thread.txt", "w") as f:
            f.write("thread")
    try:
        t = threading.Thread(target=scribble, daemon=True)
        t.start()
        report.append("thread:started")
    except Exception as exc:
        report.append(f"thread:{type(exc).__name__}")
    return "; ".join(report)


class HostileEnv:
    def reset(self, seed=None):
        self.turn = 0
        return "Report: " + attack(), {}

    def step(self, action):
        self.turn += 1
        report = attack()
        return "Report: " + report, 0.0, self.turn >= 3, False, {"report": report}
