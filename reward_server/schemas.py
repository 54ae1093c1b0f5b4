"""Request and response bodies; FastAPI turns them into validation and the OpenAPI schema."""

import math
from dataclasses import fields
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, create_model, field_validator, model_validator

from alignment.rewards import RewardSettings

Score = Annotated[float | None, Field(description="null where the item could not be scored")]


class PaddleNLPRequest(BaseModel):
    src: list[str] = Field(description="prompts (the reward functions see each as sample['prompt'] and ['src'])")
    tgt: list[str] = Field(description="reference answers (sample['answer'] and ['tgt'])")
    response: list[str] = Field(description="completions to score")


class PaddleNLPResponse(BaseModel):
    error_code: int = Field(0, description="0: all scored; 1: some items failed (their score is null)")
    error_msg: str = "Success"
    score: list[Score]


class Item(BaseModel):
    # Every other dataset column travels with the item to the reward functions, as in process.
    model_config = ConfigDict(extra="allow")

    completion: str
    prompt: str | None = Field(None, description="the question text (sample['prompt'])")
    answer: str | int | float | None = Field(
        None, description="the reference answer (sample['answer']): a string, an integer or a finite number"
    )

    @field_validator("answer", mode="before")
    @classmethod
    def _a_real_answer(cls, value):
        # As in the trainer's data files: true would pass for 1, and NaN or Infinity (JSON extensions
        # Python reads) compares equal to nothing, so they are refused, not scored.
        if isinstance(value, bool) or isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"must be a string, an integer or a finite number, got {value!r}")
        return value


class _CheckedSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt key is a 422 naming it, not a silent default

    @model_validator(mode="after")
    def _in_range(self):
        self.to_settings()  # RewardSettings' own checks; their ValueError names the field
        return self

    def to_settings(self) -> RewardSettings:
        return RewardSettings(**self.model_dump())


# RewardSettings' fields, types and defaults, generated so that the two cannot drift apart.
RewardSettingsBody = create_model(
    "RewardSettings",
    __base__=_CheckedSettings,
    **{field.name: (field.type, field.default) for field in fields(RewardSettings)},
)


class ScoreRequest(BaseModel):
    items: list[Item]
    reward_funcs: list[str] | None = Field(None, description="reward function names; default: the server's")
    reward_weights: list[FiniteFloat] | None = Field(None, description="one per function; default: all 1.0")
    reward_settings: RewardSettingsBody | None = Field(
        None,
        description="parameters of the length and repetition rewards (cosine, repetition, soft_overlong); "
        "default: RewardSettings' defaults, with cosine_max_len and soft_max_length unset",
    )


class ScoreResponse(BaseModel):
    scores: list[Score] = Field(description="weighted sum per item")
    components: dict[str, list[Score]] = Field(description="each function's value per item")
    errors: list[str | None] = Field(description="why the item could not be scored, else null")


class RewardFunc(BaseModel):
    name: str
    description: str


class RewardFuncsResponse(BaseModel):
    reward_funcs: list[RewardFunc]
    default: list[str] = Field(description="what POST / applies and /v1/score applies when not told")


class Health(BaseModel):
    status: str
    workers: int
