import math
from dataclasses import dataclass, fields
from numbers import Real

# Upper bounds of the size settings, far past any real use (open-r1 and ms-swift count 3-grams; no model's
# context holds 2^24 tokens): a typo, or a reward server request, is refused naming the key, not run.
MAX_N_GRAMS = 1024
MAX_LENGTH_TOKENS = 2**24


@dataclass(frozen=True)
class RewardSettings:
    """The parameters of the length, repetition and substance rewards; each field is also a config key of its name.

    Lengths are in completion tokens. None means "not set": the trainer sets cosine_max_len and
    soft_max_length to max_dec_len; a reward that needs an unset value fails with an error naming it.
    Constructing one validates it, so an invalid RewardSettings never exists.
    """

    cosine_min_len_value_wrong: float = -0.5  # cosine: a wrong answer of length 0
    cosine_max_len_value_wrong: float = 0.0  # cosine: a wrong answer of length cosine_max_len or more
    cosine_min_len_value_correct: float = 1.0  # cosine: a correct answer of length 0
    cosine_max_len_value_correct: float = 0.5  # cosine: a correct answer of length cosine_max_len or more
    cosine_max_len: int | None = None
    repetition_n_grams: int = 3
    repetition_max_penalty: float = -1.0  # the value of a completion that is one n-gram over and over
    soft_max_length: int | None = None  # DAPO's L_max
    soft_cache_length: int | None = None  # DAPO's L_cache: the punished band below L_max
    substance_min_words: int = 20  # substance: fewer words than this is degenerate

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raises ValueError naming the first field that is out of range."""
        for field in fields(self):
            value = getattr(self, field.name)
            if field.type is float and (not _is_real(value) or not math.isfinite(value)):
                raise ValueError(f"{field.name} must be a finite number, got {value!r}")
            if field.type in (int, int | None) and value is not None and not _is_int(value):
                raise ValueError(f"{field.name} must be an integer, got {value!r}")
        if self.repetition_n_grams < 1:
            raise ValueError(f"repetition_n_grams must be >= 1, got {self.repetition_n_grams}")
        if self.repetition_n_grams > MAX_N_GRAMS:
            raise ValueError(f"repetition_n_grams must be <= {MAX_N_GRAMS}, got {self.repetition_n_grams}")
        if self.repetition_max_penalty > 0:
            raise ValueError(f"repetition_max_penalty must be <= 0 (a penalty), got {self.repetition_max_penalty}")
        if not 0 <= self.substance_min_words <= MAX_N_GRAMS:
            raise ValueError(f"substance_min_words must be from 0 to {MAX_N_GRAMS}, got {self.substance_min_words}")
        for name in ("cosine_max_len", "soft_max_length", "soft_cache_length"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 (tokens), got {value}")
            if value is not None and value > MAX_LENGTH_TOKENS:
                raise ValueError(f"{name} must be <= {MAX_LENGTH_TOKENS} (tokens), got {value}")
        cache, max_length = self.soft_cache_length, self.soft_max_length
        if cache is not None and max_length is not None and cache >= max_length:
            raise ValueError(f"soft_cache_length ({cache}) must be less than soft_max_length ({max_length})")


def _is_real(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
