#!/usr/bin/env python3
"""A stand-in for the Hugging Face hub, for tests of `sala models download` (stdlib only).

  mock_hub.py SOURCE_DIR PORT_FILE LOG_FILE

Every repository serves the files of SOURCE_DIR (a checkpoint). Behaviour by repository id:
  org/*           normal; *.safetensors are LFS files (sha256 in the API); the first GET of each
                  LFS file is cut off halfway (the client must resume with a Range request)
  org/badsum      the API gives a wrong sha256 for the LFS files
  org/redirect    no LFS info in the API; LFS files are served by a 302 to /blobs/<sha256> that
                  carries X-Linked-Etag (the sha256) and X-Linked-Size, like the real hub
  org/redirectbad as org/redirect, with a wrong X-Linked-Etag
  org/badsize     the API advertises config.json 5 bytes longer than the file served (no sha256
                  for it: only the size check can catch it)
  org/tagged      exists only at revision "v2" (commit COMMIT_V2); "main" is unknown
  private/*       401 unless "Authorization: Bearer hf_test"
  missing/*       404
Revisions are honoured: the API answers a repository's known revisions (its branch and its commit:
"main" and COMMIT; for org/tagged "v2" and COMMIT_V2) and 404s others, and files resolve only
under those. Requests are appended to LOG_FILE as "METHOD PATH RANGE". Binds 127.0.0.1 on a free port and
writes it to PORT_FILE.
"""
import hashlib
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

SOURCE, PORT_FILE, LOG_FILE = sys.argv[1], sys.argv[2], sys.argv[3]
FILES = sorted(f for f in os.listdir(SOURCE) if os.path.isfile(os.path.join(SOURCE, f)))
DATA = {f: open(os.path.join(SOURCE, f), "rb").read() for f in FILES}
SHA = {f: hashlib.sha256(d).hexdigest() for f, d in DATA.items()}
BY_SHA = {s: f for f, s in SHA.items()}
COMMIT = "0123456789abcdef0123456789abcdef01234567"
COMMIT_V2 = "fedcba9876543210fedcba9876543210fedcba98"
lock = threading.Lock()
seen = set()  # (repo, file) already cut off once


def is_lfs(name):
    return name.endswith(".safetensors")


def revisions(repo):
    """revision name or commit -> the commit it names."""
    if repo == "org/tagged":
        return {"v2": COMMIT_V2, COMMIT_V2: COMMIT_V2}
    return {"main": COMMIT, COMMIT: COMMIT}


class Hub(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body=b"", headers=None, ctype="application/json"):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def repo_check(self, repo):
        """An error reply for repositories that fail before any file; None when the repo is fine."""
        org = repo.split("/")[0]
        if org == "missing":
            return 404, b'{"error":"Repository not found"}'
        if org == "private" and self.headers.get("Authorization") != "Bearer hf_test":
            return 401, b'{"error":"Invalid credentials in Authorization header"}'
        return None

    def do_GET(self):
        url = urlparse(self.path)
        path = unquote(url.path)
        with open(LOG_FILE, "a") as log:
            log.write(f"GET {path} {self.headers.get('Range', '-')}\n")
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "revision":
            repo, rev = "/".join(parts[2:4]), "/".join(parts[5:])
            err = self.repo_check(repo)
            if err:
                return self.reply(*err)
            commit = revisions(repo).get(rev)
            if commit is None:
                return self.reply(404, b'{"error":"Invalid rev id"}', {"X-Error-Code": "RevisionNotFound"})
            siblings = []
            for f in FILES:
                s = {"rfilename": f, "size": len(DATA[f]) + (5 if repo == "org/badsize" and f == "config.json" else 0)}
                if is_lfs(f) and not repo.startswith("org/redirect"):
                    sha = "0" * 64 if repo == "org/badsum" else SHA[f]
                    s["lfs"] = {"sha256": sha, "size": len(DATA[f]), "pointerSize": 134}
                siblings.append(s)
            return self.reply(200, json.dumps({"id": repo, "sha": commit, "siblings": siblings}).encode())
        if parts[0] == "blobs" and len(parts) == 2 and parts[1] in BY_SHA:
            return self.send_file(DATA[BY_SHA[parts[1]]], cut=False)
        if len(parts) >= 5 and parts[2] == "resolve":
            repo, rev, name = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
            err = self.repo_check(repo)
            if err:
                return self.reply(*err)
            if rev not in revisions(repo):
                return self.reply(404, b'{"error":"Invalid rev id"}', {"X-Error-Code": "RevisionNotFound"})
            if name not in DATA:
                return self.reply(404, b'{"error":"Entry not found"}')
            if is_lfs(name) and repo.startswith("org/redirect"):
                etag = "f" * 64 if repo == "org/redirectbad" else SHA[name]
                return self.reply(302, b"", {"Location": f"/blobs/{SHA[name]}", "X-Linked-Etag": f'"{etag}"',
                                             "X-Linked-Size": str(len(DATA[name]))})
            cut = False
            if is_lfs(name):
                with lock:
                    cut = (repo, name) not in seen
                    seen.add((repo, name))
            return self.send_file(DATA[name], cut)
        return self.reply(404, b'{"error":"not found"}')

    def send_file(self, data, cut):
        start = 0
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[6:-1])
            if start >= len(data):
                return self.reply(416, b"")
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if cut:
            # Half the bytes, then the connection drops.
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.wfile.write(body)


server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
server.daemon_threads = True
with open(PORT_FILE + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.replace(PORT_FILE + ".tmp", PORT_FILE)
server.serve_forever()
