#!/usr/bin/env bash
# sala chat: scripted input through a pipe (answers equal `generate`, history carried between turns,
# `clear`, `quit`, EOF), and an interactive session on a pseudo-terminal where Ctrl-C stops a
# long answer without ending the session, and Ctrl-C at the prompt leaves.
source "$(dirname "$0")/common.sh"
PY=/usr/bin/python3

$SALA init "$tmp/m" --preset tiny --seed 1 >/dev/null
M=$tmp/m
O=(--temperature 0 --max-tokens 8)

# Through a pipe: two answers, the second after `clear`, so each equals a one-shot generate.
printf 'hello\nclear\nhi again\nquit\nnot read\n' | $SALA chat "$M" "${O[@]}" >"$tmp/pipe.out" 2>"$tmp/pipe.err" ||
  fail "chat through a pipe: $(cat "$tmp/pipe.err")"
$SALA generate "$M" hello "${O[@]}" --no-stream >"$tmp/g1.out" 2>/dev/null
$SALA generate "$M" "hi again" "${O[@]}" --no-stream >"$tmp/g2.out" 2>/dev/null
cat "$tmp/g1.out" "$tmp/g2.out" | cmp -s - "$tmp/pipe.out" || fail "chat answers differ from generate:
$(cat "$tmp/pipe.out")"
grep -q "^timings: " "$tmp/pipe.err" || fail "no timing summary"
grep -q "RANDOM weights" "$tmp/pipe.err" || fail "no random-weights notice"

# History: without `clear`, turn 2 sees turn 1; it equals generate --raw on the ChatML text of the
# whole conversation. EOF (no quit) ends the session normally.
printf 'hello\nhi again' | $SALA chat "$M" "${O[@]}" >"$tmp/hist.out" 2>/dev/null
$PY - "$tmp" >"$tmp/conv.txt" <<'EOF'
import sys
tmp = sys.argv[1]
a1 = open(f"{tmp}/g1.out", encoding="utf-8", newline="").read()[:-1]
sys.stdout.write("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n" + a1 +
                 "<|im_end|>\n<|im_start|>user\nhi again<|im_end|>\n<|im_start|>assistant\n")
EOF
$SALA generate "$M" - --raw "${O[@]}" --no-stream <"$tmp/conv.txt" >"$tmp/g3.out" 2>/dev/null
cat "$tmp/g1.out" "$tmp/g3.out" | cmp -s - "$tmp/hist.out" || fail "second turn does not continue the conversation"

# --system and --no-think are accepted; empty lines are ignored.
printf '\nhello\n\n' | $SALA chat "$M" "${O[@]}" --system "Be brief." --no-think >/dev/null 2>&1 || fail "--system/--no-think"

# A pseudo-terminal: prompt, answer, Ctrl-C during a long answer, next question, exit.
$PY - "$SALA" "$M" <<'EOF' || fail "interactive session on a pty"
import os, pty, select, signal, sys, time

sala, model = sys.argv[1], sys.argv[2]

def spawn(*extra):
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(sala, [sala, "chat", model, "--temperature", "0", *extra])
    return pid, fd

def read_until(fd, pred, what, timeout=30.0):
    buf, end = b"", time.time() + timeout
    while not pred(buf):
        left = end - time.time()
        if left <= 0:
            raise SystemExit(f"timeout waiting for {what}; got {buf[-400:]!r}")
        r, _, _ = select.select([fd], [], [], left)
        if r:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                chunk = b""
            if not chunk:
                raise SystemExit(f"session ended while waiting for {what}; got {buf[-400:]!r}")
            buf += chunk
    return buf

def wait_exit(pid, fd, timeout=30.0):
    end = time.time() + timeout
    while time.time() < end:
        r, _, _ = select.select([fd], [], [], 0.1)
        if r:
            try:
                os.read(fd, 4096)
            except OSError:
                pass
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
    os.kill(pid, signal.SIGKILL)
    raise SystemExit("session did not exit")

prompt = lambda b: b.endswith(b"> ")

# Session 1: a short answer, then a long one stopped with Ctrl-C, then another question, then exit.
pid, fd = spawn("--ignore-eos", "--max-tokens", "100000")
read_until(fd, prompt, "the first prompt")
os.write(fd, b"hello\n")
out = read_until(fd, lambda b: len(b) > 40, "the answer to stream")  # echo + some answer text
os.write(fd, b"\x03")  # Ctrl-C: the terminal sends SIGINT to the session
out = read_until(fd, lambda b: b"(answer stopped)" in b and prompt(b), "the stopped answer and a new prompt")
os.write(fd, b"hi again\n")
out = read_until(fd, lambda b: len(b) > 40, "the second answer")
os.write(fd, b"\x03")
read_until(fd, lambda b: b"(answer stopped)" in b and prompt(b), "the second stop")
os.write(fd, b"clear\n")
read_until(fd, lambda b: b"cleared" in b and prompt(b), "clear")
os.write(fd, b"exit\n")
status = wait_exit(pid, fd)
assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"exit status {status}"

# Session 2: Ctrl-C at the prompt leaves.
pid, fd = spawn("--max-tokens", "4")
read_until(fd, prompt, "the prompt")
os.write(fd, b"hello\n")
read_until(fd, lambda b: prompt(b) and len(b) > len(b"hello\r\n> "), "the answer and the next prompt")
os.write(fd, b"\x03")
status = wait_exit(pid, fd)
assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"exit status after Ctrl-C at the prompt: {status}"
EOF

# Errors.
if $SALA chat "$tmp/nope" </dev/null >/dev/null 2>"$tmp/e1"; then fail "missing model accepted"; fi
grep -q "not found" "$tmp/e1" || fail "missing-model message: $(cat "$tmp/e1")"
if $SALA chat "$M" --bogus </dev/null >/dev/null 2>"$tmp/e2"; then fail "unknown flag accepted"; fi
grep -q "bogus" "$tmp/e2" || fail "unknown-flag message: $(cat "$tmp/e2")"

echo "test_chat: OK"
