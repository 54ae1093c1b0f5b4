"""Random streams per phase of a step."""


import numpy as np
import paddle

PHASES = ("train", "eval", "resample", "shuffle")


def seed_phase(seed: int, step: int, rank: int, phase: str, attempt: int = 0) -> int:
    """Each phase of each step draws from its own random streams, so a resumed run draws exactly what an
    uninterrupted one would with no random state to save, and sampling in an evaluation never shifts
    training's samples. Seeds paddle's generator (the eager engine's draws, dropout) from
    (seed, step, phase, rank) and returns the seed of (seed, step, phase) that the fused engine keys on
    together with each row's index in the global batch: with it, a run over N processes samples exactly
    the completions a one-process run with the same global batch does. `attempt` numbers the refill
    rounds of dynamic sampling and the iterations over a batch."""
    shared = [seed, step, PHASES.index(phase)] + ([attempt] if attempt else [])
    paddle.seed(int(np.random.SeedSequence([*shared, rank]).generate_state(1)[0]))
    return int(np.random.SeedSequence(shared).generate_state(1)[0])
