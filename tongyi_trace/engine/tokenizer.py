"""The engine's optional tokenizer: a small byte-level BPE built here, so the CPU vLLM serves text, chat and /tokenize.

`kvtrace engine start --tokenizer` writes it beside the tiny Qwen2's config.json and starts vLLM without
--skip-tokenizer-init. Nothing is downloaded: the BPE is trained in-process (Hugging Face `tokenizers`) on
a text this module generates from a fixed seed (pseudo-words, sentences, numbers, code-like lines), so
every build gives the same tokenizer.json. Ids: 0 `<|endoftext|>`, 1 `<|im_start|>`, 2 `<|im_end|>` (the
model config's eos_token_id 2), then the 256 byte symbols and the learned merges (NFC, then Qwen2's split
and byte-level symbols, as transformers builds a qwen2 tokenizer); the vocabulary is padded
to the model's VOCAB_SIZE with filler tokens that no text encodes to (the random model generates any id
below VOCAB_SIZE, and vLLM must be able to detokenize each). tokenizer_config.json holds a ChatML chat
template (Qwen's form: `<|im_start|>role\\ncontent<|im_end|>\\n`, then `<|im_start|>assistant\\n` when a
generation prompt is asked for).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from tongyi_trace.atomic import atomic_write_text

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TRAINED_VOCAB_SIZE = 8000  # byte symbols + merges learned from the generated text (before the padding)
CORPUS_SEED = 20250711
# The pre-tokenizer split of Qwen2 (one digit a piece): transformers 5 builds a qwen2 model's tokenizer with
# it whatever tokenizer.json says, so the file carries it too and a local encode equals the engine's.
QWEN2_SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                       r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
_SYLLABLES = ("ka", "ri", "to", "ne", "sa", "mu", "lo", "ve", "di", "an", "en", "or", "th", "st", "qu", "ing",
              "er", "al", "co", "de", "pre", "tion", "ex", "im", "ly", "ous", "ble", "ment", "ra", "ze")
_CODE = ("def ", "return ", "import ", "class ", "for ", "in ", "if ", "else:", "self.", " = ", "(", ")", "[",
         "]", "{", "}", ": ", ", ", "\n    ", "\n", "# ", '"', "'", "==", "+", "-", "*", "/")


def corpus_text(num_words: int = 60_000, seed: int = CORPUS_SEED) -> str:
    """The training text: NUM_WORDS pseudo-words in sentences, with numbers, punctuation and code-like lines
    (deterministic for SEED)."""
    rng = random.Random(seed)
    words = ["".join(rng.choice(_SYLLABLES) for _ in range(rng.choice((1, 1, 2, 2, 3, 4)))) for _ in range(3000)]
    weights = [1.0 / (rank + 1) for rank in range(len(words))]  # Zipf-like word frequencies
    out: list[str] = []
    n = 0
    while n < num_words:
        kind = rng.random()
        if kind < 0.8:
            k = rng.randint(4, 16)
            sent = rng.choices(words, weights, k=k)
            sent[0] = sent[0].capitalize()
            if rng.random() < 0.3:
                sent.insert(rng.randrange(len(sent)), str(rng.randint(0, 99_999)))
            out.append(" ".join(sent) + rng.choice((". ", ". ", "? ", "! ", ", ", ".\n", ":\n")))
            n += k
        else:
            k = rng.randint(3, 10)
            out.append("".join(rng.choice(_CODE) + rng.choice(words) for _ in range(k)) + "\n")
            n += k
    return "".join(out)


def build_tokenizer_json(vocab_size: int) -> str:
    """The tokenizer.json text: a byte-level BPE trained on corpus_text(), padded to VOCAB_SIZE ids."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=min(TRAINED_VOCAB_SIZE, vocab_size), min_frequency=2,
                                  special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus_text().splitlines(keepends=True), trainer)
    doc: dict[str, Any] = json.loads(tok.to_str())
    vocab: dict[str, int] = doc["model"]["vocab"]
    next_id = max(vocab.values()) + 1
    while next_id < vocab_size:  # filler ids: never produced by encoding, decodable
        vocab[f"<|filler_{next_id}|>"] = next_id
        next_id += 1
    return json.dumps(doc, ensure_ascii=False, indent=1) + "\n"


def tokenizer_config() -> dict[str, Any]:
    """tokenizer_config.json: the fast tokenizer class, the special tokens and the ChatML chat template."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {str(i): {"content": t, "special": True, "lstrip": False, "rstrip": False,
                                          "normalized": False, "single_word": False}
                                 for i, t in enumerate(SPECIAL_TOKENS)},
    }


def write_tokenizer_files(model_dir: Path, vocab_size: int) -> Path:
    """Write tokenizer.json and tokenizer_config.json into MODEL_DIR (same bytes on every build; written
    atomically, so engines started at once are safe); return the tokenizer.json path."""
    path = model_dir / "tokenizer.json"
    text = build_tokenizer_json(vocab_size)
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        atomic_write_text(path, text)
    atomic_write_text(model_dir / "tokenizer_config.json",
                      json.dumps(tokenizer_config(), indent=2) + "\n")
    return path
