"""Request and response bodies; FastAPI turns them into validation and the OpenAPI schema."""

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat

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
    answer: str | int | float | None = Field(None, description="the reference answer (sample['answer'])")


class ScoreRequest(BaseModel):
    items: list[Item]
    reward_funcs: list[str] | None = Field(None, description="reward function names; default: the server's")
    reward_weights: list[FiniteFloat] | None = Field(None, description="one per function; default: all 1.0")


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
