"""Tests of spade_jax.envs.api: \\boxed parsing, the episode runner and SPADE's episode reward."""

import math

import pytest

from spade_jax.envs.api import Episode, TextEnv, episode_reward, extract_boxed, run_episode


@pytest.mark.parametrize(
    "text, expected",
    [
        ("I think \\boxed{42}", "42"),
        ("first \\boxed{1} then \\boxed{2}", "2"),
        ("nested \\boxed{\\frac{1}{2}} done", "\\frac{1}{2}"),
        ("deep \\boxed{a{b{c}}d}", "a{b{c}}d"),
        ("spaced \\boxed {up}", "up"),
        ("empty \\boxed{}", ""),
        ("no box here", None),
        ("unclosed \\boxed{7", None),
        ("good \\boxed{3} then unclosed \\boxed{4", "3"),
        ("\\boxed without brace", None),
        ("", None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def test_extract_boxed_rejects_non_str():
    assert extract_boxed(None) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "last, terminated, expected",
    [
        (1.0, True, 1.0), (5.0, True, 1.0), (-3.0, True, -1.0),
        (0.5, True, 0.5), (1.0, False, 0.0), (math.nan, True, 0.0),
    ],
)
def test_episode_reward(last, terminated, expected):
    assert episode_reward(last, terminated) == expected


class CountdownEnv:
    """Wins when the agent says the hidden number; truncates itself after `limit` steps."""

    def __init__(self, limit=None):
        self.limit = limit

    def reset(self, seed=None):
        self.target = (seed or 0) % 10
        self.turn = 0
        return f"say {self.target}", {"seed": seed}

    def step(self, action):
        self.turn += 1
        won = extract_boxed(action) == str(self.target)
        truncated = self.limit is not None and self.turn >= self.limit and not won
        return f"turn {self.turn}", 2.0 if won else 0.0, won, truncated, {}


def test_text_env_protocol():
    assert isinstance(CountdownEnv(), TextEnv)
    assert not isinstance(object(), TextEnv)


def test_run_episode_win():
    episode = run_episode(CountdownEnv(), lambda obs: f"\\boxed{{{obs.split()[-1]}}}", seed=3)
    assert isinstance(episode, Episode)
    assert episode.observations == ("say 3", "turn 1")
    assert episode.actions == ("\\boxed{3}",)
    assert episode.terminated and not episode.truncated
    assert episode.reward == 1.0  # 2.0 clipped
    assert episode.total_reward == 2.0


def test_run_episode_env_truncates():
    episode = run_episode(CountdownEnv(limit=4), lambda obs: "\\boxed{x}", seed=1, max_turns=25)
    assert episode.turns == 4 and episode.truncated and not episode.terminated
    assert episode.reward == 0.0


def test_run_episode_runner_truncates_at_max_turns():
    episode = run_episode(CountdownEnv(), lambda obs: "\\boxed{x}", seed=1, max_turns=7)
    assert episode.turns == 7 and episode.truncated and not episode.terminated
    assert len(episode.observations) == 8 and len(episode.infos) == 8


def test_run_episode_rejects_bad_max_turns():
    with pytest.raises(ValueError, match="max_turns"):
        run_episode(CountdownEnv(), str, max_turns=0)
