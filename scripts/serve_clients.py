"""Drives a running `transformer serve` with real LibreTranslate clients and prints what they
got, as one JSON object, for crates/cli/tests/serve.rs to compare with `mt translate`.

- libretranslatepy 2.1.4 (PyPI), unchanged: translate (one string, then each of the texts),
  languages, detect. Its translate() form-encodes q as text, so it sends one string per call.
- Mastodon's request, as its LibreTranslate translator sends it: JSON with q a list of HTML
  posts, source "auto", format "html", and an api_key field; it reads translatedText[i] and
  detectedLanguage[i]["language"].

Usage: python scripts/serve_clients.py URL --source de --target en TEXT [TEXT ...]
"""

import argparse
import json
import urllib.request

from libretranslatepy import LibreTranslateAPI


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--source", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("texts", nargs="+")
    a = ap.parse_args()
    lt = LibreTranslateAPI(a.url)
    out = {
        "translate_one": lt.translate(a.texts[0], a.source, a.target),
        "translate_each": [lt.translate(t, a.source, a.target) for t in a.texts],
        "languages": lt.languages(),
        "detect": lt.detect(a.texts[0]),
    }
    body = json.dumps(
        {
            "q": ["<p>%s</p>" % t for t in a.texts],
            "source": "auto",
            "target": a.target,
            "format": "html",
            "api_key": "",
        }
    ).encode()
    req = urllib.request.Request(
        a.url.rstrip("/") + "/translate",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        out["mastodon"] = json.loads(r.read().decode())
    print(json.dumps(out, ensure_ascii=False))


if __name__ == "__main__":
    main()
