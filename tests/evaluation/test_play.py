"""spade_jax.evaluation.play: the policy sees, turn by turn, exactly the conversation the training loop
built, whatever characters the observations and replies hold; the default system turn is the agent's."""

from __future__ import annotations

from spade_jax.evaluation.play import EvalEpisode, play

AWKWARD = [
    'say "hi"\nthen: \\boxed{A C}', "", "\\", 'user:"x"\nassistant:"', "\ue000spade-reply\ue001", "é 水 \u2028 \x00"
]


class _ScriptedEnv:
    """Shows AWKWARD[k] as the k-th observation; ends after three steps."""

    def reset(self, seed):
        self.k = 0
        return AWKWARD[seed % len(AWKWARD)]

    def step(self, action):
        self.k += 1
        self.success = self.k == 3
        return AWKWARD[(self.k + len(action)) % len(AWKWARD)], 0.5, self.k == 3, False


def test_policy_sees_the_exact_conversation():
    seen, expected = [], {}
    envs = [_ScriptedEnv(), _ScriptedEnv()]

    def policy(conversations):
        seen.extend(conversations)
        return [AWKWARD[len(c) % len(AWKWARD)] for c in conversations]

    episodes = [EvalEpisode(env, max_turns=5) for env in envs]
    trajectories = play(policy, episodes, [0, 3], system_prompt=AWKWARD[-1])
    for seed, traj in zip([0, 3], trajectories):
        messages = [{"role": "system", "content": AWKWARD[-1]}, {"role": "user", "content": AWKWARD[seed]}]
        for action, observation in zip(traj.actions, traj.observations[1:]):
            expected.setdefault(seed, []).append(list(messages))
            messages += [{"role": "assistant", "content": action}, {"role": "user", "content": observation}]
    assert seen == [c for pair in zip(expected[0], expected[3]) for c in pair]
    assert all(e.success and e.turns == 3 for e in episodes)
    assert [t.rewards for t in trajectories] == [[0.5] * 3] * 2


def test_turn_cap_ends_an_episode_unsolved():
    episode = EvalEpisode(_ScriptedEnv(), max_turns=2)
    (traj,) = play(lambda convs: ["x"] * len(convs), [episode], [0], system_prompt=None)
    assert len(traj.actions) == 2 and traj.truncated and not episode.success

