# expect: invalid class
class Helper:
    def reset(self, seed=None):
        return 'x', {}
