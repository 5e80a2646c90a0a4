#!/usr/bin/python3
"""Golden token ids and decoded text from the reference HF `tokenizers` library.

Usage: python3 make_goldens.py CORPUS.jsonl OUT_DIR
Needs the `tokenizers` package (run on a machine that has it); reads the tokenizer files beside
this script and writes into OUT_DIR:
  ids.jsonl           encode(line, add_special_tokens=True).ids, plain tokenizer.json
  decoded.jsonl       decode(ids, skip_special_tokens=False)
  decoded_skip.jsonl  decode(ids, skip_special_tokens=True)
  ids_markers.jsonl   ids with the reasoning markers (pieces of ids 101-114) added as
                      non-special, non-normalized tokens (the engine's default, spec §5.1)
  tiny_<N>_ids.jsonl, tiny_<N>_decoded.jsonl   for each tiny_tokenizer_<N>.json here, on the
                      corpus lines shorter than TINY_MAX_CHARS (others: null)
  decode_cases.jsonl  hand-made piece sequences (invalid byte runs, specials, leading spaces):
                      {"pieces", "ids", "text", "text_skip", "hf_decode_stream" (DecodeStream steps)}
  meta.json           library version, counts, HF encode time of one long string, and any
                      part that failed ("errors")
"""
import glob
import json
import os
import sys
import time

from tokenizers import AddedToken, Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
TINY_MAX_CHARS = 4000
MARKER_IDS = range(101, 115)

DECODE_CASES = [
    [], ["\u2581"], ["\u2581\u2581"], ["\u2581Hello"], ["\u2581\u2581Hello"], ["<0x20>", "a"], ["<s>", "\u2581Hello"],
    ["\u2581", "<s>"], ["</s>", "\u2581x"], ["<unk>", "\u2581x"], ["<|im_end|>"], ["\n", "\u2581x"],
    ["<0xE4>", "<0xB8>", "<0xAD>"], ["<0xE4>", "<0xB8>"], ["<0xE4>", "<0xB8>", "\u2581a"], ["\u2581a", "<0xE4>", "<0xB8>"],
    ["<0x41>", "<0xFF>"], ["<0x41>", "<0xFF>", "\u2581b"], ["<0xE4>", "<s>", "<0xB8>", "<0xAD>"],
    ["<0xF0>", "<0x9F>", "<0x98>", "<0x80>"], ["<0xF0>", "<0x9F>", "<0x98>"], ["<0xC0>", "<0x80>"],
    ["<0xED>", "<0xA0>", "<0x80>"], ["<0xF4>", "<0x90>", "<0x80>", "<0x80>"], ["<0x80>"], ["<0x80>", "\u2581ok"],
    ["\u2581a", "<0xFF>", "<0xE4>", "<0xB8>", "<0xAD>", "\u2581b"], ["\u2581a", "<0xE4>", "<0xB8>", "<0xAD>", "<0xFF>"],
    ["<think>", "\u2581hi", "</think>"], ["<s>", "<0x20>", "<0x20>", "x"], ["<0x20>", "<0x20>", "x"],
    ["<s>", "<s>", "\u2581x"], ["<|im_start|>", "\u2581user", "\n"], ["<0x0A>", "<0x09>", "\u2581z"],
]


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def section(meta, name, fn):
    """Runs one part; a failure is recorded in meta["errors"] instead of losing the other parts."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - one device run must bring back everything it can
        meta.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"
        print(f"error in {name}: {e}", file=sys.stderr)


def stream_steps(tok, ids):
    from tokenizers.decoders import DecodeStream
    ds = DecodeStream(skip_special_tokens=False)
    return [ds.step(tok, i) for i in ids]


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    corpus = read_jsonl(sys.argv[1])
    out = sys.argv[2]
    os.makedirs(out, exist_ok=True)
    import tokenizers
    meta = {"tokenizers_version": tokenizers.__version__, "corpus_lines": len(corpus)}
    tok = Tokenizer.from_file(os.path.join(HERE, "tokenizer.json"))

    def plain():
        ids = [tok.encode(s, add_special_tokens=True).ids for s in corpus]
        write_jsonl(os.path.join(out, "ids.jsonl"), ids)
        write_jsonl(os.path.join(out, "decoded.jsonl"), [tok.decode(x, skip_special_tokens=False) for x in ids])
        write_jsonl(os.path.join(out, "decoded_skip.jsonl"), [tok.decode(x, skip_special_tokens=True) for x in ids])
        meta["tokens"] = sum(len(x) for x in ids)

    def decode_cases():
        cases = []
        for pieces in DECODE_CASES:
            case_ids = [tok.token_to_id(p) for p in pieces]
            if any(i is None for i in case_ids):
                print("skipping decode case with unknown piece:", pieces)
                continue
            row = {"pieces": pieces, "ids": case_ids, "text": tok.decode(case_ids, skip_special_tokens=False),
                   "text_skip": tok.decode(case_ids, skip_special_tokens=True)}
            try:
                row["hf_decode_stream"] = stream_steps(tok, case_ids)
            except Exception as e:  # noqa: BLE001 - informative only
                row["hf_decode_stream_error"] = str(e)
            cases.append(row)
        write_jsonl(os.path.join(out, "decode_cases.jsonl"), cases)

    def speed():
        text = "\n".join(corpus) * 5
        t0 = time.perf_counter()
        n = len(tok.encode(text, add_special_tokens=True).ids)
        meta["hf_encode_one_string"] = {"chars": len(text), "tokens": n, "seconds": time.perf_counter() - t0}

    section(meta, "plain", plain)
    section(meta, "decode_cases", decode_cases)
    section(meta, "speed", speed)

    def markers():
        names = [tok.id_to_token(i) for i in MARKER_IDS]
        tok.add_tokens([AddedToken(m, single_word=False, lstrip=False, rstrip=False, normalized=False, special=False)
                        for m in names])
        meta["marker_ids"] = {m: tok.token_to_id(m) for m in names}
        write_jsonl(os.path.join(out, "ids_markers.jsonl"), [tok.encode(s, add_special_tokens=True).ids for s in corpus])

    section(meta, "markers", markers)

    for path in sorted(glob.glob(os.path.join(HERE, "tiny_tokenizer_*.json"))):
        name = os.path.basename(path)[len("tiny_tokenizer_"):-len(".json")]

        def tiny_part(path=path, name=name):
            tiny = Tokenizer.from_file(path)
            tiny_ids = [tiny.encode(s, add_special_tokens=True).ids if len(s) < TINY_MAX_CHARS else None for s in corpus]
            write_jsonl(os.path.join(out, f"tiny_{name}_ids.jsonl"), tiny_ids)
            write_jsonl(os.path.join(out, f"tiny_{name}_decoded.jsonl"),
                        [tiny.decode(x, skip_special_tokens=False) if x is not None else None for x in tiny_ids])
            meta[f"tiny_{name}_vocab"] = tiny.get_vocab_size()
            meta[f"tiny_{name}_added_ids"] = {t.content: i for i, t in tiny.get_added_tokens_decoder().items()}

        section(meta, f"tiny_{name}", tiny_part)

    with open(os.path.join(out, "meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
    print(json.dumps(meta, ensure_ascii=False))


if __name__ == "__main__":
    main()
