"""A trained reward model: a sequence-classification model with one output (num_labels=1), such as
Qwen2ForSequenceClassification, whose score at a sequence's last token is the reward of the whole
(prompt, completion) conversation. It runs in the trainer's process, in eval mode, without gradients."""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import paddle
from paddleformers.transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from alignment.models.modeling import check_every_weight_stored


class RewardModel:
    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer
        self.model.eval()

    @classmethod
    def load(cls, path: str, dtype: str = "float32") -> "RewardModel":
        """From a local folder holding the model (config.json, safetensors) and its tokenizer."""
        folder = Path(path)
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(
                f"reward model {path}: no config.json there (expected a folder with a sequence-classification "
                "model and its tokenizer)"
            )
        config = AutoConfig.from_pretrained(path)
        architectures = config.architectures or []
        if architectures and not any(name.endswith("ForSequenceClassification") for name in architectures):
            raise ValueError(
                f"reward model {path} holds a {', '.join(architectures)}, not a *ForSequenceClassification model"
            )
        if config.num_labels != 1:
            raise ValueError(
                f"reward model {path} has num_labels={config.num_labels}; a reward model gives one score (num_labels=1)"
            )
        model = AutoModelForSequenceClassification.from_pretrained(
            path, dtype=dtype, load_checkpoint_format="unified_checkpoint"
        )
        check_every_weight_stored(model, folder)  # a score head left at random would score silently
        if not isinstance(getattr(model, "score", None), paddle.nn.Layer):
            raise ValueError(f"reward model {path}: {type(model).__name__} has no `score` head")
        return cls(model, AutoTokenizer.from_pretrained(path))

    def encode(self, sample: Mapping[str, Any], completion: str) -> list[int]:
        """The token ids the model scores: a user/assistant conversation through the reward model's own chat
        template, or prompt + completion where its tokenizer has none."""
        prompt = sample.get("prompt")
        if not isinstance(prompt, str):
            raise ValueError(f"sample 'prompt' must be text, got {prompt!r}")
        if getattr(self.tokenizer, "chat_template", None):
            conversation = [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
            ids = self.tokenizer.apply_chat_template(conversation, tokenize=True, add_generation_prompt=False)
            ids = ids["input_ids"] if isinstance(ids, Mapping) else ids
        else:
            ids = self.tokenizer(prompt + completion)["input_ids"]
        if not ids:
            raise ValueError("prompt and completion are empty: nothing to score")
        return list(ids)

    def score(self, samples: list[Mapping], completions: list[str], batch_size: int = 16) -> np.ndarray:
        """-> (B,) float64: the score logit at each sequence's last token."""
        if len(samples) != len(completions):
            raise ValueError(f"{len(completions)} completions but {len(samples)} samples")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        sequences = [self.encode(sample, completion) for sample, completion in zip(samples, completions, strict=True)]
        order = np.argsort([len(ids) for ids in sequences], kind="stable")  # similar lengths share a batch
        scores = np.empty(len(sequences), dtype=np.float64)
        with paddle.no_grad():
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                scores[rows] = self._score_batch([sequences[row] for row in rows])
        return scores

    def _score_batch(self, sequences: list[list[int]]) -> np.ndarray:
        # Right-padded: every real token keeps positions 0..n-1 and, attention being causal, never sees a pad.
        lengths = np.array([len(ids) for ids in sequences])
        ids = np.zeros((len(sequences), lengths.max()), dtype=np.int64)  # (B, W); pad id 0 is masked out
        mask = np.zeros_like(ids)
        for row, sequence in enumerate(sequences):
            ids[row, : len(sequence)] = sequence
            mask[row, : len(sequence)] = 1
        base = getattr(self.model, self.model.base_model_prefix)
        hidden = base(
            paddle.to_tensor(ids), attention_mask=paddle.to_tensor(mask), use_cache=False, return_dict=True
        ).last_hidden_state  # (B, W, H)
        # Our own last-token index: the model's forward finds it from the first pad_token_id, which is wrong
        # when that id also occurs in the text (pad = eos in many tokenizers) or the config has none.
        last = paddle.to_tensor(np.stack([np.arange(len(sequences)), lengths - 1], axis=1))
        values = self.model.score(paddle.gather_nd(hidden, last))  # (B, 1)
        return values.astype("float32").numpy()[:, 0]
