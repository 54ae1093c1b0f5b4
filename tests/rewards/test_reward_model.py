"""RewardModel on a tiny random Qwen2ForSequenceClassification saved to disk, against the base model run one
unpadded sequence at a time."""

import json
import shutil

import numpy as np
import paddle
import pytest
from safetensors.numpy import load_file, save_file
from helpers.tiny_models import save_with_tokenizer, tiny_classifier

from alignment.rewards.reward_model import RewardModel

TOKENIZER = "data/tiny-qwen2"
SAMPLES = [
    {"prompt": "Mia has 12 apples and buys 7 more. How many now?", "answer": "19"},
    {"prompt": "2 + 2?", "answer": "4"},
    {"prompt": "Natalia sold 48 clips in April and half as many in May. How many in all?", "answer": "72"},
]
COMPLETIONS = [
    "<think>12 + 7 = 19</think><answer>19</answer>",
    "4",
    "In May she sold 48 / 2 = 24 clips, so 48 + 24 = 72 in all.\n#### 72",
]


@pytest.fixture(scope="module")
def classifier():
    model = tiny_classifier()
    model.eval()
    return model


@pytest.fixture(scope="module")
def folder(classifier, tmp_path_factory):
    return save_with_tokenizer(classifier, tmp_path_factory.mktemp("rm"))


def one_at_a_time(classifier, sequences) -> np.ndarray:
    """The second code path: each sequence alone, unpadded, its last hidden state @ the score weight (H, 1)."""
    with paddle.no_grad():
        outputs = [classifier.model(paddle.to_tensor([ids]), return_dict=True) for ids in sequences]
        return np.array([float(out.last_hidden_state[0, -1] @ classifier.score.weight[:, 0]) for out in outputs])


def test_scores_equal_the_base_models_last_token_one_sequence_at_a_time(classifier, folder):
    model = RewardModel.load(str(folder))
    tokenizer = model.tokenizer
    # The chat template's text, written out: <|im_start|>role\ncontent<|im_end|>\n per turn, no generation cue.
    texts = [
        f"<|im_start|>user\n{s['prompt']}<|im_end|>\n<|im_start|>assistant\n{c}<|im_end|>\n"
        for s, c in zip(SAMPLES, COMPLETIONS)
    ]
    sequences = [tokenizer(text)["input_ids"] for text in texts]
    assert [model.encode(s, c) for s, c in zip(SAMPLES, COMPLETIONS)] == sequences
    scores = model.score(SAMPLES, COMPLETIONS)
    assert scores.dtype == np.float64 and scores.shape == (3,)
    np.testing.assert_allclose(scores, one_at_a_time(classifier, sequences), rtol=0, atol=1e-5)
    assert np.ptp(scores) > 1e-3  # a random head still tells the three apart


def test_batching_and_padding_do_not_change_scores(folder):
    model = RewardModel.load(str(folder))
    samples, completions = SAMPLES * 3, [c + " " * i for i, c in enumerate(COMPLETIONS * 3)]
    alone = model.score(samples, completions, batch_size=1)
    for batch_size in (2, 4, 16):
        np.testing.assert_allclose(model.score(samples, completions, batch_size=batch_size), alone, rtol=0, atol=1e-5)
    reversed_scores = model.score(samples[::-1], completions[::-1], batch_size=4)
    np.testing.assert_allclose(reversed_scores[::-1], alone, rtol=0, atol=1e-5)
    assert model.score([], []).shape == (0,)


def test_without_a_chat_template_it_scores_prompt_plus_completion(classifier, tmp_path):
    folder = save_with_tokenizer(classifier, tmp_path, chat_template=False)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert "chat_template" not in config
    model = RewardModel.load(str(folder))
    sequences = [model.tokenizer(s["prompt"] + c)["input_ids"] for s, c in zip(SAMPLES, COMPLETIONS)]
    assert [model.encode(s, c) for s, c in zip(SAMPLES, COMPLETIONS)] == sequences
    np.testing.assert_allclose(
        model.score(SAMPLES, COMPLETIONS), one_at_a_time(classifier, sequences), rtol=0, atol=1e-5
    )


def test_bad_folders_and_inputs_give_clear_errors(folder, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"reward model .*/nowhere: no config.json there"):
        RewardModel.load(str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match=r"holds a Qwen2ForCausalLM, not a \*ForSequenceClassification model"):
        RewardModel.load(TOKENIZER)
    two_labels = save_with_tokenizer(tiny_classifier(num_labels=2), tmp_path / "two")
    with pytest.raises(ValueError, match=r"has num_labels=2; a reward model gives one score \(num_labels=1\)"):
        RewardModel.load(str(two_labels))
    headless = tmp_path / "headless"
    shutil.copytree(folder, headless)
    weights = headless / "model.safetensors"
    save_file({k: v for k, v in load_file(weights).items() if k != "score.weight"}, weights, metadata={"format": "np"})
    with pytest.raises(ValueError, match="lack 1 of the model's weights: score.weight"):
        RewardModel.load(str(headless))

    model = RewardModel.load(str(folder))
    with pytest.raises(ValueError, match="2 completions but 1 samples"):
        model.score(SAMPLES[:1], COMPLETIONS[:2])
    with pytest.raises(ValueError, match="sample 'prompt' must be text, got None"):
        model.score([{"answer": "4"}], ["4"])
