"""Credentials never reach what a run shows or keeps: messages, logs, ``error.log``,
``config.yaml`` and reports. The bottom floor (standard library only), imported by any module.

A path or URL may carry a credential in three places, all of which pyarrow and HTTP clients
accept: user info (``s3://KEY:SECRET@bucket/...``, ``http://user:sk-...@host/v1``), a query
parameter (``?secret_key=...``, ``?X-Amz-Signature=...``) or a bare API key pasted somewhere
(``sk-...``, ``hf_...``). :func:`redact` masks them in one URI and keeps what a reader needs
(scheme, host, path, the other parameters); :func:`scrub` masks them in free text, together
with every literal secret the process was told of (:func:`remember`: the CLI registers the
credentials it finds in its arguments, its config and the environment), so a secret that a
library echoes in its own words (``InvalidAccessKeyId: AKIA...``) is masked as well.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

MASK = "***"
# Query parameters whose value is a credential (pyarrow's S3/GCS options, presigned URLs,
# API keys): any name with one of these words.
_SECRET_PARAM = re.compile(
    r"key|secret|token|passw|pwd|signature|credential|auth|sig$|^sig", re.IGNORECASE
)
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>()\[\]{},]+")
# API keys by their vendors' prefixes: OpenAI, Hugging Face, GitHub, AWS access key ids.
_BARE_KEY = re.compile(
    r"\b(?:sk-[A-Za-z0-9_\-]{16,}|hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{30,}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16})\b"
)
# Environment variables whose values are credentials wherever they appear.
SECRET_ENV = (
    "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID", "MIA_RAY_API_KEY",
    "OPENAI_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AZURE_STORAGE_ACCOUNT_KEY",
)  # fmt: skip
# Remembered literals are masked wherever they appear: a shorter one ("pass", "user") would
# mask ordinary words. (Inside a URL every credential is masked, whatever its length.)
_MIN_SECRET = 8
_MIN_KEY_ID = 12  # a user name beside a password counts as a key id (AWS's are 20) from here
_known: set[str] = set()


def split_userinfo(uri: str) -> tuple[str, str, str]:
    """``(uri without user info, user, password)``; user and password are "" when absent.

    The user info ends at the last ``@`` before the query, so a secret with ``/`` or ``@``
    in it (AWS secrets may hold ``/``) is still all user info, while an ``@`` in a path
    after a plain host (``s3://bucket/a@b``) is not."""
    s = str(uri)
    if "://" not in s:
        return s, "", ""
    scheme, rest = s.split("://", 1)
    head, sep, query = rest.partition("?")
    at = head.rfind("@")
    if at < 0:
        return s, "", ""
    info = head[:at]
    if "/" in info.split(":", 1)[0]:  # "bucket/a@b": the '@' is in the path
        return s, "", ""
    user, _, password = info.partition(":")
    return f"{scheme}://{head[at + 1 :]}{sep}{query}", user, password


def redact(uri: str) -> str:
    """``uri`` with its user info and credential parameters masked (``***``), for messages:
    ``s3://K:S@bucket/p?secret_key=S&region=x`` -> ``s3://***@bucket/p?secret_key=***&region=x``.
    A local path is returned unchanged."""
    s = str(uri)
    if "://" not in s:
        return s
    plain, user, password = split_userinfo(s)
    scheme, rest = plain.split("://", 1)
    if user or password:
        rest = f"{MASK}@{rest}"
    head, sep, query = rest.partition("?")
    if sep:
        params = []
        for param in query.split("&"):
            name, eq, _ = param.partition("=")
            params.append(f"{name}={MASK}" if eq and _SECRET_PARAM.search(name) else param)
        query = "&".join(params)
    return f"{scheme}://{head}{sep}{query}"


def credentials_in(uri: str) -> list[str]:
    """The literal secrets a URI carries: its user info's password, its user when it stands
    alone (``https://TOKEN@host``) or is as long as a key id, and credential parameters."""
    _, user, password = split_userinfo(str(uri))
    found = [password, user if not password or len(user) >= _MIN_KEY_ID else ""]
    query = str(uri).split("#", 1)[0].partition("?")[2]
    for param in query.split("&") if query else ():
        name, eq, value = param.partition("=")
        if eq and _SECRET_PARAM.search(name):
            found.append(value)
    return [f for f in found if f]


def remember(texts: Iterable[str], env: bool = True) -> None:
    """Mask from now on every credential found in ``texts`` (URIs or any strings holding
    them) and, with ``env``, the values of :data:`SECRET_ENV`."""
    for text in texts:
        for url in _URL.findall(str(text)):
            _known.update(c for c in credentials_in(url) if len(c) >= _MIN_SECRET)
    if env:
        _known.update(v for k in SECRET_ENV if len(v := os.environ.get(k, "")) >= _MIN_SECRET)


def forget() -> None:
    """Drop the remembered secrets (tests; a new command)."""
    _known.clear()


def scrub(text: str) -> str:
    """``text`` with every URL's credentials, every bare API key and every remembered secret
    masked."""
    s = _URL.sub(lambda m: redact(m.group(0)), str(text))
    s = _BARE_KEY.sub(MASK, s)
    for secret in sorted(_known, key=len, reverse=True):
        if secret in s:
            s = s.replace(secret, MASK)
    return s
