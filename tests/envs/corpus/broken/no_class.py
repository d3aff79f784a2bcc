# expect: invalid class
def reset(seed=None):
    return 'x', {}


def step(action):
    return 'x', 0.0, True, False, {}
