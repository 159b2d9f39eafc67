#!/usr/bin/env python3
"""Writes the tokenizer oracle fixtures under tests/fixtures/tokenizer/ with the Hugging Face
`tokenizers` library (pip install tokenizers; the C tests never need it):

Each family NAME has a folder NAME/ with tokenizer.json (and tokenizer_config.json or
tokenizer.gguf where noted) and expected.jsonl.
  corpus.jsonl            the test strings: {"text": ...} or {"hex": ...} for raw (invalid UTF-8)
                          bytes, which are decoded with errors="replace" before HF sees them.
  smollm2/                SmolLM2's encodings, from a tokenizer.json built out of the GGUF's vocab
                          and merges (pre-tokenizer Digits(individual) + ByteLevel, as the model's
                          own tokenizer.json). Written only when the model asset is installed.
  bpe-nfc/                a small byte-level BPE trained here on the corpus, Qwen2-style: NFC,
                          the Qwen2 split regex, ByteLevel without regex, special added tokens
                          and one lstrip/rstrip normalized added token.
  bpe-im/                 the same vocabulary, Llama-3-style: Llama 3 regex, ignore_merges,
                          a TemplateProcessing that adds <|begin_of_text|>.
  spm/                    a SentencePiece-style BPE (Llama 2 layout): Prepend/Replace normalizers,
                          byte_fallback, fuse_unk, merges derived from piece scores exactly as
                          transformers' SentencePieceExtractor does, BOS template.
  spm/tokenizer.gguf      the same vocabulary and scores as GGUF metadata (tokenizer.ggml.model
                          "llama"), so the GGUF loader is checked against the same expected ids.
  bpe-nfc/tokenizer.gguf, bpe-im/tokenizer.gguf
                          the same vocabularies as GGUF metadata with pre = qwen2 and llama-bpe.
  spm-meta/               the same vocabulary with a Metaspace(prepend_scheme=first) pre-tokenizer.
  spm-split/              the same vocabulary with Metaspace(prepend_scheme=always, split=True).
  v-gpt2/, v-behaviors/, v-invert/, v-ws/
                          the bpe-nfc vocabulary under other pre-tokenizers (every Split
                          behaviour, invert, Whitespace, WhitespaceSplit, Digits runs, GPT-2's
                          add_prefix_space) and RobertaProcessing; short records only.
  gemma/, tekken/, qwen35/ the spm and bpe-nfc vocabularies as Gemma's, Mistral Nemo's (Tekken) and
                          Qwen3.5's tokenizer.json lay them out, each with a tokenizer.gguf.
  llama.cpp/              llama.cpp's own vocabulary tests, reduced (--llama-cpp DIR; see its README).
  NAME/expected.jsonl     per corpus line: ids (add_special_tokens=False), ids_special (True),
                          decoded (decode(ids, skip_special_tokens=False)); {"skip": true} for a
                          record a family leaves out.

Usage: python3 tests/oracle/gen_tokenizer_fixtures.py [--gguf PATH]
"""
import argparse
import json
import os
import struct
import sys

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.normpath(os.path.join(HERE, "..", "fixtures", "tokenizer"))
DOC = "/usr/share/doc/python3.11-doc/html/_sources/faq/general.rst.txt"

QWEN2_RE = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
LLAMA3_RE = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

HANDWRITTEN = [
    "Hello world",
    "Hello, World! How are you today?",
    " leading space",
    "  two leading spaces",
    "trailing space ",
    "trailing spaces   ",
    "tabs\tand\t\ttabs",
    "new\nlines\n\nand\r\nCRLF\r\n",
    "   \n\n   \t  \n",
    " ",
    "\n",
    "a" * 300,
    " " * 120 + "x",
    "0",
    "1234567890",
    "3.14159 2,718 1e-10 0x1F 1_000_000",
    "Year 2024: 12 apples, 345 pears, 6789 plums",
    "Unicode digits: ٣٤٥ ๑๒๓ ①②③ ½ ¾ Ⅻ",
    "café naïve résumé coöperate Zürich façade",
    "cafe\u0301 (decomposed e + combining acute) n\u0303 A\u030a",
    "\u212b \u2126 \u1e9b\u0323 (singletons and reordering)",
    "한국어 텍스트 \u1100\u1161\u11a8 (conjoining jamo)",
    "中文文本，包括标点符号。日本語のテキスト、カタカナとひらがな。",
    "Emoji: 😀 👍🏽 👨‍👩‍👧‍👦 🇩🇪 ❤️ ✨",
    "Ελληνικά κείμενα και Русский текст и עברית ועربي",
    "Mixed: naïve日本🙂x",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; i++) { sum += a[i] * b[i]; }",
    "<html><body class=\"main\">&amp; &lt;tag&gt;</body></html>",
    "SELECT * FROM users WHERE id = 42 AND name LIKE '%o''neil%';",
    "It's they're we've I'm you'll he'd IT'S THEY'RE",
    "don't won't can't shouldn't",
    "URLs: https://example.com/path?q=1&r=two#frag user@example.org",
    "<|im_start|>system\nYou are a helpful AI assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n",
    "<|endoftext|><|endoftext|>text between<|im_end|>",
    "no<|im_start|>space<|im_end|>around",
    "<s> and </s> and <unk> look special in Llama vocabularies",
    "Masked: the <mask> sat on the  <mask>  mat",
    "<|begin_of_text|>Hello<|eot_id|>",
    "!!!??? ... --- *** ___ ~~~ ``` '''",
    "$$ \\frac{a}{b} $$ and \\(x^2\\)",
    "\u00a0non-breaking\u00a0space and\u2003em space and\u200bzero width",
    "\u0085next line and \u2028line separator\u2029paragraph",
    "a\u0001control\u001fchars\u007f",
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX.",
    "Thé qüick bröwn föx — “quotes” ‘single’ «guillemets» …",
]

RAW_HEX = [
    "48656c6c6f20ff20776f726c64",          # lone 0xFF
    "c3",                                  # truncated 2-byte sequence at the end
    "e282",                                # truncated 3-byte sequence
    "f09f98",                              # truncated 4-byte sequence
    "6162c0af6364",                        # overlong encoding
    "eda080",                              # UTF-16 surrogate encoded
    "f4908080",                            # above U+10FFFF
    "80808041",                            # stray continuation bytes
    "e0a4e0a4a4",                          # broken then valid Devanagari
    "3c7c696d5f73746172747c3ec0",          # special token followed by an invalid byte
]

MULTILINGUAL = (
    "Deutsch: Über die Brücke gehen Fußgänger täglich. "
    "Français : L'été dernier, nous sommes allés à la plage où l'eau était fraîche. "
    "Español: ¿Dónde está la biblioteca? ¡Está allí! "
    "Русский: Съешь же ещё этих мягких французских булок, да выпей чаю. "
    "中文：我们今天去公园散步，天气很好。 "
    "日本語：今日は良い天気ですね。明日も晴れるでしょう。 "
    "한국어: 오늘 날씨가 정말 좋네요. "
    "العربية: اللغة العربية جميلة. "
    "हिन्दी: यह एक परीक्षण वाक्य है। "
    "Tiếng Việt: Tôi yêu tiếng Việt."
)


def random_strings(n, seed=1234):
    """Deterministic random strings that stress NFC and the regexes: combining marks (some out of
    canonical order), Hangul jamo, precomposed Latin, Hebrew points, Devanagari, digits, spaces."""
    import random
    rng = random.Random(seed)
    pools = [(0x61, 0x7A), (0x41, 0x5A), (0x20, 0x20), (0x30, 0x39), (0xC0, 0x17F), (0x300, 0x36F),
             (0x1100, 0x1112), (0x1161, 0x1175), (0x11A8, 0x11C2), (0xAC00, 0xAC40), (0x591, 0x5C7),
             (0x5D0, 0x5EA), (0x900, 0x97F), (0x1E00, 0x1EFF), (0x2000, 0x206F), (0xFB00, 0xFB4F),
             (0x0A, 0x0A), (0x1D15E, 0x1D164), (0x2F800, 0x2F810)]
    out = []
    for _ in range(n):
        k = rng.randint(1, 40)
        out.append("".join(chr(rng.randint(*rng.choice(pools))) for _ in range(k)))
    return out


def build_corpus():
    recs = [{"text": s} for s in HANDWRITTEN]
    recs += [{"text": s} for s in random_strings(40)]
    recs += [{"hex": h} for h in RAW_HEX]
    recs.append({"text": MULTILINGUAL})
    if os.path.exists(DOC):
        text = open(DOC, encoding="utf-8").read()
        recs.append({"text": text})  # longer real text: the Python FAQ, one record
        paras = [p for p in text.split("\n\n") if len(p) > 200][:20]
        recs += [{"text": p} for p in paras]
    return recs


def fx(family, name):
    d = os.path.join(OUT, family)
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, name)


def record_text(r):
    if "text" in r:
        return r["text"]
    return bytes.fromhex(r["hex"]).decode("utf-8", errors="replace")


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def expected(tok, corpus, path, max_len=None):
    rows = []
    for r in corpus:
        s = record_text(r)
        if max_len is not None and len(s) > max_len:
            rows.append({"skip": True})  # keeps line i = corpus record i
            continue
        ids = tok.encode(s, add_special_tokens=False).ids
        ids_sp = tok.encode(s, add_special_tokens=True).ids
        dec = tok.decode(ids, skip_special_tokens=False)
        rows.append({"ids": ids, "ids_special": ids_sp, "decoded": dec})
    write_jsonl(path, rows)
    n_ids = sum(len(r.get("ids", [])) for r in rows)
    print(f"{os.path.basename(path)}: {len(rows)} records, {n_ids} ids", file=sys.stderr)


# ---- GGUF (read for SmolLM2, written for the SentencePiece-style fixture) -------------------

def gguf_read_meta(path):
    fmt = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
    with open(path, "rb") as f:
        def rd(fm):
            return struct.unpack(fm, f.read(struct.calcsize(fm)))[0]

        def rstr():
            return f.read(rd("<Q")).decode("utf-8")

        def rval(t):
            if t == 8:
                return rstr()
            if t == 9:
                et, n = rd("<I"), rd("<Q")
                return [rval(et) for _ in range(n)]
            return rd(fmt[t])

        assert f.read(4) == b"GGUF"
        rd("<I")
        rd("<Q")
        nkv = rd("<Q")
        meta = {}
        for _ in range(nkv):
            k = rstr()
            meta[k] = rval(rd("<I"))
        return meta


def gguf_write(path, kvs):
    out = bytearray(b"GGUF")
    out += struct.pack("<IQQ", 3, 0, len(kvs))

    def wstr(s):
        b = s.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    for key, (typ, val) in kvs.items():
        out += wstr(key) + struct.pack("<I", typ)
        if typ == 8:
            out += wstr(val)
        elif typ == 9:
            et, items = val
            out += struct.pack("<IQ", et, len(items))
            for it in items:
                out += wstr(it) if et == 8 else struct.pack({4: "<I", 5: "<i", 6: "<f"}[et], it)
        elif typ == 4:
            out += struct.pack("<I", val)
        elif typ == 7:
            out += struct.pack("<?", val)
    with open(path, "wb") as f:
        f.write(bytes(out))


# ---- families -------------------------------------------------------------------------------

def smollm2(gguf_path, corpus):
    meta = gguf_read_meta(gguf_path)
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "smollm"
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])
    expected(tok, corpus, fx("smollm2", "expected.jsonl"))


def train_corpus_text(corpus):
    return [record_text(r) for r in corpus]


def byte_level_family(corpus):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(pattern=__import__("tokenizers").Regex(QWEN2_RE), behavior="isolated"),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|eot_id|>"]
    trainer = trainers.BpeTrainer(vocab_size=1200, min_frequency=2, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(train_corpus_text(corpus) * 3, trainer=trainer)
    tok.add_tokens([AddedToken("<mask>", lstrip=True, rstrip=True, normalized=True, special=False)])
    tok.save(fx("bpe-nfc", "tokenizer.json"))
    expected(tok, corpus, fx("bpe-nfc", "expected.jsonl"))
    with open(fx("bpe-nfc", "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
                   "chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"},
                  f, indent=1)

    # Llama-3 layout over the same vocabulary: no normalizer, the Llama 3 regex, ignore_merges,
    # BOS added by a template.
    j = json.load(open(fx("bpe-nfc", "tokenizer.json"), encoding="utf-8"))
    j["normalizer"] = None
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": LLAMA3_RE}
    j["model"]["ignore_merges"] = True
    bos = j["model"]["vocab"]["<|begin_of_text|>"]
    j["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                  {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [bos], "tokens": ["<|begin_of_text|>"]}}}]}
    path = fx("bpe-im", "tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    expected(Tokenizer.from_file(path), corpus, fx("bpe-im", "expected.jsonl"))
    byte_level_gguf("bpe-nfc", "qwen2", False)
    byte_level_gguf("bpe-im", "llama-bpe", True)


def byte_level_gguf(family, pre, add_bos):
    """The family's vocabulary and merges as GGUF metadata with tokenizer.ggml.pre = `pre`.
    Special added tokens become control tokens (type 3), other added tokens user-defined (type 4),
    which GGUF cannot mark lstrip/rstrip: the C test skips records containing those."""
    j = json.load(open(fx(family, "tokenizer.json"), encoding="utf-8"))
    vocab = dict(j["model"]["vocab"])
    types = {}
    for a in j["added_tokens"]:
        vocab[a["content"]] = a["id"]
        types[a["id"]] = 3 if a["special"] else 4
    tokens = [None] * (max(vocab.values()) + 1)
    for t, i in vocab.items():
        tokens[i] = t
    assert all(t is not None for t in tokens)
    merges = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    kv = {
        "general.architecture": (8, "llama"),
        "tokenizer.ggml.model": (8, "gpt2"),
        "tokenizer.ggml.pre": (8, pre),
        "tokenizer.ggml.tokens": (9, (8, tokens)),
        "tokenizer.ggml.token_type": (9, (5, [types.get(i, 1) for i in range(len(tokens))])),
        "tokenizer.ggml.merges": (9, (8, merges)),
        "tokenizer.ggml.add_bos_token": (7, add_bos),
    }
    if add_bos:
        kv["tokenizer.ggml.bos_token_id"] = (4, vocab["<|begin_of_text|>"])
    gguf_write(fx(family, "tokenizer.gguf"), kv)


def variants(corpus):
    """The bpe-nfc vocabulary under other pre-tokenizers and post-processors, to check each Split
    behaviour, invert, Whitespace/WhitespaceSplit, Digits runs, GPT-2's add_prefix_space and
    RobertaProcessing. Only the short records (not the long real text) to keep fixtures small."""
    from tokenizers import Regex
    base = Tokenizer.from_file(fx("bpe-nfc", "tokenizer.json"))
    ids = base.get_vocab()
    specs = {
        "v-gpt2": (pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True),
                   processors.RobertaProcessing(("<|im_end|>", ids["<|im_end|>"]),
                                                ("<|im_start|>", ids["<|im_start|>"]))),
        "v-behaviors": (pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"\p{P}"), behavior="merged_with_previous"),
            pre_tokenizers.Split(" ", behavior="merged_with_next"),
            pre_tokenizers.Split(Regex(r"\d"), behavior="contiguous"),
            pre_tokenizers.Split(Regex(r"[qQ]"), behavior="removed"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), None),
        "v-invert": (pre_tokenizers.Sequence([
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Digits(individual_digits=False),
            pre_tokenizers.Split(Regex(r"[aeiou]+"), behavior="isolated", invert=True),
            pre_tokenizers.Split(Regex(r"\p{Lu}"), behavior="merged_with_next", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), None),
        "v-ws": (pre_tokenizers.Sequence([
            pre_tokenizers.Whitespace(),
            pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False)]), None),
    }
    for name, (pre, post) in specs.items():
        tok = Tokenizer.from_file(fx("bpe-nfc", "tokenizer.json"))
        tok.normalizer = None
        tok.pre_tokenizer = pre
        if post is not None:
            tok.post_processor = post
        tok.save(fx(name, "tokenizer.json"))
        expected(tok, corpus, fx(name, "expected.jsonl"), max_len=2000)


def generate_merges(vocab, scores):
    """transformers' SentencePieceExtractor.generate_merges with scores (reverse=True)."""
    merges = []
    for piece, score in scores.items():
        local = []
        for i in range(1, len(piece)):
            l, r = piece[:i], piece[i:]
            if l in vocab and r in vocab:
                local.append((l, r, score))
        local = sorted(local, key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges = sorted(merges, key=lambda v: (v[2], len(v[0]), len(v[1])), reverse=True)
    return [(v[0], v[1]) for v in merges]


def spm_family(corpus):
    # Train pieces on Metaspace-style text, then lay them out as a SentencePiece model: <unk>, <s>,
    # </s>, 256 byte pieces, then the learned pieces with score = -rank (SentencePiece BPE).
    tr = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tr.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tr.pre_tokenizer = pre_tokenizers.Split("\u2581", behavior="merged_with_next")
    trainer = trainers.BpeTrainer(vocab_size=900, min_frequency=2, special_tokens=["<unk>", "<s>", "</s>"],
                                  show_progress=False, limit_alphabet=400)
    tr.train_from_iterator(train_corpus_text(corpus) * 3, trainer=trainer)
    learned = sorted(tr.get_vocab().items(), key=lambda kv: kv[1])
    pieces = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    seen = set(pieces)
    for p, _ in learned:
        if p not in seen:
            pieces.append(p)
            types.append(1)
            seen.add(p)
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces) - 259)]
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = generate_merges(vocab, {p: s for p, s in zip(pieces, scores)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, fuse_unk=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ["<unk>", "<s>", "</s>"]])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    path = fx("spm", "tokenizer.json")
    tok.save(path)
    expected(tok, corpus, fx("spm", "expected.jsonl"))
    gguf_write(fx("spm", "tokenizer.gguf"), {
        "general.architecture": (8, "llama"),
        "tokenizer.ggml.model": (8, "llama"),
        "tokenizer.ggml.tokens": (9, (8, pieces)),
        "tokenizer.ggml.scores": (9, (6, scores)),
        "tokenizer.ggml.token_type": (9, (5, types)),
        "tokenizer.ggml.bos_token_id": (4, 1),
        "tokenizer.ggml.eos_token_id": (4, 2),
        "tokenizer.ggml.unknown_token_id": (4, 0),
        "tokenizer.ggml.add_bos_token": (7, True),
        "tokenizer.ggml.add_space_prefix": (7, True),
    })

    # Metaspace layout (newer Llama/Mistral files): no normalizer, Metaspace(first, no split).
    j = json.load(open(path, encoding="utf-8"))
    j["normalizer"] = None
    j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False},
        {"type": "ByteFallback"}, {"type": "Fuse"}]}
    mpath = fx("spm-meta", "tokenizer.json")
    with open(mpath, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    expected(Tokenizer.from_file(mpath), corpus, fx("spm-meta", "expected.jsonl"))


def spm_variants(corpus):
    """The spm vocabulary with Metaspace(prepend_scheme=always, split=True) and its decoder."""
    tok = Tokenizer.from_file(fx("spm", "tokenizer.json"))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)])
    tok.save(fx("spm-split", "tokenizer.json"))
    expected(tok, corpus, fx("spm-split", "expected.jsonl"), max_len=2000)


# ---- llama.cpp's vocabulary tests, reduced ----------------------------------------------------

TEKKEN_RE = (r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"""
             r"""[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+"""
             r"""|\s+(?!\S)|\s+""")
QWEN35_RE = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
             r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")


def family_variants(corpus):
    """The layouts of the families added later, over the committed vocabularies:
      gemma/   the spm vocabulary as Gemma's tokenizer.json lays it out (transformers'
               GemmaTokenizer): Replace(" ", "▁") normalizer, no prefix, Split(" ",
               merged_with_previous), byte_fallback; tokenizer.gguf: model llama with
               add_space_prefix = false, as Gemma 2/3 GGUFs carry it.
      tekken/  the bpe-nfc vocabulary as Mistral Nemo's Tekken tokenizer.json: no normalizer, the
               Tekken split regex, ByteLevel, ignore_merges; tokenizer.gguf with pre = tekken.
      qwen35/  the bpe-nfc vocabulary as Qwen3.5's: no normalizer (combining marks stay apart),
               the Qwen3.5 regex with \p{M}; tokenizer.gguf with pre = qwen35."""
    j = json.load(open(fx("spm", "tokenizer.json"), encoding="utf-8"))
    j["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    j["pre_tokenizer"] = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
                          "invert": False}
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}]}
    path = fx("gemma", "tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    expected(Tokenizer.from_file(path), corpus, fx("gemma", "expected.jsonl"))
    meta = gguf_read_meta(fx("spm", "tokenizer.gguf"))
    gguf_write(fx("gemma", "tokenizer.gguf"), {
        "general.architecture": (8, "gemma2"),
        "tokenizer.ggml.model": (8, "llama"),
        "tokenizer.ggml.tokens": (9, (8, meta["tokenizer.ggml.tokens"])),
        "tokenizer.ggml.scores": (9, (6, meta["tokenizer.ggml.scores"])),
        "tokenizer.ggml.token_type": (9, (5, meta["tokenizer.ggml.token_type"])),
        "tokenizer.ggml.bos_token_id": (4, 1),
        "tokenizer.ggml.eos_token_id": (4, 2),
        "tokenizer.ggml.unknown_token_id": (4, 0),
        "tokenizer.ggml.add_bos_token": (7, True),
        "tokenizer.ggml.add_space_prefix": (7, False),
    })
    for name, regex in (("tekken", TEKKEN_RE), ("qwen35", QWEN35_RE)):
        j = json.load(open(fx("bpe-nfc", "tokenizer.json"), encoding="utf-8"))
        j["normalizer"] = None
        j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": regex}
        j["model"]["ignore_merges"] = name == "tekken"
        path = fx(name, "tokenizer.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False)
        expected(Tokenizer.from_file(path), corpus, fx(name, "expected.jsonl"))
        byte_level_gguf(name, name, False)


LLAMA_CPP_VOCABS = ["llama-spm", "phi-3", "gpt-2", "starcoder", "llama-bpe", "qwen2", "qwen35", "deepseek-llm",
                    "deepseek-coder", "command-r", "refact", "gemma-4"]
LLAMA_CPP_SEP = "\n__ggml_vocab_test__\n"


def split_merge(m):
    """A GGUF merge "a b" split at the first space after the first byte, as llama.cpp reads it."""
    k = m.find(" ", 1)
    return m[:k], m[k + 1:]


def reduce_llama_cpp_vocab(src, name):
    """llama.cpp's models/ggml-vocab-NAME.gguf (MIT) with its .inp/.out test pair, reduced to the
    tokens the expected encodings can pass through: every token of the .out file, every token
    that is not a plain one (control, user-defined, byte), every single character, and the
    merge ancestors of all of those (for SentencePiece vocabularies: every split of a kept piece
    into two pieces). A merge is kept when its two parts and its result are, so the merges the
    full vocabulary applies to the test inputs are all present and every other kept one was a
    candidate there too: the reduced vocabulary encodes the inputs to the same tokens. Ids are
    renumbered in order; the .out ids with them. Writes llama.cpp/NAME.{gguf,inp,out}."""
    meta = gguf_read_meta(src)
    tokens, types = meta["tokenizer.ggml.tokens"], meta.get("tokenizer.ggml.token_type")
    model = meta["tokenizer.ggml.model"]
    with open(src + ".inp", encoding="utf-8", newline="") as f:
        inp = f.read()
    with open(src + ".out", encoding="utf-8") as f:
        lines = f.read().split("\n")
    n_tests = inp.count(LLAMA_CPP_SEP) + (0 if inp.endswith(LLAMA_CPP_SEP) else 1)  # as test-tokenizer-0
    outs = [[int(x) for x in line.split()] for line in lines[:n_tests]]
    by_str = {t: i for i, t in enumerate(tokens)}
    keep = set(i for o in outs for i in o)
    for i, t in enumerate(tokens):
        if (types and types[i] != 1) or len(t) == 1:
            keep.add(i)
    for k in ("bos", "eos", "unknown", "padding"):
        v = meta.get(f"tokenizer.ggml.{k}_token_id")
        if v is not None and 0 <= v < len(tokens):
            keep.add(v)
    merges = [split_merge(m) for m in meta.get("tokenizer.ggml.merges", [])]
    producers = {}
    for i, (a, b) in enumerate(merges):
        producers.setdefault(a + b, []).append((a, b))
    work = list(keep)
    while work:
        t = tokens[work.pop()]
        if model == "llama":
            parts = [(t[:k], t[k:]) for k in range(1, len(t))]
        else:
            parts = producers.get(t, [])
        for a, b in parts:
            ia, ib = by_str.get(a), by_str.get(b)
            if ia is None or ib is None:
                continue
            for x in (ia, ib):
                if x not in keep:
                    keep.add(x)
                    work.append(x)
    order = sorted(keep)
    new_id = {old: new for new, old in enumerate(order)}
    kv = {k: (8, meta[k]) for k in ("general.architecture", "general.name") if k in meta}
    kv["tokenizer.ggml.model"] = (8, model)
    if "tokenizer.ggml.pre" in meta:
        kv["tokenizer.ggml.pre"] = (8, meta["tokenizer.ggml.pre"])
    kv["tokenizer.ggml.tokens"] = (9, (8, [tokens[i] for i in order]))
    if types:
        kv["tokenizer.ggml.token_type"] = (9, (5, [types[i] for i in order]))
    if "tokenizer.ggml.scores" in meta:
        kv["tokenizer.ggml.scores"] = (9, (6, [meta["tokenizer.ggml.scores"][i] for i in order]))
    if merges:
        kept_strs = set(tokens[i] for i in order)
        kv["tokenizer.ggml.merges"] = (9, (8, [a + " " + b for a, b in merges
                                                if a in kept_strs and b in kept_strs and a + b in kept_strs]))
    for k in ("bos", "eos", "unknown", "padding"):
        v = meta.get(f"tokenizer.ggml.{k}_token_id")
        if v is not None and v in new_id:
            kv[f"tokenizer.ggml.{k}_token_id"] = (4, new_id[v])
    for k in ("add_bos_token", "add_eos_token", "add_space_prefix"):
        if f"tokenizer.ggml.{k}" in meta:
            kv[f"tokenizer.ggml.{k}"] = (7, bool(meta[f"tokenizer.ggml.{k}"]))
    if "tokenizer.chat_template" in meta and len(meta["tokenizer.chat_template"]) < 4096:
        kv["tokenizer.chat_template"] = (8, meta["tokenizer.chat_template"])  # for test_chat's recognition
    d = fx("llama.cpp", "")
    os.makedirs(d, exist_ok=True)
    gguf_write(os.path.join(d, name + ".gguf"), kv)
    with open(os.path.join(d, name + ".inp"), "w", encoding="utf-8", newline="") as f:
        f.write(inp)
    with open(os.path.join(d, name + ".out"), "w", encoding="utf-8") as f:
        for o in outs:
            f.write(" ".join(str(new_id[i]) for i in o) + "\n")
    print(f"llama.cpp/{name}: {len(tokens)} -> {len(order)} tokens, {len(outs)} tests", file=sys.stderr)
    return kv


def llama_cpp_vocabs(llama_dir):
    for name in LLAMA_CPP_VOCABS:
        src = os.path.join(llama_dir, "models", f"ggml-vocab-{name}.gguf")
        if os.path.exists(src + ".out"):
            kv = reduce_llama_cpp_vocab(src, name)
            if name == "gpt-2":  # a pre-tokenizer name longtune does not know: a typed error
                kv["tokenizer.ggml.pre"] = (8, "mystery-pre")
                gguf_write(fx("llama.cpp", "unknown-pre.gguf"), kv)
        else:
            print(f"skipping llama.cpp vocabulary {name}: {src}.out absent", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    cache = os.environ.get("LONGTUNE_CACHE", os.path.expanduser("~/.cache/longtune"))
    ap.add_argument("--gguf", default=os.path.join(cache, "smollm2-135m-instruct-q4_1.gguf"))
    ap.add_argument("--llama-cpp", default=os.environ.get("LLAMA_CPP_DIR", ""),
                    help="llama.cpp source tree: reduce its models/ggml-vocab-*.gguf test pairs")
    ap.add_argument("--only-llama-cpp", action="store_true", help="write only the llama.cpp/ fixtures")
    args = ap.parse_args()
    if args.llama_cpp:
        llama_cpp_vocabs(args.llama_cpp)
    if args.only_llama_cpp:
        return
    os.makedirs(OUT, exist_ok=True)
    corpus = build_corpus()
    write_jsonl(os.path.join(OUT, "corpus.jsonl"), corpus)
    if os.path.exists(args.gguf):
        smollm2(args.gguf, corpus)
    else:
        print(f"skipping SmolLM2: {args.gguf} absent", file=sys.stderr)
    byte_level_family(corpus)
    variants(corpus)
    spm_family(corpus)
    spm_variants(corpus)
    family_variants(corpus)


if __name__ == "__main__":
    main()
