"""Write a tiny random-weight Llama model and a matching local tokenizer to OUT_DIR.

Runs in `.venv-vllm` (torch, transformers and tokenizers come with vLLM):

    .venv-vllm/bin/python tests/servers/make_tiny_llama.py .cache/tiny-llama

Nothing is downloaded: the vocabulary is generated here, the weights are random from a fixed seed,
so the output is the same on every machine. Shapes suit vLLM's CPU backend: 4 heads of 64.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

SEED = 1234
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]
# A few plain words so prompts read naturally; the rest are generated syllable words.
PLAIN = [
    "the",
    "a",
    "an",
    "of",
    "to",
    "and",
    "in",
    "is",
    "it",
    "on",
    "for",
    "with",
    "as",
    "at",
    "by",
    "from",
    "this",
    "that",
    "queue",
    "request",
    "requests",
    "server",
    "model",
    "token",
    "tokens",
    "gpu",
    "cpu",
    "scale",
    "scaler",
    "load",
    "wait",
    "waiting",
    "run",
    "running",
    "batch",
    "cache",
    "hello",
    "world",
    "once",
    "upon",
    "time",
    "there",
    "was",
    "little",
    "fox",
    "dog",
    "cat",
    "tree",
    "river",
]
VOCAB_SIZE = 1024


def vocabulary() -> list[str]:
    words: list[str] = list(SPECIAL)
    seen = set(words)
    for word in PLAIN:
        if word not in seen:
            words.append(word)
            seen.add(word)
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    for n in (1, 2, 3):
        for parts in itertools.product(syllables, repeat=n):
            if len(words) >= VOCAB_SIZE:
                return words
            word = "".join(parts)
            if word not in seen:
                words.append(word)
                seen.add(word)
    return words


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[1])

    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = vocabulary()
    vocab = {word: i for i, word in enumerate(words)}
    unk_id, bos_id, eos_id, pad_id = (vocab[t] for t in SPECIAL)

    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )
    assert len(tokenizer) == len(words) == VOCAB_SIZE, (len(tokenizer), len(words))

    config = LlamaConfig(
        vocab_size=len(words),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    assert config.hidden_size // config.num_attention_heads == 64
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).eval()

    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    print(f"wrote {out}: {params} parameters, vocab {len(words)}, unk {unk_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
