#!/usr/bin/env python3
"""Concurrency checks for `sala serve`, standard library only (used by tests/cli/test_server.sh).

  load_client.py URL consistency N    N greedy requests alone, then all at once: outputs must match
  load_client.py URL load C R         C clients x R streaming chat requests: no errors; prints p50/p99
  load_client.py URL sse PATH BODY    one streaming request: checks the SSE framing, prints the JSON
  load_client.py URL compare URL2 N   N concurrent greedy requests (prompts of different lengths) on each
                                      server: the outputs of URL2 (e.g. speculating) must equal URL's
Exit status 1 on any failure, with the reason on stderr.
"""
import http.client
import json
import sys
import threading
import time
import urllib.parse

TIMEOUT = 120


def connect(url):
    u = urllib.parse.urlparse(url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=TIMEOUT)


def post_json(url, path, body):
    c = connect(url)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        raise RuntimeError(f"{path}: HTTP {r.status}: {data[:300]!r}")
    return json.loads(data)


def post_sse(url, path, body):
    """Streams one request; returns (chunks, ttft seconds). Checks the framing line by line."""
    t0 = time.monotonic()
    c = connect(url)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"{path}: HTTP {r.status}: {r.read()[:300]!r}")
    ctype = r.getheader("Content-Type", "")
    if not ctype.startswith("text/event-stream"):
        raise RuntimeError(f"content type {ctype!r}")
    raw = r.read().decode("utf-8")
    c.close()
    ttft = None
    events = raw.split("\n\n")
    if events[-1] != "":
        raise RuntimeError(f"stream does not end with a blank line: {raw[-80:]!r}")
    events = events[:-1]
    chunks = []
    for i, ev in enumerate(events):
        if not ev.startswith("data: ") or "\n" in ev:
            raise RuntimeError(f"event {i} is not one 'data: ' line: {ev[:120]!r}")
        payload = ev[len("data: "):]
        if payload == "[DONE]":
            if i != len(events) - 1:
                raise RuntimeError("[DONE] is not the last event")
            break
        chunks.append(json.loads(payload))
    else:
        raise RuntimeError("no [DONE]")
    ttft = time.monotonic() - t0  # upper bound; the body is read at once
    return chunks, ttft


def stream_text(chunks):
    text, finish = "", None
    for ch in chunks:
        for choice in ch["choices"]:
            if "delta" in choice:
                text += choice["delta"].get("content") or ""
            else:
                text += choice.get("text") or ""
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    return text, finish


def consistency(url, n):
    prompts = [f"Request number {i}: tell me about the {['sea', 'sky', 'moon', 'rain'][i % 4]} {i * 7}" for i in range(n)]

    def run(i, stream):
        body = {"prompt": prompts[i], "max_tokens": 24, "temperature": 0, "ignore_eos": True, "stream": stream}
        if stream:
            return stream_text(post_sse(url, "/v1/completions", body)[0])
        d = post_json(url, "/v1/completions", body)
        return d["choices"][0]["text"], d["choices"][0]["finish_reason"]

    alone = [run(i, False) for i in range(n)]
    together = [None] * n
    errors = []
    barrier = threading.Barrier(n)

    def worker(i):
        try:
            barrier.wait()
            together[i] = run(i, i % 2 == 1)  # half of them streamed
        except Exception as e:  # noqa: BLE001
            errors.append(f"request {i}: {e}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    if errors:
        raise RuntimeError("; ".join(errors[:5]))
    bad = [i for i in range(n) if alone[i] != together[i]]
    if bad:
        i = bad[0]
        raise RuntimeError(f"{len(bad)}/{n} outputs differ under batching; e.g. #{i}: alone {alone[i]!r} vs together {together[i]!r}")
    print(f"consistency: {n} concurrent greedy requests match their solo outputs")


def run_concurrently(fn, n):
    """fn(i) for i in range(n), all started together; returns the results in order."""
    results, errors = [None] * n, []
    barrier = threading.Barrier(n)

    def worker(i):
        try:
            barrier.wait()
            results[i] = fn(i)
        except Exception as e:  # noqa: BLE001
            errors.append(f"request {i}: {e}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    if errors:
        raise RuntimeError("; ".join(errors[:5]))
    return results


def compare(url, url2, n):
    # Prompts from a few tokens to several hundred (longer ones prefill while others decode), some
    # repetitive (prompt lookup finds drafts), a repetition penalty on some, chat and completions.
    words = ["sea", "sky", "moon", "rain", "the", "and"]
    prompts = [" ".join(words[(i + j) % len(words)] for j in range(3 + 40 * (i % 4))) for i in range(n)]

    def body(i):
        b = {"max_tokens": 40 + 8 * (i % 3), "temperature": 0, "ignore_eos": True, "stream": i % 2 == 1}
        if i % 3 == 2:
            b["repetition_penalty"] = 1.2
        if i % 4 == 3:
            return "/v1/chat/completions", dict(b, messages=[{"role": "user", "content": prompts[i]}])
        return "/v1/completions", dict(b, prompt=prompts[i])

    def run(u):
        def one(i):
            path, b = body(i)
            if b["stream"]:
                return stream_text(post_sse(u, path, b)[0])
            d = post_json(u, path, b)
            ch = d["choices"][0]
            return (ch["message"]["content"] if "message" in ch else ch["text"]), ch["finish_reason"]
        return run_concurrently(one, n)

    a, b = run(url), run(url2)
    bad = [i for i in range(n) if a[i] != b[i]]
    if bad:
        i = bad[0]
        raise RuntimeError(f"{len(bad)}/{n} outputs differ; e.g. #{i}: {a[i]!r} vs {b[i]!r}")
    print(f"compare: {n} concurrent greedy requests give the same outputs on both servers")


def load(url, clients, per_client):
    latencies, ttfts, errors = [], [], []
    lock = threading.Lock()

    def client(c):
        for r in range(per_client):
            body = {"messages": [{"role": "user", "content": f"client {c} request {r}"}], "max_tokens": 16,
                    "temperature": 0.8, "seed": c * 1000 + r, "stream": True,
                    "stream_options": {"include_usage": True}}
            t0 = time.monotonic()
            try:
                chunks, _ = post_sse(url, "/v1/chat/completions", body)
                _, finish = stream_text(chunks)
                if finish not in ("stop", "length"):
                    raise RuntimeError(f"finish_reason {finish!r}")
                if not chunks or chunks[-1]["choices"] != [] or "usage" not in chunks[-1]:
                    raise RuntimeError("no usage chunk")
                with lock:
                    latencies.append(time.monotonic() - t0)
            except Exception as e:  # noqa: BLE001
                with lock:
                    errors.append(f"client {c} request {r}: {e}")

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT * 2)
    wall = time.monotonic() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} errors; first: {errors[0]}")
    latencies.sort()
    n = len(latencies)
    if n != clients * per_client:
        raise RuntimeError(f"only {n} of {clients * per_client} requests finished")
    p50 = latencies[n // 2]
    p99 = latencies[min(n - 1, int(n * 0.99))]
    print(f"load: {n} streaming requests from {clients} clients in {wall:.1f} s; "
          f"latency p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms")


def main():
    url, mode = sys.argv[1], sys.argv[2]
    try:
        if mode == "consistency":
            consistency(url, int(sys.argv[3]))
        elif mode == "load":
            load(url, int(sys.argv[3]), int(sys.argv[4]))
        elif mode == "compare":
            compare(url, sys.argv[3], int(sys.argv[4]))
        elif mode == "sse":
            chunks, _ = post_sse(url, sys.argv[3], json.loads(sys.argv[4]))
            print(json.dumps(chunks))
        else:
            raise SystemExit(f"unknown mode {mode}")
    except Exception as e:  # noqa: BLE001
        print(f"FAIL: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
