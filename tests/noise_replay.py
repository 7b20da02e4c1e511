"""A deterministic stand-in for the OS CSPRNG, for tests that compare two runs draw for draw.

Only `dp_core.noise` draws through it (its `os.urandom` and `secrets`): every other use of the
CSPRNG (the engine's bounding seed, Spark's view names) stays the real one, so a run that should
have been given a seed and drew one instead is not replayed."""

from __future__ import annotations

import random
import types

from dp_core import noise


class Replay:
    """The same byte stream on every run started with the same seed."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def urandom(self, n: int) -> bytes:
        return self.rng.randbytes(n)

    def randbits(self, k: int) -> int:
        return self.rng.getrandbits(k)

    def randbelow(self, n: int) -> int:
        return self.rng.randrange(n)


def replay_noise(monkeypatch, seed: int) -> None:
    """From now until `monkeypatch.undo()`, dp_core.noise draws the stream of `Replay(seed)` (restarted)."""
    replay = Replay(seed)
    monkeypatch.setattr(noise, "os", types.SimpleNamespace(urandom=replay.urandom))
    monkeypatch.setattr(noise, "secrets", replay)
