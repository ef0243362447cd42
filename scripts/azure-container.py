#!/usr/bin/env python3
"""Creates a blob container on Azurite, signed with the emulator's published account and key.

usage: scripts/azure-container.py ENDPOINT CONTAINER   (ENDPOINT like http://127.0.0.1:10010)
Exit 0 when the container exists afterwards (201: created, 409: it was there already). Path-style
URLs, as object_store signs them: the canonical resource names the account twice."""
import base64, hashlib, hmac, sys, urllib.error, urllib.request
from email.utils import formatdate

ACCOUNT = "devstoreaccount1"
# Azurite's well-known development key (published in its README; not a secret).
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

def main():
    endpoint, container = sys.argv[1].rstrip("/"), sys.argv[2]
    path = f"/{ACCOUNT}/{container}"
    headers = {"x-ms-date": formatdate(usegmt=True), "x-ms-version": "2021-08-06"}
    canon_headers = "".join(f"{k}:{v}\n" for k, v in sorted(headers.items()))
    to_sign = "PUT\n" + "\n" * 11 + canon_headers + f"/{ACCOUNT}{path}\nrestype:container"
    sig = base64.b64encode(hmac.new(base64.b64decode(KEY), to_sign.encode(), hashlib.sha256).digest()).decode()
    req = urllib.request.Request(f"{endpoint}{path}?restype=container", method="PUT",
                                 headers={**headers, "Authorization": f"SharedKey {ACCOUNT}:{sig}",
                                          "Content-Length": "0"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            status = r.status
    except urllib.error.HTTPError as e:
        status = e.code
        if status != 409:
            print(f"azure-container: {status} {e.read()[:300]!r}", file=sys.stderr)
    except OSError as e:  # not listening yet, or gone: callers poll until it answers
        print(f"azure-container: {endpoint}: {getattr(e, 'reason', e)}", file=sys.stderr)
        sys.exit(1)
    sys.exit(0 if status in (201, 409) else 1)

main()
