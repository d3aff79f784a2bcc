# expect: invalid syntax
class BrokenEnv:
    def reset(self, seed=None)
        return 'x', {}
