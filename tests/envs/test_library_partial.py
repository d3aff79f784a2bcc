"""Partial progress (SPADE's environment contract): a lost library game scores 0.5 x the share of the
task done, a won one 1. Each expected reward is worked out from what the game *shows* the player
(its observations), by the rule its docstring states, never from its hidden state."""

import re

import pytest

from spade_jax.envs.library import load_library_env

SEEDS = range(6)


def _play(name, seed, actions, history=False):
    """Plays `actions` (cycled) until the episode ends; returns (first obs, last obs, reward, terminated)
    and, with `history`, every observation after the first."""
    env = load_library_env(name)
    first, _ = env.reset(seed=seed)
    seen = []
    for turn in range(env.MAX_TURNS):
        obs, reward, terminated, truncated, _ = env.step(f"\\boxed{{{actions[turn % len(actions)]}}}")
        seen.append(obs)
        if terminated or truncated:
            return (first, obs, reward, terminated, seen) if history else (first, obs, reward, terminated)
    raise AssertionError(f"{name} seed {seed}: the episode did not end within MAX_TURNS")


def _expected(obs, partial):
    """1 for a win (the game says so), else 0.5 x `partial`."""
    return 1.0 if "you win" in obs.lower() else 0.5 * partial


def _matches(a, b):
    return sum(1 for x, y in zip(a, b) if x == y)


@pytest.mark.parametrize("seed", SEEDS)
def test_answer_games_pay_the_share_named_right(seed):
    first, obs, reward, terminated = _play("knights_knaves", seed, ["11111"])
    knights = int(re.search(r"Exactly (\d+) of them are knights", first).group(1))
    assert terminated and reward == pytest.approx(_expected(obs, knights / 5))

    for name, guess in (("switch_lights", "1234"), ("causal_chain", "1234")):
        _, obs, reward, terminated = _play(name, seed, [guess])
        if "you win" not in obs.lower():
            truth = re.search(r"was (\d+)\. You lose", obs).group(1)
            assert terminated and reward == pytest.approx(0.5 * _matches(guess, truth) / 4), (name, obs)
        else:
            assert reward == 1.0


@pytest.mark.parametrize("seed", SEEDS)
def test_round_games_pay_the_share_of_rounds_won(seed):
    for name, actions, rounds in (("odd_one_out", ["1"], 4), ("sequence_rule", ["0"], 3)):
        _, obs, reward, terminated, seen = _play(name, seed, actions, history=True)
        correct = sum(1 for text in seen if text.startswith("Correct"))
        assert terminated and reward == pytest.approx(_expected(obs, correct / rounds)), (name, seen)


@pytest.mark.parametrize("seed", SEEDS)
def test_numeric_games_pay_how_close_the_player_got(seed):
    first, obs, reward, terminated = _play("code_breaker", seed, ["1111"])
    exact = int(re.findall(r"exact (\d)", obs)[-1])
    assert terminated and reward == pytest.approx(_expected(obs, exact / 4))

    first, obs, reward, terminated = _play("target_number", seed, ["add"])
    start, target = (int(x) for x in re.search(r"Turn the value (\d+) into exactly (\d+)", first).groups())
    value = int(re.findall(r"Value: (-?\d+)\.", obs)[-1])
    partial = max(0.0, 1 - abs(target - value) / (target - start))
    assert terminated and reward == pytest.approx(_expected(obs, partial))

    _, obs, reward, terminated = _play("modular_lock", seed, ["1"])
    dials = re.search(r"Dials: ([\d ]+)\.", obs).group(1).split()
    target = re.search(r"Target: ([\d ]+)\.", obs).group(1).split()
    assert terminated and reward == pytest.approx(_expected(obs, _matches(dials, target) / 3))


@pytest.mark.parametrize("seed", SEEDS)
def test_optimisation_games_pay_the_share_of_the_optimum(seed):
    _, obs, reward, terminated = _play("knapsack", seed, ["1", "done"])
    if "tears" in obs:
        assert terminated and reward == 0.0
    else:
        got, best = (int(x) for x in re.search(r"worth (\d+)(?:, the best possible|; (\d+) was possible)", obs).groups()
                     if x is not None)
        assert terminated and reward == pytest.approx(0.5 * got / best)
    _, obs, reward, terminated = _play("delivery_route", seed, ["1", "2", "3", "4", "5", "0"])
    trip = re.search(r"Round trip (\d+) km(?: is optimal|; (\d+) km was possible)", obs)
    length, best = int(trip.group(1)), int(trip.group(2) or trip.group(1))
    assert terminated and reward == pytest.approx(_expected(obs, best / length))


@pytest.mark.parametrize("seed", SEEDS)
def test_board_games_pay_the_way_covered(seed):
    first, obs, reward, terminated = _play("grid_maze", seed, ["up", "left", "down", "right"])
    grid = [line.split() for line in first.splitlines() if re.fullmatch(r"([.#OAG] ){5}[.#OAG]", line)]
    (goal_row, goal_col), = [(r, c) for r, row in enumerate(grid) for c, cell in enumerate(row) if cell == "G"]
    row, col = (int(x) - 1 for x in re.search(r"You are at row (\d+), column (\d+)", obs).groups())
    partial = 1 - (abs(row - goal_row) + abs(col - goal_col)) / 10
    assert terminated and reward == pytest.approx(_expected(obs, partial))

    _, obs, reward, terminated = _play("sliding_puzzle", seed, ["up", "down"])
    board = [line.split() for line in obs.splitlines() if re.fullmatch(r"[\d_]( [\d_]){2}", line)]
    tiles = [cell for row in board for cell in row]
    placed = sum(1 for i, tile in enumerate(tiles) if tile == str(i + 1))
    assert terminated and reward == pytest.approx(_expected(obs, placed / 8))
