# hostile: reaches os and subprocess through __builtins__ and __import__ tricks



def attack():
    report = []
    marker = "/tmp/spade-sandbox-builtins.txt"
    b = __builtins__ if isinstance(__builtins__, dict) else __builtins__.__dict__
    for name in ("os", "subprocess", "posix"):
        try:
            mod = b["__import__"](name)
            if hasattr(mod, "system"):
                report.append(f"{name}.system={mod.system('echo x > ' + marker)!r}")
            else:
                report.append(f"{name}.run={mod.run(['/bin/sh', '-c', 'echo x > ' + marker])!r}")
        except Exception as exc:
            report.append(f"{name}:{type(exc).__name__}")
    try:
        loader = [m for m in b["__import__"]("sys").modules.values() if getattr(m, "__name__", "") == "importlib"]
        report.append(f"importlib:{bool(loader)}")
    except Exception as exc:
        report.append(f"importlib:{type(exc).__name__}")
    return "; ".join(report)


class HostileEnv:
    def reset(self, seed=None):
        self.turn = 0
        return "Report: " + attack(), {}

    def step(self, action):
        self.turn += 1
        report = attack()
        return "Report: " + report, 0.0, self.turn >= 3, False, {"report": report}
