#!/usr/bin/python3
"""Writes corpus.jsonl: the golden tokenizer corpus, one JSON string per line (deterministic).

Usage: /usr/bin/python3 make_corpus.py [OUT]   (default: corpus.jsonl beside this script)

Covers English, Chinese, Japanese, Korean, other scripts, code, emoji (with ZWJ sequences,
skin tones, flags), combining marks, whitespace runs, tabs/newlines, special tokens inside text,
strings that only look like special tokens, rare characters that need byte fallback, very long
lines (>= 20k characters), the empty string and leading/trailing spaces, plus seeded random mixes.
Invalid UTF-8 cannot be written as a JSON string; the C++ unit tests cover it (the engine
replaces each maximal ill-formed subpart with U+FFFD before tokenizing).
"""
import json
import os
import random
import sys

ENGLISH = [
    "Hello, my name is",
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times.",
    "Please summarise the following paragraph in two sentences.",
    "Why is the sky blue? Because shorter wavelengths scatter more strongly.",
    "I can't believe it's already 5 o'clock; we're late!",
    "Mr. Smith paid $1,234.56 on 2024-03-15 at 09:30 AM (UTC+8).",
    "E-mail me at someone@example.com or visit https://example.org/path?q=1&r=two#frag.",
    "She said, \"Don't worry -- it'll be fine.\"",
    "Version 3.14.159 fixes bugs #42, #1337 and CVE-2023-12345.",
    "ALL CAPS TEXT AND MiXeD CaSe WoRdS",
    "antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "Numbers: 0 1 22 333 4444 55555 666666 7777777 3.14159 2.71828 -1e-9 6.022e23",
    "Lists:\n- first item\n- second item\n  - nested item\n1. one\n2. two",
    "Tabs\tseparate\tcolumns\tin\tthis\tline",
    "Windows line endings\r\nare here\r\nand here.",
    "A sentence with    four spaces and\u00a0a no-break space.",
    "Quotes: \u2018single\u2019 \u201cdouble\u201d \u00abguillemets\u00bb \u201egerman\u201c",
    "Dashes \u2013 en and \u2014 em, ellipsis\u2026 and bullet \u2022 points.",
    "Math: x\u00b2 + y\u00b2 = z\u00b2, \u2200x \u2203y: x \u2264 y, \u221a2 \u2248 1.414, \u03c0r\u00b2.",
    "LaTeX: $\\int_0^\\infty e^{-x^2} dx = \\frac{\\sqrt{\\pi}}{2}$",
    "Caf\u00e9, na\u00efve, r\u00e9sum\u00e9, co\u00f6perate, fa\u00e7ade, \u00fcber, Stra\u00dfe.",
    "What's the weather like in Beijing today?",
    "Translate to French: I would like a cup of coffee, please.",
    "User: hi\nAssistant: Hello! How can I help you today?",
    "The model reads the prompt and then generates one token at a time.",
]

CHINESE = [
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01",
    "\u4eca\u5929\u5929\u6c14\u5f88\u597d\uff0c\u6211\u4eec\u53bb\u516c\u56ed\u6563\u6b65\u5427\u3002",
    "\u4eba\u5de5\u667a\u80fd\u6b63\u5728\u6539\u53d8\u6211\u4eec\u7684\u751f\u6d3b\u65b9\u5f0f\uff0c\u4e5f\u5e26\u6765\u4e86\u65b0\u7684\u6311\u6218\u3002",
    "\u8bf7\u7528\u4e00\u53e5\u8bdd\u603b\u7ed3\u8fd9\u7bc7\u6587\u7ae0\u7684\u4e3b\u8981\u5185\u5bb9\u3002",
    "\u5317\u4eac\u662f\u4e2d\u56fd\u7684\u9996\u90fd\uff0c\u6709\u7740\u60a0\u4e45\u7684\u5386\u53f2\u548c\u6587\u5316\u3002",
    "\u6625\u7720\u4e0d\u89c9\u6653\uff0c\u5904\u5904\u95fb\u557c\u9e1f\u3002\u591c\u6765\u98ce\u96e8\u58f0\uff0c\u82b1\u843d\u77e5\u591a\u5c11\u3002",
    "\u9762\u5411\u5bf9\u8c61\u7f16\u7a0b\u7684\u4e09\u5927\u7279\u6027\u662f\u5c01\u88c5\u3001\u7ee7\u627f\u548c\u591a\u6001\u3002",
    "\u4ed6\u8bf4\uff1a\u201c\u6211\u660e\u5929\u4e0b\u5348\u4e09\u70b9\u5230\u3002\u201d",
    "\u7e41\u9ad4\u4e2d\u6587\uff1a\u81fa\u7063\u7684\u6771\u897f\u5f88\u597d\u5403\u3002",
    "\u6570\u5b57\u6df7\u5408\uff1a2024\u5e743\u670815\u65e5\uff0c\u6e29\u5ea625.5\u2103\uff0c\u6e7f\u5ea660%\u3002",
    "\u4e2d\u82f1\u6df7\u5408 mixed text \u548c English words \u5728\u4e00\u8d77\u3002",
    "\u9f98\u9f49\u9f7e\u7228\u9950\u7a31\u8b7e",
]

JAPANESE = [
    "\u3053\u3093\u306b\u3061\u306f\u3001\u4e16\u754c\uff01",
    "\u4eca\u65e5\u306f\u3044\u3044\u5929\u6c17\u3067\u3059\u306d\u3002\u6563\u6b69\u306b\u884c\u304d\u307e\u3057\u3087\u3046\u3002",
    "\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a\u3068\u6f22\u5b57\u3092\u6df7\u305c\u3066\u66f8\u304d\u307e\u3059\u3002",
    "\u543e\u8f29\u306f\u732b\u3067\u3042\u308b\u3002\u540d\u524d\u306f\u307e\u3060\u7121\u3044\u3002",
    "\uff8a\uff9d\uff76\uff78\uff76\uff80\uff76\uff85 half-width katakana",
]

KOREAN = [
    "\uc548\ub155\ud558\uc138\uc694, \uc138\uacc4!",
    "\uc624\ub298\uc740 \ub0a0\uc528\uac00 \uc88b\uc544\uc11c \uacf5\uc6d0\uc5d0 \uac14\uc2b5\ub2c8\ub2e4.",
    "\ud55c\uad6d\uc5b4\ub294 \ud55c\uae00\ub85c \uc4f0\uace0 \uc77d\uc2b5\ub2c8\ub2e4.",
    "\u1112\u1161\u11ab\u1100\u1173\u11af conjoining jamo",
]

OTHER_SCRIPTS = [
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u041a\u0430\u043a \u0434\u0435\u043b\u0430?",
    "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u03ba\u03cc\u03c3\u03bc\u03b5",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e0a\u0e32\u0e27\u0e42\u0e25\u0e01",
    "Xin ch\u00e0o th\u1ebf gi\u1edbi, ti\u1ebfng Vi\u1ec7t c\u00f3 d\u1ea5u.",
    "\u10d2\u10d0\u10db\u10d0\u10e0\u10ef\u10dd\u10d1\u10d0 \u0540\u0561\u0575\u0565\u0580\u0565\u0576 \u12a0\u121b\u122d\u129b",
    "\u1780\u17d2\u1798\u17c2\u179a \u0ba4\u0bae\u0bbf\u0bb4\u0bcd \u0c24\u0c46\u0c32\u0c41\u0c17\u0c41 \u0d2e\u0d32\u0d2f\u0d3e\u0d33\u0d02",
]

CODE = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "#include <stdio.h>\n\nint main(void) {\n\tprintf(\"hello\\n\");\n\treturn 0;\n}\n",
    "template <typename T>\nstd::vector<T> f(const std::vector<T>& v) { return {v.rbegin(), v.rend()}; }",
    "for (int i = 0; i < n; ++i) { a[i] += b[i] * c[i]; }",
    "{\"name\": \"sala\", \"version\": [0, 1, 0], \"nested\": {\"ok\": true, \"x\": null}}",
    "<html>\n  <body>\n    <div class=\"main\"><p>Hi &amp; bye</p></div>\n  </body>\n</html>",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name LIMIT 10;",
    "$ ls -la | grep '\\.py$' && echo \"done\" > /tmp/out.txt 2>&1",
    "fn main() { let v: Vec<u32> = (0..10).map(|x| x * x).collect(); println!(\"{:?}\", v); }",
    "const f = async (x) => { await sleep(100); return x?.y ?? 'default'; };",
    "    indented with four spaces\n\tand a tab\n        and eight spaces",
    "if __name__ == \"__main__\":\n    main()\n",
    "x = [i**2 for i in range(10) if i % 2 == 0]  # squares of evens",
    "std::map<std::string, std::vector<int>> m; m[\"a\"].push_back(1);",
    "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,3 @@\n-old line\n+new line",
    "/* block comment */ // line comment\n#define MAX(a, b) ((a) > (b) ? (a) : (b))",
    "regex: ^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\\.[A-Za-z]{2,}$",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Beijing\"}}\n</tool_call>",
]

EMOJI = [
    "I love pizza \U0001f355 and tacos \U0001f32e!",
    "\U0001f600\U0001f603\U0001f604\U0001f601\U0001f606\U0001f605\U0001f602\U0001f923",
    "Family: \U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 and couple \U0001f469\u200d\u2764\ufe0f\u200d\U0001f468",
    "Flags: \U0001f1ef\U0001f1f5 \U0001f1fa\U0001f1f8 \U0001f1e8\U0001f1f3 \U0001f3f3\ufe0f\u200d\U0001f308 \U0001f3f4\u200d\u2620\ufe0f",
    "Skin tones: \U0001f44d\U0001f3fb \U0001f44d\U0001f3fc \U0001f44d\U0001f3fd \U0001f44d\U0001f3fe \U0001f44d\U0001f3ff",
    "Keycaps: 1\ufe0f\u20e3 2\ufe0f\u20e3 #\ufe0f\u20e3 *\ufe0f\u20e3",
    "\U0001f9d1\u200d\U0001f4bb coder, \U0001f469\u200d\U0001f52c scientist, \U0001f9d1\U0001f3fd\u200d\U0001f680 astronaut",
    "\u2764\ufe0f \u2728 \u2b50 \u2600\ufe0f \u2614 \u26a1 \u2705 \u274c",
    "\U0001faf6\U0001fae0\U0001fae8\U0001f979 newer emoji",
]

COMBINING = [
    "e\u0301 vs \u00e9, a\u0308 vs \u00e4, n\u0303 vs \u00f1",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u0334\u0335\u031c\u0330\u0354\u036bL\u0334\u0335\u031c\u0330G\u0334\u0335O\u0334\u0335!",
    "\u1e9b\u0323 \u0041\u030a \u212b \u00c5",
    "\uff21\uff22\uff23 fullwidth \uff41\uff42\uff43 \uff11\uff12\uff13",
    "ligatures: \ufb01 \ufb02 \ufb00 \u0133",
    "\u0915\u094d\u0937 \u0924\u094d\u0930 \u091c\u094d\u091e conjuncts",
]

WHITESPACE = [
    " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\t\t\t", " \t \n \r ",
    "a" + " " * 17 + "b", "x" + " " * 100 + "y", "\n" * 40, "\t" * 33, " " * 65,
    "trailing spaces   ", "   leading spaces", "  both sides  ", " single leading", "single trailing ",
    "\u3000ideographic\u3000space\u3000", "\u00a0nbsp\u00a0", "thin\u2009space hair\u200aspace", "zero\u200bwidth\u200cnon\u200djoiner",
    "line\u2028separator\u2029paragraph", "\u000bvertical tab\u000cform feed", "\u0085next line",
    "mixed \t \n\t\n  \r\n\t end",
]

SPECIALS = ["<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<|im_sep|>",
            "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"]
MARKERS = ["<think>", "</think>", "<tool_response>", "</tool_response>", "<tools>", "</tools>", "<parameters>",
           "</parameters>", "<arguments>", "</arguments>", "<function", "</function>", "<param", "</param>"]

SPECIAL_CASES = [
    "<s>", "</s>", "<s>Hello", "Hello</s>", "<s> Hello </s>", "<s><s><s>", "a<s>b</s>c",
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n\u4f60\u597d<|im_end|>\n",
    "<|im_end|><|im_start|>", "x<|im_end|>y", " <|im_end|> ", "<|im_start|> user",
    "<tool_call>{\"a\": 1}</tool_call>", "<|fim_prefix|>def f():<|fim_suffix|>\n    return 1<|fim_middle|>",
    "<|im_sep|>", "<unk>", "text<unk>text", "<s>\n</s>", "\n<s>\n", "  <s>  ", "<s>  two spaces after",
    "<think>\nLet me think step by step.\n</think>\n\nThe answer is 42.",
    "<think></think>", "<think>\n\n</think>\n\n", "x<think>y</think>z", "<tool_response>ok</tool_response>",
    "<tools>[{\"name\": \"search\"}]</tools>", "<function=get_time><parameter=zone>UTC</parameter></function>",
    "<param name=\"x\">1</param>", "<parameters>{}</parameters><arguments>{}</arguments>",
    "<thinking> is not a marker", "<think >", "< think>", "<THINK>", "</think", "<think",
]

LOOKALIKES = [
    "<|im_start", "|im_start|>", "<|im_start|", "<|im_end|", "<|im_end", "im_end|>", "<s >", "< s>", "<S>",
    "<<s>>", "<s>>", "<</s>", "</s", "/s>", "<s", "s>", "<|IM_START|>", "<|im-start|>", "<| im_start |>",
    "<|im_start|x", "<tool_call", "tool_call>", "</tool_call", "<|fim_prefix", "<unk", "< unk >", "<|>", "<||>",
    "<|im_s<|im_start|>tart|>", "<s<s>>", "<|im_end|<|im_end|>>", "\u2581<s>", "\u2581\u2581", "\u2581",
    "<0x41>", "<0xE4><0xB8><0xAD>", "<0x0A>", "<0xZZ>", "<reserved_42>", "<SEP><CLS><img>",
]

RARE = [
    "\U00020000\U00020001\U0002a6d6",  # CJK extension B
    "\U00010000\U00010001 Linear B",
    "\U00012000\U00012001 cuneiform",
    "\U0001d518\U0001d52b\U0001d526\U0001d520\U0001d52c\U0001d521\U0001d522 math fraktur",
    "\U0001d11e \U0001d122 musical symbols",
    "\ue000\ue001\uf8ff private use",
    "\U000f0000\U0010fffd supplementary private use",
    "\ufeffBOM at start",
    "\ufffd replacement character \ufffd",
    "\u0000\u0001\u0002\u0007\u001b[31mred\u001b[0m\u007f",
    "\ufdd0\ufffe\uffff noncharacters",
    "\U0001f9ff\U0001fa90\U0001fac3",
    "\u2e80\u2f00\u31c0\u3400\u4dbf",
    "\U000e0041\U000e0042 tag characters",
    "\u0f00\u0f01 tibetan \u1800\u1801 mongolian",
    "\ua000\ua001 yi \u13a0\u13a1 cherokee",
]

# For tiny_tokenizer_flags.json (added tokens with lstrip/rstrip/single_word/normalized set).
FLAGS = [
    "hello world", "say hello world!", "helloworld", "hello", " hello ", "the other theme", "_the_", "\u00e9the",
    "the", "the the  the", "\u4e2dthe\u4e2d", "a\u4e2db", "\u4e2d\u6587", "\u4e2d", "x \u00e9 y", "x\u00e9y",
    "  <tools>  x  </tools>  ", "a</tools>b", "a </tools> b", "</tools>", "<think>   \n x </think>", "\n\n\n\n x",
    "ab abc cab ab", "x  y   z    w", "\t<tools>\u3000", "world world", "theworld", "1the2",
]


def long_lines(rng):
    en = " ".join(ENGLISH)
    zh = "".join(CHINESE)
    out = [
        (en + " ") * (20000 // len(en) + 1),
        (zh * (20000 // len(zh) + 1))[:20500],
        " " * 20000,
        "".join(rng.choice("0123456789") for _ in range(20000)),
        "".join(rng.choice(["\n", " ", "\t", "ab", "\u4e2d", "\U0001f600", "<s>", "x y"]) for _ in range(14000)),
        ("def f(x):\n    return x * 2\n\n" * 800),
    ]
    return [s for s in out if len(s) >= 20000]


def random_mix(rng, n):
    pools = [
        [chr(c) for c in range(0x20, 0x7F)],
        [" ", " ", " ", "\n", "\t", "\r\n", "  "],
        list("\u7684\u4e00\u662f\u4e0d\u4e86\u4eba\u6211\u5728\u6709\u4ed6\u8fd9\u4e2d\u5927\u6765\u4e0a\u56fd\u4e2a\u5230\u8bf4\u4eec"),
        list("\u3042\u3044\u3046\u3048\u304a\u30a2\u30a4\u30a6\u6f22\u5b57\uac00\ub098\ub2e4\ub77c"),
        ["\U0001f600", "\U0001f468\u200d\U0001f469\u200d\U0001f467", "\u2764\ufe0f", "\U0001f44d\U0001f3fd", "\U0001f1ef\U0001f1f5"],
        ["e\u0301", "\u0301", "\u200d", "\u00a0", "\u3000", "\ufeff"],
        SPECIALS + MARKERS,
        ["<", ">", "|", "/", "s", "<|", "|>", "</", "im_", "start", "end"],
        ["\U00020000", "\U0001d518", "\ue000", "\u0000", "\u001b", "\U0010fffd"],
        [w + " " for w in "the of and to in is that for it with as was on be at by this".split()],
    ]
    out = []
    for _ in range(n):
        length = rng.choice([1, 2, 3, 5, 8, 13, 21, 40, 80, 160])
        weights = [rng.random() for _ in pools]
        s = "".join(rng.choice(rng.choices(pools, weights)[0]) for _ in range(length))
        out.append(s)
    return out


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus.jsonl")
    rng = random.Random(20240601)
    lines = [""]
    for group in (ENGLISH, CHINESE, JAPANESE, KOREAN, OTHER_SCRIPTS, CODE, EMOJI, COMBINING, WHITESPACE,
                  SPECIAL_CASES, LOOKALIKES, RARE, FLAGS):
        lines += group
        # Variants: with leading/trailing spaces, newline-joined pairs, special tokens around.
        lines += [" " + s for s in group[:6]] + [s + " " for s in group[:6]]
        lines += [group[i] + "\n" + group[(i + 1) % len(group)] for i in range(min(5, len(group)))]
    lines += [a + b + c for a in ("", " ", "x", "\u4e2d", "\n") for b in SPECIALS for c in ("", " ", "y", "\n")]
    lines += [m + " " + m for m in MARKERS] + ["a" + m + "b" for m in MARKERS]
    lines += random_mix(rng, 600)
    lines += long_lines(rng)
    seen, unique = set(), []
    for s in lines:
        if s not in seen:
            seen.add(s)
            unique.append(s)
    with open(out_path, "w", encoding="utf-8") as f:
        for s in unique:
            f.write(json.dumps(s, ensure_ascii=False) + "\n")
    print(f"wrote {len(unique)} strings to {out_path}")


if __name__ == "__main__":
    main()
