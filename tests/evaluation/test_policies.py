"""spade_jax.evaluation.policies: chat-template prompts from a token generator, and the model policy's
context limit and forced reply prefix."""

from __future__ import annotations

from spade_jax import evaluation as ev


def test_tokens_policy_renders_chat_template():
    class CharTokenizer:
        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
            return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]

        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(i) for i in ids)

    seen = []

    def generate(prompts):
        seen.extend(prompts)
        return [[ord(c) for c in "\\boxed{5}"] for _ in prompts]

    policy = ev.tokens_policy(generate, CharTokenizer())
    assert policy([[{"role": "user", "content": "hi"}]]) == ["\\boxed{5}"]
    assert "".join(map(chr, seen[0])) == "<user>hi<assistant>"



def test_model_policy_skips_conversations_past_the_context(monkeypatch):
    import types

    from spade_jax import sampling

    class CharTokenizer:
        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
            return "".join(m["content"] for m in messages)

        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]

    calls = []

    class FakeSampler:
        def __init__(self, model, tokenizer, mesh=None):
            pass

        def generate(self, prompts, config, key=0):
            calls.append(prompts)
            return types.SimpleNamespace(texts=[f"\\boxed{{{len(p)}}}" for p in prompts])

    monkeypatch.setattr(sampling, "Sampler", FakeSampler)
    model = types.SimpleNamespace(spec=types.SimpleNamespace(max_position=30))
    policy = ev.model_policy(model, CharTokenizer(), sampling.SamplingConfig(max_new_tokens=10))
    short, long = [{"role": "user", "content": "x" * 20}], [{"role": "user", "content": "y" * 21}]
    assert policy([long, short, long]) == ["", "\\boxed{20}", ""]
    assert calls == [[[ord("x")] * 20]]
    assert policy([long]) == [""] and len(calls) == 1
    # A forced reply prefix ends every prompt and starts every reply.
    forced = ev.model_policy(model, CharTokenizer(), sampling.SamplingConfig(max_new_tokens=10),
                             reply_prefix="\\boxed{")
    assert forced([[{"role": "user", "content": "z" * 10}]]) == ["\\boxed{\\boxed{17}"]
    assert calls[-1] == [[ord("z")] * 10 + [ord(c) for c in "\\boxed{"]]
