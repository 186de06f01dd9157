"""Credentials never reach an output: one redaction for URIs, free text and the run's files."""

from __future__ import annotations

import pytest

from mia_ray import redact
from mia_ray.redact import credentials_in, split_userinfo


@pytest.fixture(autouse=True)
def _fresh():
    redact.forget()
    yield
    redact.forget()


@pytest.mark.parametrize(
    "uri, shown",
    [
        ("s3://KEY:SECRET@bucket/docs/?endpoint_override=127.0.0.1:9000",
         "s3://***@bucket/docs/?endpoint_override=127.0.0.1:9000"),
        # an AWS secret may hold '/': the user info still ends at the last '@'
        ("s3://KEY:ab/cd+ef@bucket/docs", "s3://***@bucket/docs"),
        ("http://user:sk-abc@127.0.0.1:8000/v1", "http://***@127.0.0.1:8000/v1"),
        ("https://token@host/v1", "https://***@host/v1"),
        ("gs://b/p?access_token=T&retry_limit_seconds=5", "gs://b/p?access_token=***&retry_limit_seconds=5"),
        ("https://h/o?X-Amz-Signature=abc&X-Amz-Credential=K%2F1&x-id=GetObject",
         "https://h/o?X-Amz-Signature=***&X-Amz-Credential=***&x-id=GetObject"),
        ("s3://bucket/a@b/c", "s3://bucket/a@b/c"),  # an '@' in the path is no user info
        ("/local/path@x", "/local/path@x"),
    ],
)  # fmt: skip
def test_redact(uri, shown):
    assert redact.redact(uri) == shown


def test_split_userinfo_parses_the_host_right():
    assert split_userinfo("http://user:sk-1@127.0.0.1:9/v1?a=1") == (
        "http://127.0.0.1:9/v1?a=1",
        "user",
        "sk-1",
    )
    assert split_userinfo("http://127.0.0.1:9/v1") == ("http://127.0.0.1:9/v1", "", "")
    assert credentials_in("s3://AKIDEXAMPLE1234:SECRET@b/p?secret_key=S2S2&region=eu") == [
        "SECRET", "AKIDEXAMPLE1234", "S2S2"]  # fmt: skip
    # a short user name beside a password is a name; a user alone is a token
    assert credentials_in("http://user:pw@h/") == ["pw"]
    assert credentials_in("https://tok@h/") == ["tok"]


def test_scrub_masks_urls_bare_keys_and_every_remembered_secret(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "envsecret99")
    redact.remember(["--suspected", "s3://AKIDEXAMPLE1234:SUPERSECRET@bucket/x"])
    text = ("cannot read s3://AKIDEXAMPLE1234:SUPERSECRET@bucket/x: InvalidAccessKeyId AKIDEXAMPLE1234; "
            "the server said SUPERSECRET envsecret99; key sk-abcdefghijklmnop1234 hf_"
            "abcdefghijklmnopqrstuvwxyz AKIAABCDEFGHIJKLMNOP")  # fmt: skip
    assert redact.scrub(text) == (
        "cannot read s3://***@bucket/x: InvalidAccessKeyId ***; the server said *** ***; "
        "key *** *** ***"
    )
    # ordinary text passes unchanged: short values and user names are never remembered
    redact.remember(["http://user:pass@h/", "http://username:passwordlong@h/"])
    assert redact.scrub("a user passes, username") == "a user passes, username"
    assert redact.scrub("said passwordlong") == "said ***"


def test_report_writers_mask_what_they_write(tmp_path):
    from mia_ray.reports.io import read_json, write_json, write_text

    redact.remember(["s3://KEYID:SUPERSECRET@bucket/x"])
    write_json(tmp_path / "r.json", {"path": "s3://KEYID:SUPERSECRET@bucket/x", "n": 1})
    assert read_json(tmp_path / "r.json") == {"path": "s3://***@bucket/x", "n": 1}
    write_text(tmp_path / "c.yaml", "note: SUPERSECRET\n")
    assert (tmp_path / "c.yaml").read_text() == "note: ***\n"
