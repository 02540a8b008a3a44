"""The redactor: the value and its base64 / hex / URL-quoted forms, inside larger encodings too,
and a value cut at the edge of a live-output batch."""

import base64
import subprocess

from tools_app.secret_refs import Redactor, references_in, substitute

VALUE = "tok-8f3a91c2d4e5b6a7"


def test_references_found_and_substituted() -> None:
    args = {"url": "https://x/{{secret:a}}", "headers": {"Authorization": "Bearer {{ secret:b.c }}"}}
    assert references_in(args) == ["a", "b.c"]
    assert substitute(args, {"a": "AAA", "b.c": "BBB"}) == {"url": "https://x/AAA",
                                                            "headers": {"Authorization": "Bearer BBB"}}


def test_redactor_replaces_every_form() -> None:
    redactor = Redactor({"api": VALUE})
    raw = VALUE.encode()
    samples = [VALUE, base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode().rstrip("="),
               raw.hex(), raw.hex().upper(), "tok-8f3a91c2d4e5b6a7".replace("-", "%2D")]
    for sample in samples[:5]:
        assert redactor.text(f"x {sample} y") == "x [secret:api] y", sample
    # `echo $TOKEN | base64` and `printf "user:$TOKEN" | base64`: the value inside a longer encoding
    for wrapped in (raw + b"\n", b"user:" + raw, b"ab" + raw + b"\n"):
        encoded = base64.b64encode(wrapped).decode()
        assert "[secret:api]" in redactor.text(encoded), wrapped
    real = subprocess.run(["/bin/sh", "-c", f"echo {VALUE} | base64"], capture_output=True, text=True).stdout
    assert "[secret:api]" in redactor.text(real)
    assert redactor.value({"k": [VALUE], VALUE: 1}) == {"k": ["[secret:api]"], "[secret:api]": 1}
    assert redactor.data(b"\xff\xfe" + raw) == b"\xff\xfe[secret:api]"


def test_redactor_edges_catch_a_value_cut_between_batches() -> None:
    redactor = Redactor({"api": VALUE})
    first, second = f"token={VALUE[:9]}", f"{VALUE[9:]} done"
    assert VALUE[:9] not in redactor.edges(first)
    assert VALUE[9:] not in redactor.edges(second)
    assert redactor.edges("plain text") == "plain text"


def test_empty_redactor_changes_nothing() -> None:
    redactor = Redactor({})
    assert not redactor and redactor.value({"a": "b"}) == {"a": "b"}
