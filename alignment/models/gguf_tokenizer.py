"""A GGUF's tokenizer: its metadata (token strings, merges or SentencePiece scores, token types, special ids, and
the name of a pre-tokenizer, tokenizer.ggml.pre, whose regular expressions live in llama.cpp's source) as a
transformers tokenizer that tokenizes as llama.cpp does, checked against the model's embedding and with its chat
template tried; and generation_config.json's special ids."""

from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from alignment.basics.errors import GGUFImportError
from alignment.models.gguf_model import metadata_value

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# The pre-tokenizers of llama.cpp (src/llama-vocab.cpp): tokenizer.ggml.pre -> (regular expressions, applied in
# turn, each splitting every piece further and keeping what it does not match; clean_up_tokenization_spaces).
# Digits matter: SmolLM splits numbers into single digits, Llama 3 into groups of up to three, GPT-2 not at all.
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3_SPLIT = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
PRE_TOKENIZERS = {
    "default": ([r"[\p{P}\$\+<=>\^~\|]+", GPT2_SPLIT, r"\p{N}+", "[0-9][0-9][0-9]"], True),
    **dict.fromkeys(["llama3", "llama-v3", "llama-bpe", "dbrx", "smaug-bpe"], ([LLAMA3_SPLIT], True)),
    **dict.fromkeys(["qwen2", "deepseek-r1-qwen"], ([QWEN2_SPLIT], False)),
    **dict.fromkeys(["stablelm2", "megrez"], ([QWEN2_SPLIT], True)),
    **dict.fromkeys(["smollm", "command-r"], ([r"\p{N}", GPT2_SPLIT], False)),
    **dict.fromkeys(["starcoder", "refact", "codeshell", "exaone", "minerva-7b"], ([r"\p{N}", GPT2_SPLIT], True)),
    **dict.fromkeys(["gpt-2", "phi-2", "mpt", "olmo", "jais"], ([GPT2_SPLIT], True)),
}
IGNORE_MERGES = {"llama3", "llama-v3", "llama-bpe"}  # llama.cpp takes a whole piece found in the vocabulary as one token


def check_token_ids(source: Path, metadata: dict, config: dict) -> None:
    """The vocabulary has a row of token_embd.weight for each token and one type and score for each where it has those,
    and every special token id the metadata name lies inside it."""
    tokens = metadata.get("tokenizer.ggml.tokens", [])
    if not isinstance(tokens, list) or len(tokens) > config["vocab_size"]:
        held = f"holds {len(tokens)} tokens" if isinstance(tokens, list) else "is not an array"
        raise GGUFImportError(f"{source}: tokenizer.ggml.tokens {held}; it must be an array of at most the "
                              f"{config['vocab_size']} rows of token_embd.weight")
    for key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
        values = metadata.get(key, tokens)
        if not isinstance(values, list) or len(values) != len(tokens):
            raise GGUFImportError(f"{source}: {key} must be an array of one value for each of the {len(tokens)} tokens")
    vocabulary = len(tokens) or config["vocab_size"]
    for key in sorted(k for k in metadata if k.startswith("tokenizer.ggml.") and k.endswith("_token_id")):
        if not 0 <= int(metadata[key]) < vocabulary:
            raise GGUFImportError(f"{source}: {key} is {metadata[key]}, outside the vocabulary of {vocabulary} tokens")


def check_chat_template(source: Path, tokenizer) -> None:
    """The GGUF's chat template (someone else's code, run by jinja's sandbox) renders a short conversation within the
    limits every rendering has (alignment/models/template_limits.py), or the import is refused."""
    from alignment.basics.errors import ChatTemplateError
    from alignment.models.template_limits import bounded_chat_template

    if tokenizer.chat_template is None:
        return
    conversation = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "What is 2+2?"},
                    {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}]
    try:
        bounded_chat_template(tokenizer.apply_chat_template)(conversation, add_generation_prompt=True, tokenize=False)
    except ChatTemplateError as error:
        raise GGUFImportError(f"{source}: tokenizer.chat_template {error}") from None
    except Exception as error:  # jinja's own errors, or the template's raise_exception("...")
        raise GGUFImportError(f"{source}: tokenizer.chat_template cannot render a conversation ({type(error).__name__}: {error})") from None


def generation_config(metadata: dict) -> dict:
    """bos / eos / pad as generate() reads them; eos lists the end-of-turn token too where the GGUF names one."""
    eos = list(
        dict.fromkeys(metadata[key] for key in (f"tokenizer.ggml.{name}_token_id" for name in ("eos", "eot", "eom")) if key in metadata)
    )
    config = {
        "bos_token_id": metadata.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos[0] if len(eos) == 1 else eos or None,
        "pad_token_id": metadata.get("tokenizer.ggml.padding_token_id"),
    }
    return {key: value for key, value in config.items() if value is not None}


def build_tokenizer(source: Path, metadata: dict):
    """The GGUF's vocabulary as a transformers PreTrainedTokenizerFast (saved as tokenizer.json + tokenizer_config.json),
    tokenizing as llama.cpp does: byte-level BPE (tokenizer.ggml.model gpt2) or SentencePiece-style BPE (llama).
    CONTROL (and UNKNOWN) tokens become special added tokens, USER_DEFINED ones plain added tokens: both are matched
    in the text before anything else, as llama.cpp's special-token pass does."""
    kind = metadata_value(source, metadata, "tokenizer.ggml.model")
    tokens = list(metadata_value(source, metadata, "tokenizer.ggml.tokens"))
    types = list(metadata.get("tokenizer.ggml.token_type", [NORMAL] * len(tokens)))
    if len(set(tokens)) != len(tokens):
        raise GGUFImportError(f"{source}: tokenizer.ggml.tokens repeats a token string; a BPE vocabulary needs each once")
    if kind == "gpt2":
        tokenizer, clean_spaces = _byte_level_bpe(source, metadata, tokens)
    elif kind == "llama":
        tokenizer, clean_spaces = _sentencepiece_bpe(source, metadata, tokens, types)
    else:
        raise GGUFImportError(
            f"{source}: tokenizer.ggml.model is {kind!r}; the importer reads gpt2 (byte-level BPE) and llama (SentencePiece) vocabularies"
        )
    added = [(t, type_) for t, type_ in zip(tokens, types) if type_ in (CONTROL, UNKNOWN, USER_DEFINED)]
    tokenizer.add_tokens([AddedToken(t, special=type_ != USER_DEFINED, normalized=False) for t, type_ in added])

    def token(key):
        index = metadata.get(f"tokenizer.ggml.{key}_token_id")
        return None if index is None or not 0 <= int(index) < len(tokens) else tokens[int(index)]

    bos, eos = token("bos"), token("eos")
    prefix = [bos] if bos is not None and metadata.get("tokenizer.ggml.add_bos_token", False) else []
    suffix = [eos] if eos is not None and metadata.get("tokenizer.ggml.add_eos_token", False) else []
    if prefix or suffix:  # e.g. Llama 2 and 3: <s> / <|begin_of_text|> before every text
        single = [*prefix, "$A", *suffix]
        tokenizer.post_processor = processors.TemplateProcessing(
            single=" ".join(single),
            pair=" ".join(single + [f"{t}:1" for t in [*prefix, "$B", *suffix]]),
            special_tokens=[(t, tokens.index(t)) for t in dict.fromkeys(prefix + suffix)],
        )
    context = metadata.get(f"{metadata.get('general.architecture')}.context_length")
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=bos,
        eos_token=eos,
        unk_token=token("unknown"),
        pad_token=token("padding"),
        chat_template=metadata.get("tokenizer.chat_template"),
        clean_up_tokenization_spaces=clean_spaces,
        model_max_length=int(context) if context else None,
    )


def _byte_level_bpe(source: Path, metadata: dict, tokens: list) -> tuple:
    """-> (the tokenizer, clean_up_tokenization_spaces): merges as listed, pieces split by tokenizer.ggml.pre's regexes."""
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        known = ", ".join(sorted(PRE_TOKENIZERS))
        raise GGUFImportError(f"{source}: tokenizer.ggml.pre is {pre!r}, a pre-tokenizer the importer does not know; it knows {known}")
    splits, clean_spaces = PRE_TOKENIZERS[pre]
    merges = [tuple(merge.split(" ", 1)) for merge in metadata_value(source, metadata, "tokenizer.ggml.merges")]
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, ignore_merges=pre in IGNORE_MERGES))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(pattern), behavior="isolated") for pattern in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer, clean_spaces


def _sentencepiece_bpe(source: Path, metadata: dict, tokens: list, types: list) -> tuple:
    """-> (the tokenizer, clean_up_tokenization_spaces) for llama.cpp's SPM vocabularies (Llama 2, Mistral, TinyLlama):
    spaces become ▁, and ▁ starts each text and each text after a special token (add_space_prefix, as llama.cpp does);
    adjacent pieces merge while their concatenation is a token, the highest-scoring one first, so the merges are
    every two-piece split of every token, ranked by that token's score; characters no token covers become <0xXX>."""
    scores = list(metadata_value(source, metadata, "tokenizer.ggml.scores"))
    vocab = {t: i for i, t in enumerate(tokens)}
    splits = [(i, k) for i, t in enumerate(tokens) if types[i] in (NORMAL, USER_DEFINED) for k in range(1, len(t))]
    merges = sorted((-scores[i], i, k) for i, k in splits if tokens[i][:k] in vocab and tokens[i][k:] in vocab)
    unknown = metadata.get("tokenizer.ggml.unknown_token_id")
    tokenizer = Tokenizer(models.BPE(
        vocab=vocab, merges=[(tokens[i][:k], tokens[i][k:]) for _, i, k in merges],
        unk_token=None if unknown is None else tokens[int(unknown)], fuse_unk=True, byte_fallback=True,
    ))
    space_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁")] * space_prefix + [normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()] + [decoders.Strip(" ", 1, 0)] * space_prefix
    )
    return tokenizer, False
