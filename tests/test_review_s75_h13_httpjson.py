"""Review of session 75 (h13): a server URL with a space or control character in it (`http://a b:30000`)
is refused where it is read, in one line, as the other bad URLs are; urlsplit took it, and every request
to it then failed in http.client, retried as a server it "cannot reach"."""

from __future__ import annotations

import argparse

import pytest

from drafter_lab import httpjson
from drafter_lab.errors import LabError
from drafter_lab.spec.served import ServedConfig, check_settings

BAD = ["http://a b:30000", "http://a\tb:30000", "http://localhost:30000\n", "http://localhost:30000/v 1",
       "http://a\x00b:30000", "http://a\x7fb:30000", "http://a\u00a0b:30000", "http://a\u2028b:30000"]


@pytest.mark.parametrize("url", BAD)
def test_a_url_with_a_space_or_control_character_is_refused_in_one_line(url):
    """The tab is the sly one: urlsplit drops it, so the URL it parses looks whole."""
    said = f"expected a base URL like http://localhost:30000, got {url!r} (a space or control character in it)"
    assert httpjson.url_problem(url) == said
    with pytest.raises(argparse.ArgumentTypeError) as flag:
        httpjson.server_url(url)
    assert str(flag.value) == said
    with pytest.raises(LabError) as e:  # a library caller's settings, checked before any request
        check_settings(ServedConfig(url="http://localhost:30000", baseline_url=url))
    assert str(e.value) == f"{url}: {said}"


@pytest.mark.parametrize("url", ["http://localhost:30000", "https://[::1]:8443/v1", "http://gpu-box.internal/sglang",
                                 "http://b\u00fccher.example:30000"])
def test_a_url_with_no_space_is_still_taken(url):
    assert httpjson.url_problem(url) is None
    assert httpjson.server_url(url) == url
