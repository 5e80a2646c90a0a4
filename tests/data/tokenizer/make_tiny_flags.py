#!/usr/bin/python3
"""Writes tiny_tokenizer_flags.json: tiny_tokenizer_1000.json plus added tokens with the
lstrip / rstrip / single_word / normalized flags set, to check those against HF (make_goldens.py)."""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
EXTRA = [  # content, flags
    ("<tools>", {"lstrip": True, "rstrip": True}),
    ("</tools>", {"single_word": True}),
    ("world", {"normalized": True}),
    ("<think>", {"rstrip": True}),
    ("</think>", {"lstrip": True}),
    ("the", {"single_word": True}),
    ("ab", {"single_word": True, "normalized": True}),
    ("\u4e2d", {"single_word": True}),
    ("\u00e9", {"lstrip": True, "rstrip": True, "special": True}),
    ("  ", {}),
    ("\n\n", {"rstrip": True}),
    ("hello", {"normalized": True, "special": True}),
]

with open(os.path.join(HERE, "tiny_tokenizer_1000.json"), encoding="utf-8") as f:
    tok = json.load(f)
for i, (content, flags) in enumerate(EXTRA):
    entry = {"id": 1000 + i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": False}
    entry.update(flags)
    tok["added_tokens"].append(entry)
with open(os.path.join(HERE, "tiny_tokenizer_flags.json"), "w", encoding="utf-8") as f:
    json.dump(tok, f, ensure_ascii=False, indent=1)
    f.write("\n")
