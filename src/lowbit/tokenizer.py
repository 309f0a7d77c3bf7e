"""Tokenizer: the GGUF vocabulary as a Hugging Face `tokenizers` model, token for token llama.cpp's.

    tok = Tokenizer.from_gguf(lowbit.gguf.open(path).metadata)
    ids = tok.encode("<|im_start|>user\\nHi<|im_end|>")   # special tokens in the text -> their ids
    tok.decode(ids) == "<|im_start|>user\\nHi<|im_end|>"
    s = tok.stream(); "".join(s.push(i) for i in ids) + s.flush()   # the same text, piece by piece

The contract is llama.cpp's tokenizer (llama-vocab.cpp, unicode.cpp), which is what the GGUF
file was made for and what the parity tests compare against:

- `tokenizer.ggml.model == "gpt2"`: byte-level BPE. The text is split by the regexes llama.cpp
  lists for the file's `tokenizer.ggml.pre` (applied one after the other, each keeping the
  unmatched gaps as pieces: a `Split(..., "isolated")` each), then every piece is byte-mapped
  and merged by `tokenizer.ggml.merges` rank.
- `tokenizer.ggml.model == "gemma4"` (Gemma 4): BPE by merge rank on raw UTF-8 (no byte mapping):
  spaces become "▁", the text is split into runs of newlines and runs of anything else, a run of
  newlines that is a token is that token, and the rest merge by `tokenizer.ggml.merges` rank;
  BOS is always added (llama.cpp's override for Gemma 4).
- `tokenizer.ggml.model == "llama"`: SentencePiece-style BPE. Spaces become "▁", a space is
  put in front of the text (and after every special token) when add_space_prefix is set, and
  adjacent symbols merge into the vocabulary token with the highest `tokenizer.ggml.scores`
  entry first; characters that form no token fall back to the `<0xXX>` byte tokens.
- Control, user-defined and unknown tokens written in the text are cut out first, longest
  token text first, exactly as llama.cpp's `tokenizer_st_partition` does (with `special=False`
  only the user-defined ones are). That cut is done here rather than by `tokenizers`' own
  added-token matcher, whose leftmost-longest rule and handling of the SentencePiece space
  prefix differ from llama.cpp's in corner cases.
- BOS/EOS rules, the end-of-generation set and token attributes follow llama_vocab::load.

The merging itself is always done by `tokenizers` (a `models.BPE`); this module only builds it
from the GGUF arrays and reproduces llama.cpp's bookkeeping around it. Decoding is by table:
each token's bytes (`piece`) are what llama.cpp's `llama_token_to_piece(..., special=True)` gives.
"""
from __future__ import annotations

import codecs
import json
import re
from datetime import datetime

# Token attributes: the bit values of llama.h's llama_token_attr, so tests can compare them
# with llama.cpp's own.
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
ATTR_LSTRIP = 1 << 7
ATTR_RSTRIP = 1 << 8

# tokenizer.ggml.token_type values -> attributes (llama_token_type in llama.h)
_TYPE_ATTR = {1: ATTR_NORMAL, 2: ATTR_UNKNOWN, 3: ATTR_CONTROL, 4: ATTR_USER_DEFINED,
              5: ATTR_UNUSED, 6: ATTR_BYTE}

# ---------------------------------------------------------------------------------------------
# Pre-tokenizer regexes, copied from llama-vocab.cpp (llm_tokenizer_bpe, one list per
# LLAMA_VOCAB_PRE_TYPE_*). llama.cpp evaluates them either with hand-written matchers or with
# std::regex over text whose non-ASCII code points are collapsed to their category; both treat
# \p{Lu}, \p{Ll}, \p{Lt}, \p{Lm} and \p{Lo} as \p{L}, and we do the same (see _regex).
_R_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_R_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_R_LLAMA3 = (_R_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_R_QWEN2 = (_R_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_R_DEEPSEEK3 = ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
                "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+")
_R_SPARK = ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
            "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+")
# (non-ASCII characters are written as escapes: an editor's Unicode normalization would
# silently change some of them)
_R_CJK_DEEPSEEK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_R_KANA_HAN = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
_R_PORO = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"
_R_DEEPSEEK_LETTERS = (
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc"
    "\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
    "\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06"
    "\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943]+")
_R_TEKKEN_WORD = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+@C@"
                  r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*@C@")
_R_CASED_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"

PRE_REGEXES: dict[str, list[str]] = {
    "DEFAULT": [r"[\p{P}\$\+<=>\^~\|]+", _R_GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
    "LLAMA3": [_R_LLAMA3],
    "JAIS2": [_R_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)"
              r"|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}"],
    "DEEPSEEK_LLM": ["[\r\n]", _R_DEEPSEEK_LETTERS,
                     "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
                     "\\s+$", _R_CJK_DEEPSEEK, r"\p{N}+"],
    "DEEPSEEK3_LLM": [r"\p{N}{1,3}", _R_KANA_HAN, _R_DEEPSEEK3],
    "SPARK2_5": [r"\p{N}{1,3}", _R_KANA_HAN, _R_SPARK, r"\p{N}"],
    "YOUTU": ["[\uac00-\ud7a3\u3131-\u318e]+|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a"
              "\uff1b\uff0c\u3001-\u303f\ufe30-\ufe4f]+|[\u3105-\u312f]+|" + _R_KANA_HAN,
              r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
              + _R_CONTRACTIONS + r"?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
              r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _R_CONTRACTIONS + r"?|\p{N}" + _R_CASED_TAIL],
    "DEEPSEEK_CODER": ["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _R_CJK_DEEPSEEK, r"\p{N}"],
    "FALCON": [r"[\p{P}\$\+<=>\^~\|`]+", _R_GPT2, r"[0-9][0-9][0-9]"],
    "STARCODER": [r"\p{N}", _R_GPT2],
    "GPT2": [_R_GPT2],
    "QWEN2": [_R_QWEN2],
    "QWEN35": [_R_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
               r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "PORO": [_R_PORO],
    "CHATGLM4": [_R_LLAMA3],
    "VIKING": [_R_PORO, r"\p{N}"],
    "TEKKEN": [_R_TEKKEN_WORD.replace("@C@", "") + r"|\p{N}" + _R_CASED_TAIL],
    "GPT4O": [_R_TEKKEN_WORD.replace("@C@", _R_CONTRACTIONS + "?") + r"|\p{N}{1,3}" + _R_CASED_TAIL],
    "GRANITE_EMB_MULTI": [
        _R_TEKKEN_WORD.replace("@C@", _R_CONTRACTIONS + "?").replace(r"(?=[\p{L}])", r"(?=[\p{L}\p{M}])")
        + r"|\p{N}{1,3}" + _R_CASED_TAIL],
    "BAILINGMOE": [r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"],
    "SEED_CODER": [_R_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
                   r"|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "UFAKZEKA": [r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "LAGUNA": [r"[^\n]+|[\n]+", _R_QWEN2],
    "EXAONE_MOE": [_R_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+"],
    "MINICPM5": [r"\p{N}{1,3}", _R_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
}

# tokenizer.ggml.pre -> (regex list, options), as llama_vocab::load maps them. Options:
# ignore_merges (a piece that is a whole token is taken as is), add_bos (the default when
# tokenizer.ggml.add_bos_token is absent), no_bos (the pre-tokenizer drops the BOS token).
_PRE = {}
for _names, _kind, _opts in [
    (["default"], "DEFAULT", ()),
    (["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
      "jina-v5-nano"], "LLAMA3", ("ignore_merges", "add_bos")),
    (["minicpm5"], "MINICPM5", ("ignore_merges",)),
    (["deepseek-llm"], "DEEPSEEK_LLM", ()),
    (["deepseek-coder"], "DEEPSEEK_CODER", ()),
    (["deepseek-v3", "hunyuan-dense", "hy_v4", "joyai-llm"], "DEEPSEEK3_LLM", ()),
    (["spark2_5"], "SPARK2_5", ()),
    (["youtu"], "YOUTU", ("ignore_merges",)),
    (["falcon"], "FALCON", ()),
    (["starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b",
      "mellum2"], "STARCODER", ()),
    (["gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
      "mellum", "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais",
      "exaone4", "trillion", "granite-docling"], "GPT2", ()),
    (["jais-2"], "JAIS2", ()),
    (["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "stablelm2", "megrez", "hunyuan",
      "solar-open"], "QWEN2", ()),
    (["qwen35"], "QWEN35", ()),
    (["dbrx", "smaug-bpe"], "LLAMA3", ()),
    (["poro-chat", "bloom", "gpt3-finnish"], "PORO", ()),
    (["chatglm-bpe"], "CHATGLM4", ("no_bos",)),
    (["glm4", "glm5"], "CHATGLM4", ("no_bos", "ignore_merges")),
    (["viking"], "VIKING", ()),
    (["tekken"], "TEKKEN", ("ignore_merges", "add_bos")),
    (["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"], "GPT4O", ()),
    (["granite-embed-multi-97m"], "GRANITE_EMB_MULTI", ("ignore_merges",)),
    (["bailingmoe", "bailingmoe2", "llada-moe"], "BAILINGMOE", ()),
    (["seed-coder"], "SEED_CODER", ()),
    (["ufakzeka"], "UFAKZEKA", ()),
    (["grok-2"], "QWEN2", ()),
    (["laguna"], "LAGUNA", ()),
    (["exaone-moe"], "EXAONE_MOE", ()),
]:
    for _n in _names:
        _PRE[_n] = (_kind, frozenset(_opts))
# Known to llama.cpp but not here: they need llama.cpp's hand-written splitters (kimi-k2,
# afmoe, tiny_aya, cohere2moe, superbpe), SentencePiece-style BPE on raw UTF-8 under a gpt2 model
# (granite-embed-multi-311m, sarvam-moe, whitespace) or image tokens (chameleon). (The gemma4 model's
# own BPE on raw UTF-8 is supported: Tokenizer.model "gemma4".)
SUPPORTED_PRE = tuple(sorted(_PRE))


# Code points that Unicode 16.0 added to the letter, number, mark, punctuation and symbol
# categories (Oniguruma in `tokenizers` >= 0.21 knows them, llama.cpp's tables do not).
_UNICODE_16_NEW = (
    r"\x{897}\x{1B4E}-\x{1B4F}\x{1B7F}\x{1C89}-\x{1C8A}\x{2427}-\x{2429}\x{31E4}-\x{31E5}"
    r"\x{A7CB}-\x{A7CD}\x{A7DA}-\x{A7DC}\x{105C0}-\x{105F3}\x{10D40}-\x{10D65}\x{10D69}-\x{10D85}"
    r"\x{10D8E}-\x{10D8F}\x{10EC2}-\x{10EC4}\x{10EFC}\x{11380}-\x{11389}\x{1138B}\x{1138E}"
    r"\x{11390}-\x{113B5}\x{113B7}-\x{113C0}\x{113C2}\x{113C5}\x{113C7}-\x{113CA}\x{113CC}-\x{113D5}"
    r"\x{113D7}-\x{113D8}\x{113E1}-\x{113E2}\x{116D0}-\x{116E3}\x{11BC0}-\x{11BE1}\x{11BF0}-\x{11BF9}"
    r"\x{11F5A}\x{13460}-\x{143FA}\x{16100}-\x{16139}\x{16D40}-\x{16D79}\x{18CFF}\x{1CC00}-\x{1CCF9}"
    r"\x{1CD00}-\x{1CEB3}\x{1E5D0}-\x{1E5FA}\x{1E5FF}\x{1F8B2}-\x{1F8BB}\x{1F8C0}-\x{1F8C1}"
    r"\x{1FA89}\x{1FA8F}\x{1FABE}\x{1FAC6}\x{1FADC}\x{1FADF}\x{1FAE9}\x{1FBCB}-\x{1FBEF}")


def _regex(expr: str) -> str:
    """llama.cpp's meaning of a listed regex, for `tokenizers`' (Oniguruma) engine: letter
    subcategories are all \\p{L} (llama.cpp's tables know only "letter"), a final "$"
    (ECMAScript: end of the piece) becomes "\\z" (Oniguruma's "$" also matches before a
    line break such as U+2028), and see below for whitespace."""
    expr = re.sub(r"\\p\{L[ultmo]\}", r"\\p{L}", expr)
    if expr.endswith("$") and not expr.endswith("\\$"):
        expr = expr[:-1] + r"\z"
    if "\\p{" in expr:
        # llama.cpp's category tables (unicode-data.cpp) predate Unicode 16; to them the
        # characters Unicode 16 added are in no category. `tokenizers`' Oniguruma knows them.
        expr = re.sub(r"\\p\{([LNMPS])\}", lambda m: f"[\\p{{{m.group(1)}}}&&[^{_UNICODE_16_NEW}]]", expr)
    else:
        # llama.cpp runs a regex without categories on the text with every non-ASCII
        # whitespace character replaced by "\\v", so such characters never match a class
        # of listed non-ASCII characters (e.g. U+3000 in "[\u3000-\u3002]").
        expr = re.sub(r"(?<!\\)\[([^\^\]][^\]]*?[^\x00-\x7f][^\]]*)(?<!\\)\]",
                      lambda m: "[" + m.group(1) + r"&&[^\s]]", expr)
    return expr


# ---------------------------------------------------------------------------------------------
# End-of-generation and auto-detected special tokens: llama_vocab::load finds these by text.
_EOT_TEXTS = ["<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
              "<end_of_utterance>"]
_EOM_TEXTS = ["<|eom_id|>"]
_FIM_PRE_TEXTS = ["<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                  "▁<PRE>", "<|code_prefix|>", "<|prefix|>"]
_FIM_SUF_TEXTS = ["<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                  "▁<SUF>", "<|code_suffix|>", "<|suffix|>"]
_FIM_MID_TEXTS = ["<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                  "▁<MID>", "<|code_middle|>", "<|middle|>"]
_FIM_PAD_TEXTS = ["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"]
_FIM_REP_TEXTS = ["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"]
_FIM_SEP_TEXTS = ["<|file_sep|>"]
_EOG_TEXTS = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
              "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
              "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
              "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~["}

_C_SPACE = " \t\n\v\f\r"   # C isspace() in the "C" locale: what lstrip/rstrip remove


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: printable stand-in character -> byte."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, n = {}, 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + n)] = b
            n += 1
    return table


_BYTE_DECODER = _byte_decoder()
_BYTE_LATIN1 = {ord(c): b for c, b in _BYTE_DECODER.items()}   # str.translate to latin-1 bytes
# Stands for a byte the byte-level vocabulary has no token for (never a real token text:
# "\x00" is not in the byte-level alphabet).
_UNK_PLACEHOLDER = "\x00<missing byte>"
_HF_CACHE: dict = {}  # Tokenizer._cached_hf: up to 4 built tokenizers, least recently used first


_NEWLINE_RUNS = re.compile(r"[^\n]+|\n+")


class Tokenizer:
    """A GGUF vocabulary that encodes and decodes exactly as llama.cpp does.

    Public attributes: bos_id, eos_id (None when the file has none), eog_ids (every token
    that ends generation, as llama.cpp's llama_vocab_is_eog), vocab_size, add_bos, add_eos,
    add_space_prefix, model ("gpt2", "llama" or "gemma4"), pre (the tokenizer.ggml.pre string),
    chat_template (None when the file has none), attrs (llama_token_attr bits per token).
    """

    def __init__(self, metadata: dict):
        md = metadata
        self.model = md.get("tokenizer.ggml.model")
        if self.model not in ("gpt2", "llama", "gemma4"):
            raise ValueError(f"unsupported tokenizer model {self.model!r} (tokenizer.ggml.model); "
                             "supported: 'gpt2' (byte-level BPE), 'llama' (SentencePiece BPE), "
                             "'gemma4' (BPE on raw UTF-8)")
        tokens = md.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, list) or not tokens:
            raise ValueError("the file has no tokenizer vocabulary (tokenizer.ggml.tokens)")
        n = len(tokens)
        # llama.cpp renames empty token texts so that every text maps to one id
        tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        self.tokens: list[str] = tokens
        self.vocab_size = n
        self._ids = {t: i for i, t in enumerate(tokens)}
        if len(self._ids) != n:
            raise ValueError("tokenizer.ggml.tokens has duplicate token texts")

        types = md.get("tokenizer.ggml.token_type")
        if types is not None and len(types) < n:
            raise ValueError(f"tokenizer.ggml.token_type has {len(types)} entries for {n} tokens")
        self.attrs = [(_TYPE_ATTR.get(t, ATTR_UNDEFINED) if types is not None else ATTR_NORMAL)
                      for t in (types[:n] if types is not None else range(n))]
        scores = md.get("tokenizer.ggml.scores")
        if scores is not None and len(scores) < n:
            raise ValueError(f"tokenizer.ggml.scores has {len(scores)} entries for {n} tokens")
        self.scores = [float(s) for s in scores[:n]] if scores is not None else [0.0] * n

        # --- per-model defaults (llama_vocab::load), then the file's own keys ---
        self.pre = md.get("tokenizer.ggml.pre", "")
        self.ignore_merges = False
        if self.model == "llama":
            bos, eos, unk = 1, 2, 0
            self.add_bos, self.add_space_prefix = True, True
            self._regexes = None
        elif self.model == "gemma4":  # (llama.cpp: special ids only from the file, pre "gemma4")
            bos = eos = unk = None
            self.add_bos, self.add_space_prefix = True, False
            self.pre, self._regexes = "gemma4", None
        else:
            bos, eos, unk = 11, 11, None
            self.add_bos, self.add_space_prefix = False, False
            pre = self.pre or "default"   # llama.cpp warns and uses its default regexes
            if pre not in _PRE:
                raise ValueError(f"unsupported pre-tokenizer {self.pre!r} (tokenizer.ggml.pre); "
                                 f"supported: {', '.join(SUPPORTED_PRE)}")
            kind, opts = _PRE[pre]
            self._regexes = [_regex(r) for r in PRE_REGEXES[kind]]
            self.ignore_merges = "ignore_merges" in opts
            self.add_bos = "add_bos" in opts
            if "no_bos" in opts:
                bos = None
        self.add_eos = False
        self.add_space_prefix = bool(md.get("tokenizer.ggml.add_space_prefix", self.add_space_prefix))

        def special_id(key: str, default: int | None) -> int | None:
            if default is not None and default >= n:
                default = None
            v = md.get(key)
            if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < n:
                return v
            return default   # absent, or out of range (llama.cpp keeps the default then)

        self.bos_id = special_id("tokenizer.ggml.bos_token_id", bos)
        self.eos_id = special_id("tokenizer.ggml.eos_token_id", eos)
        self.unk_id = special_id("tokenizer.ggml.unknown_token_id", unk)
        eot = special_id("tokenizer.ggml.eot_token_id", None)
        eom = special_id("tokenizer.ggml.eom_token_id", None)
        fim = {}
        for name, deprecated in [("pre", "prefix"), ("suf", "suffix"), ("mid", "middle"),
                                 ("pad", None), ("rep", None), ("sep", None)]:
            fim[name] = special_id(f"tokenizer.ggml.fim_{name}_token_id", None)
            if deprecated and fim[name] is None:
                fim[name] = special_id(f"tokenizer.ggml.{deprecated}_token_id", None)
        if "tokenizer.ggml.add_bos_token" in md and self.model != "gemma4":  # (llama.cpp overrides it to true)
            self.add_bos = bool(md["tokenizer.ggml.add_bos_token"])
        if "tokenizer.ggml.add_eos_token" in md:
            self.add_eos = bool(md["tokenizer.ggml.add_eos_token"])

        # --- special tokens found by their text; each gets the control attribute ---
        def find(texts: list[str]) -> int | None:
            # llama.cpp takes the first hit in hash-map order; we take the lowest id
            hits = [self._ids[t] for t in texts if t in self._ids]
            if not hits:
                return None
            tid = min(hits)
            self.attrs[tid] |= ATTR_CONTROL
            return tid

        if eot is None:
            eot = find(_EOT_TEXTS)
        if eom is None:
            eom = find(_EOM_TEXTS)
        for name, texts in [("pre", _FIM_PRE_TEXTS), ("suf", _FIM_SUF_TEXTS),
                            ("mid", _FIM_MID_TEXTS), ("pad", _FIM_PAD_TEXTS),
                            ("rep", _FIM_REP_TEXTS), ("sep", _FIM_SEP_TEXTS)]:
            if fim[name] is None:
                fim[name] = find(texts)
        self.eot_id, self.eom_id, self.fim_ids = eot, eom, fim
        for i, t in enumerate(tokens):   # control tokens named "unused" are unused
            if self.attrs[i] & ATTR_CONTROL and "unused" in t:
                self.attrs[i] |= ATTR_UNUSED

        # --- end of generation (llama_vocab_is_eog) ---
        eog = {fim[k] for k in ("pad", "rep", "sep") if fim[k] is not None}
        for t in _EOG_TEXTS:
            if t in self._ids:
                eog.add(self._ids[t])
                self.attrs[self._ids[t]] |= ATTR_CONTROL
        for t in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):   # gpt-oss
            if t in self._ids:
                self.attrs[self._ids[t]] = ATTR_USER_DEFINED
        eog |= {i for i in (self.eos_id, eot, eom) if i is not None}
        texts = {tokens[i] for i in eog}
        if "<|end|>" in texts and ({"<|return|>", "<|call|>"} <= texts
                                   or {"<|calls|>", "<|flush|>"} <= texts):
            # gpt-oss / solar-open: "<|end|>" ends a message, not the generation
            eog.discard(self._ids["<|end|>"])
            self.attrs[self._ids["<|end|>"]] = ATTR_USER_DEFINED
        if "</s>" in texts and texts & {"<|tool_response>", "<|plamo:eos|>"}:
            eog.discard(self._ids["</s>"])
            self.attrs[self._ids["</s>"]] = ATTR_NORMAL
        self.eog_ids: set[int] = eog

        # --- per-model lstrip/rstrip (llama.cpp sets these by model name) ---
        specials = [i for i in range(n)
                    if self.attrs[i] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)]
        name = str(md.get("general.name", "")).lower()
        arch = str(md.get("general.architecture", ""))
        if (any(p in self.pre for p in ("jina-v2-de", "jina-v2-es", "jina-v2-code"))
                or any(a in arch for a in ("nomic-bert-moe", "jina-bert-v3"))):
            if "<mask>" in self._ids:
                self.attrs[self._ids["<mask>"]] |= ATTR_LSTRIP
        elif any(p in name for p in ("phi-3", "phi3")):
            for i in specials:
                self.attrs[i] |= ATTR_RSTRIP
            for t, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
                if t in self._ids:
                    i = self._ids[t]
                    self.attrs[i] = (self.attrs[i] | ATTR_RSTRIP) if on else (self.attrs[i] & ~ATTR_RSTRIP)
        elif "modern-bert" in name and "[MASK]" in self._ids:
            self.attrs[self._ids["[MASK]"]] |= ATTR_LSTRIP

        # Special tokens cut out of the text before tokenizing, longest text first
        # (llama.cpp's cache_special_tokens order). parse_always: user-defined tokens are cut
        # even when special=False.
        specials.sort(key=lambda i: -len(tokens[i].encode()))
        self._specials = [(tokens[i], i,
                           not (self.attrs[i] & (ATTR_CONTROL | ATTR_UNKNOWN)),
                           bool(self.attrs[i] & ATTR_LSTRIP), bool(self.attrs[i] & ATTR_RSTRIP))
                          for i in specials]

        self._pieces = [self._make_piece(i) for i in range(n)]
        self._hf = self._cached_hf(md)

        template = md.get("tokenizer.chat_template")
        self.chat_template: str | None = template if isinstance(template, str) and template else None
        self._template = None

    @classmethod
    def from_gguf(cls, metadata: dict) -> "Tokenizer":
        """Build from `lowbit.gguf.open(path).metadata`. Unknown tokenizer models or
        pre-tokenizers raise ValueError naming them."""
        return cls(metadata)

    # -----------------------------------------------------------------------------------------
    def _cached_hf(self, md: dict):
        """_build_hf's tokenizer, built once per process for the same inputs (a model loaded again,
        several slots' or tests' loads of one file: the build was 0.25 s of the default model's
        0.45 s load). Keyed by everything _build_hf reads, compared whole: never a stale
        tokenizer for a file rewritten in place. The `tokenizers` object is not changed after
        it is built and encodes from any thread."""
        merges = md.get("tokenizer.ggml.merges")
        key = (self.model, tuple(self.tokens), tuple(merges) if isinstance(merges, list) else merges,
               self.ignore_merges, tuple(self._regexes or ()), tuple(self.scores), self.unk_id)
        hf = _HF_CACHE.pop(key, None)
        if hf is None:
            hf = self._build_hf(md)
        _HF_CACHE[key] = hf  # (most recent last)
        while len(_HF_CACHE) > 4:
            _HF_CACHE.pop(next(iter(_HF_CACHE)), None)
        return hf

    def _build_hf(self, md: dict):
        from tokenizers import Regex
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import models, pre_tokenizers

        vocab = self._ids
        if self.model in ("gpt2", "gemma4"):
            merges_raw = md.get("tokenizer.ggml.merges")
            if not merges_raw:
                raise ValueError(f"{'byte-level ' if self.model == 'gpt2' else ''}BPE vocabulary without "
                                 "tokenizer.ggml.merges")
            merges, seen = [], set()
            for m in merges_raw:
                pos = m.find(" ", 1)   # llama.cpp splits at the first space after position 0
                if pos < 0:
                    continue
                a, b = m[:pos], m[pos + 1:]
                # llama.cpp keeps the first rank of a repeated pair; `tokenizers` needs both
                # halves and the result in the vocabulary (a valid file always has them)
                if (a, b) in seen or a not in vocab or b not in vocab or a + b not in vocab:
                    continue
                seen.add((a, b))
                merges.append((a, b))
            # A byte the vocabulary lacks must still separate its neighbours: llama.cpp keeps
            # it as a symbol that never merges and finally drops it. `tokenizers` would drop it
            # first and merge across the gap, so it gets a placeholder id (vocab_size) that
            # encode removes.
            vocab = dict(vocab)
            vocab[_UNK_PLACEHOLDER] = self.vocab_size
            hf = HFTokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=_UNK_PLACEHOLDER,
                                        fuse_unk=False, ignore_merges=self.ignore_merges))
            if self.model == "gemma4":  # (encode splits the runs of newlines; characters as they are)
                return hf
            hf.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in self._regexes]
                + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        else:
            # SentencePiece BPE: merging symbols a, b is allowed when a+b is a token, and the
            # token with the highest score merges first. As BPE merge ranks: every split of
            # every token into two tokens, ordered by the whole token's score.
            ranked = []
            for i, t in enumerate(self.tokens):
                for k in range(1, len(t)):
                    if t[:k] in vocab and t[k:] in vocab:
                        ranked.append((-self.scores[i], i, k))
            ranked.sort()
            merges = [(self.tokens[i][:k], self.tokens[i][k:]) for _, i, k in ranked]
            unk = self.tokens[self.unk_id] if self.unk_id is not None else None
            hf = HFTokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk,
                                        byte_fallback=True, fuse_unk=False))
        # (no `tokenizers` decoder: decoding goes through `piece`, which gives raw bytes)
        return hf

    def _make_piece(self, i: int) -> bytes:
        """llama_token_to_piece(i, special=True): the bytes one token stands for."""
        a, t = self.attrs[i], self.tokens[i]
        if a & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED):
            return t.encode()
        if a & ATTR_NORMAL:
            if self.model in ("llama", "gemma4"):
                return t.replace("▁", " ").encode()
            # byte-level: each character stands for one byte (a character outside the
            # alphabet cannot occur in a valid file; it is kept as its UTF-8)
            try:
                return t.translate(_BYTE_LATIN1).encode("latin-1")
            except UnicodeEncodeError:
                return b"".join(bytes([_BYTE_DECODER[c]]) if c in _BYTE_DECODER else c.encode()
                                for c in t)
        if a & ATTR_BYTE:
            return bytes([int(t[3:5], 16)])   # "<0xXX>"
        return b""   # unused and undefined tokens render as nothing, as in llama.cpp

    # -----------------------------------------------------------------------------------------
    def _partition(self, text: str, special: bool) -> list:
        """Cut special tokens out of text: a list of str (raw text) and int (token ids)."""
        frags: list = [text] if text else []
        for tok_text, tid, always, lstrip, rstrip in self._specials:
            if not (special or always) or tok_text not in text:
                continue
            out = []
            for f in frags:
                if not isinstance(f, str):
                    out.append(f)
                    continue
                start = 0
                while (j := f.find(tok_text, start)) >= 0:
                    left = f[start:j]
                    if lstrip:
                        left = left.rstrip(_C_SPACE)
                    if left:
                        out.append(left)
                    out.append(tid)
                    start = j + len(tok_text)
                    if rstrip:
                        while start < len(f) and f[start] in _C_SPACE:
                            start += 1
                if start < len(f):
                    out.append(f[start:])
            frags = out
        return frags

    def encode(self, text: str, add_bos: bool | None = None, special: bool = True) -> list[int]:
        """Token ids of text, as llama.cpp's llama_tokenize.

        add_bos: None applies the file's rule (BOS if tokenizer.ggml.add_bos_token, or the
        model type's default; likewise EOS for add_eos_token), as llama_tokenize with
        add_special=True. True always starts with BOS (EOS still by the file's rule);
        False adds neither.
        special: control tokens written in the text (e.g. "<|im_start|>") become their ids,
        as llama.cpp's parse_special=True. User-defined tokens are always recognized.
        """
        if add_bos is None:
            bos, eos = self.add_bos, self.add_eos
        else:
            bos, eos = add_bos, add_bos and self.add_eos
        out: list[int] = []
        if bos:
            if self.bos_id is None:
                raise ValueError("this vocabulary has no BOS token")
            out.append(self.bos_id)
        frags = self._partition(text, special)
        if self.model == "llama":
            prev_special = True   # a space goes in front of the text and after special tokens
            for f in frags:
                if isinstance(f, int):
                    out.append(f)
                    prev_special = True
                    continue
                if self.add_space_prefix and prev_special:
                    f = " " + f
                out.extend(self._hf.encode(f.replace(" ", "▁"), add_special_tokens=False).ids)
                prev_special = False
        elif self.model == "gemma4":  # (llama.cpp's gemma4 pre-tokenizer: "[^\n]+|[\n]+", spaces as ▁)
            for f in frags:
                if isinstance(f, int):
                    out.append(f)
                    continue
                for run in _NEWLINE_RUNS.findall(f.replace(" ", "▁")):
                    if run[0] == "\n" and run in self._ids:  # a run of newlines that is a token
                        out.append(self._ids[run])
                    else:
                        out.extend(i for i in self._hf.encode(run, add_special_tokens=False).ids
                                   if i != self.vocab_size)   # a character without a token: dropped
        else:
            for f in frags:
                if isinstance(f, int):
                    out.append(f)
                else:
                    out.extend(i for i in self._hf.encode(f, add_special_tokens=False).ids
                               if i != self.vocab_size)   # the missing-byte placeholder
        if eos and self.eos_id is not None:
            out.append(self.eos_id)
        return out

    def piece(self, id: int) -> bytes:  # noqa: A002 - the interface's name
        """The raw bytes of one token; control tokens give their text."""
        if not 0 <= id < self.vocab_size:
            raise ValueError(f"token id {id} out of range (vocabulary of {self.vocab_size})")
        return self._pieces[id]

    def is_special(self, id: int) -> bool:  # noqa: A002
        """Control or unknown token: rendered as its text, or skipped with skip_special."""
        return bool(self.attrs[id] & (ATTR_CONTROL | ATTR_UNKNOWN))

    def decode(self, ids: list[int], skip_special: bool = False, at_start: bool = True) -> str:
        """Text of ids: their pieces joined, as UTF-8 (invalid bytes become U+FFFD).

        skip_special drops control and unknown tokens (llama.cpp's special=False rendering).
        For SentencePiece vocabularies with add_space_prefix, the space that encode puts in
        front of the text is removed from the first token after any leading BOS, so that
        decode(encode(s)) == s; pass at_start=False for ids that continue earlier text.
        """
        s = self.stream(skip_special=skip_special, at_start=at_start)
        return "".join([s.push(i) for i in ids]) + s.flush()

    def stream(self, skip_special: bool = False, at_start: bool = True) -> "StreamDecoder":
        """An incremental decoder: push(id) returns the text completed so far (never half a
        UTF-8 character), flush() the rest. Same text as decode, arguments as decode."""
        return StreamDecoder(self, skip_special, at_start)

    # -----------------------------------------------------------------------------------------
    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            **kwargs) -> str:
        """The file's chat template (tokenizer.chat_template) rendered with jinja2, as
        llama-cpp-python's Jinja2ChatFormatter and Hugging Face do: sandboxed, trim_blocks,
        lstrip_blocks, with bos_token, eos_token, raise_exception, strftime_now and a tojson
        that keeps non-ASCII. Extra keyword arguments (tools=..., ...) reach the template."""
        if self.chat_template is None:
            raise ValueError("this model file has no chat template (tokenizer.chat_template)")
        if self._template is None:
            self._template = _compile_template(self.chat_template)

        def raise_exception(message: str):
            raise ValueError(f"chat template: {message}")

        text = lambda i: self.tokens[i] if i is not None else ""  # noqa: E731
        return self._template.render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=text(self.bos_id), eos_token=text(self.eos_id),
            raise_exception=raise_exception,
            strftime_now=lambda f: datetime.now().strftime(f), **kwargs)

    def __repr__(self) -> str:
        return (f"Tokenizer({self.model}/{self.pre or 'default'}, {self.vocab_size} tokens, "
                f"bos={self.bos_id}, eos={self.eos_id}, eog={sorted(self.eog_ids)})")


class StreamDecoder:
    """Turns token ids into text one at a time, holding back incomplete UTF-8 characters."""

    def __init__(self, tok: Tokenizer, skip_special: bool = False, at_start: bool = True):
        self._tok = tok
        self._skip = skip_special
        # the SentencePiece prefix space is removed from the first token after leading BOS
        self._strip = at_start and tok.model == "llama" and tok.add_space_prefix
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, id: int) -> str:  # noqa: A002
        tok = self._tok
        b = tok.piece(id)
        if self._skip and tok.is_special(id):
            b = b""
        if self._strip and id != tok.bos_id:
            self._strip = False
            if b.startswith(b" "):
                b = b[1:]
        return self._utf8.decode(b)

    def flush(self) -> str:
        """The held-back bytes (an unfinished character becomes U+FFFD); the decoder resets."""
        return self._utf8.decode(b"", final=True)


def _compile_template(source: str):
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(jinja2.ext.Extension):
        # Hugging Face's {% generation %} ... {% endgeneration %}: renders its body
        tags = {"generation"}

        def parse(self, parser):
            parser.stream.skip(1)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, \
        sort_keys=False: json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                                    separators=separators, sort_keys=sort_keys)
    return env.from_string(source)
