"""A deterministic OpenAI-compatible chat server that plays scripts written in the user message.

It exists so the whole product, and its tests, run offline through the real openai SDK code path.
Standard library only and no Django import. Start it with `python -m scripted_model --port N`
(or `python manage.py scripted_model`), or in-process with `scripted_model.server.start_in_thread`.

Script lines (found in the latest user message, one model response per line):
    tool <name> <json object>     one tool call
    parallel / tool ... / end     several tool calls in one response
    say <text>                    the final answer; `{results}` expands to this turn's tool results
    sleep <ms>                    delay the next response
    error <http status> [<secs>]  fail the next response once (with Retry-After: secs when given);
                                  a retry of the same position succeeds
The script position is the number of assistant messages after the latest user message, so the
model advances one line each time the product has fed back the tool results of the previous one.
Without script lines it plays the built-in incident-investigation demo (`scripted_model.demo`).

Long sessions: `--context-window N` refuses a prompt estimated above N tokens (characters / 4:
roles, text, tool-call names and arguments; the same estimate agentops uses, and the one reported
as `usage.prompt_tokens`) with OpenAI's 400 `context_length_exceeded`. A request whose system
message carries `[[agentops:compaction]]` gets a deterministic JSON summary of its transcript;
its `script_position` (lines of the current turn that the summary folded away) keeps the script
position when a later request carries that summary after the latest user message. A request
marked `[[agentops:verification]]` gets deterministic verdicts: a numbered acceptance criterion is
met when its key (the text between backticks, else the whole criterion) occurs in the result.

Modules, by concern: `script` (parsing the lines above), `demo`, `planner` (reading the
conversation, choosing the reply), `protocol` (the OpenAI wire format), `server` (HTTP) and
`request_log` (what was answered, for tests to wait on instead of sleeping).
"""
