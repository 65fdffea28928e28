"""What a host says about a job, checked before anything else sees it.

Everything `probe_job` and `stop_job` bring back was written by the agent, the job or
whoever controls the host: status.json and metrics.jsonl live in the job's own directory, so
a training script (or an attacker on the instance) can put anything there. An audit saw
one string accuracy ("94.1%"), a NaN, a status.json that was a list or a deep nesting break
`cloudtrain status` for every job, for good. So the answer is parsed under guard and then
cut down to a schema: what fits is kept, anything else is dropped, never raised.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata

from typing import TypeGuard, overload

from .errors import HostError
from .host.job_status import ACTIVE, CANCELLED, FAILED, PREEMPTED, SUCCEEDED
from .host.job_status import as_pid as pid
from .host.job_status import as_time as finite
from .host.job_status import HIDDEN, clean_text  # noqa: F401 - HIDDEN: said from here too

AGENT_STATES = (*ACTIVE, SUCCEEDED, FAILED, CANCELLED, PREEMPTED)
MAX_ANSWER_BYTES = 4 << 20  # a probe answer is a few KB; more is not an agent talking
MAX_ROW_KEYS = 64
MAX_KEY_LEN = 64
MAX_TEXT_LEN = 200  # a string value in a metrics row
MAX_REASON_LEN = 500
INT64 = 1 << 63  # SQLite binds nothing wider
EXIT_CODES = range(-255, 1025)

# status.json fields the orchestrator uses, by kind; any other key is dropped.
PID_FIELDS = ("agent_pid", "pid", "pgid")
TIME_FIELDS = ("started_at", "ended_at", "heartbeat_at", "shutdown_requested_at")


def parse(data: bytes | str, host: str) -> object:
    """The JSON a host printed; any way it is not JSON is one HostError line."""
    if len(data) > MAX_ANSWER_BYTES:
        raise HostError(f"on {host}: the agent's answer is {len(data)} bytes, not a status "
                        "report")
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        return json.loads(text)
    except UnicodeDecodeError:
        raise HostError(f"on {host}: the agent's answer is not UTF-8") from None
    except RecursionError:
        raise HostError(f"on {host}: the agent's answer is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and ints past Python's digit limit
        first = text.strip().splitlines()[0][:80] if text.strip() else "(nothing)"
        raise HostError(f"on {host}: the agent did not answer with JSON "
                        f"({type(exc).__name__}): {clean_text(first, 80)}") from None


def probe_report(data: bytes | str, host: str) -> dict:
    """`agent.py probe`'s answer, parsed and cleaned (see `clean_report`)."""
    report = parse(data, host)
    if not isinstance(report, dict):
        raise HostError(f"on {host}: the agent's probe answer is a {type(report).__name__}, "
                        "not an object")
    return clean_report(report)


def stop_answer(data: bytes | str, host: str) -> dict | None:
    """`agent.py stop`'s answer: the final status (None when there was none)."""
    return clean_status(parse(data, host))


def clean_report(report: object) -> dict:
    report = report if isinstance(report, dict) else {}
    return {"status": clean_status(report.get("status")),
            "now": finite(report.get("now")),
            "metrics": clean_row(report.get("metrics")),
            "target": clean_row(report.get("target")),
            "runs": clean_row(report.get("runs")),
            "staging": clean_staging(report.get("staging")),
            "setup": clean_setup(report.get("setup"))}


SETUP_STATES = ("running", "done", "failed")


def clean_setup(value: object) -> dict | None:
    """run.sh's word on the job file's setup (setup-status.json): its state and times."""
    if not isinstance(value, dict) or value.get("state") not in SETUP_STATES:
        return None
    return {"state": value["state"], "started_at": finite(value.get("started_at")),
            "ended_at": finite(value.get("ended_at"))}


STAGING_STATES = ("staging", "staged", "failed")
DATASET_STATES = ("waiting", "staging", "staged", "skipped", "failed")
MAX_STAGED_DATASETS = 64


def clean_staging(value: object) -> dict | None:
    """The stager's status file (staging-status.json) as the orchestrator may use it."""
    if not isinstance(value, dict):
        return None
    state = value.get("state")
    error = value.get("error")
    rows = value.get("datasets")
    rows = rows if isinstance(rows, list) else []
    datasets = []
    for row in rows[:MAX_STAGED_DATASETS]:
        if not isinstance(row, dict):
            continue
        name, kind, st = row.get("name"), row.get("kind"), row.get("state")
        datasets.append({
            "name": clean_text(name, 64) if isinstance(name, str) else "?",
            "kind": clean_text(kind, 16) if isinstance(kind, str) else "?",
            "state": st if st in DATASET_STATES else None,
            **{k: _count(row.get(k)) for k in ("bytes_total", "bytes_done", "files_total",
                                                "files_done")},
            "mb_s": finite(row.get("mb_s")), "seconds": finite(row.get("seconds"))})
    out = {"state": state if state in STAGING_STATES else None,
           "started_at": finite(value.get("started_at")),
           "ended_at": finite(value.get("ended_at")),
           "error": clean_text(error, MAX_REASON_LEN) if isinstance(error, str) else None,
           "datasets": datasets}
    if "disk" in value:
        out["disk"] = _staging_disk(value.get("disk"))
    return out


def _staging_disk(disk: object) -> dict | None:
    """The stager's word on where the copies went ({local, path, note}: the local disk the
    plan named, or the root volume and why not), or None where it is not that."""
    if not isinstance(disk, dict) or not isinstance(disk.get("local"), bool) or \
            not isinstance(disk.get("path"), str):
        return None
    note = disk.get("note")
    if not disk["local"] and not isinstance(note, str):
        return None
    return {"local": disk["local"], "path": clean_text(disk["path"], 300),
            "note": clean_text(note, MAX_REASON_LEN) if isinstance(note, str) else None}


def clean_status(status: object) -> dict | None:
    """status.json as the orchestrator may use it: known state, positive pids, finite
    times, an exit code a process can have, a short one-line reason."""
    if not isinstance(status, dict):
        return None
    out: dict = {}
    state = status.get("state")
    out["state"] = state if isinstance(state, str) and state in AGENT_STATES else None
    for key in PID_FIELDS:
        out[key] = pid(status.get(key))
    for key in TIME_FIELDS:
        out[key] = finite(status.get(key))
    code = status.get("exit_code")
    out["exit_code"] = code if _is_int(code) and code in EXIT_CODES else None
    reason = status.get("reason")
    out["reason"] = clean_text(reason, MAX_REASON_LEN) if isinstance(reason, str) else None
    if "interruption" in status:
        out["interruption"] = clean_row(status.get("interruption"))
    if "results_stored" in status:
        out["results_stored"] = _results_stored(status.get("results_stored"))
    if "checkpoint_stream" in status:  # the last checkpoint upload to the job store
        out["checkpoint_stream"] = clean_row(status.get("checkpoint_stream"))
    return out


def _results_stored(value: object) -> dict | None:
    if not isinstance(value, dict):
        return None
    error = value.get("error")
    return {"at": finite(value.get("at")),
            "ok": value.get("ok") is True,
            "files": _count(value.get("files")),
            "bytes": _count(value.get("bytes")),
            "error": clean_text(error, MAX_REASON_LEN) if isinstance(error, str) else None}


@overload
def clean_row(row: dict) -> dict: ...
@overload
def clean_row(row: object) -> dict | None: ...
def clean_row(row: object) -> dict | None:
    """A metrics row (or an event row): a flat object of short str keys to finite numbers,
    bools and short strings; nested values, NaN, infinities and the rest are dropped."""
    if not isinstance(row, dict):
        return None
    out: dict = {}
    for key, value in row.items():
        if len(out) >= MAX_ROW_KEYS:
            break
        if not isinstance(key, str) or len(key) > MAX_KEY_LEN:
            continue
        key = clean_text(key, MAX_KEY_LEN)
        if not key:
            continue
        if isinstance(value, bool):
            out[key] = value
        elif _is_int(value):
            if -INT64 <= value < INT64:
                out[key] = value
        elif isinstance(value, float):
            if math.isfinite(value):
                out[key] = value
        elif isinstance(value, str):
            out[key] = clean_text(value, MAX_TEXT_LEN)
    return out




_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")  # all Cc but \t \n \r
_SGR = re.compile("\x1b\\[[0-9;:]{0,64}m")


class TerminalText:
    """A job's output (from the host or the job store), made safe for the user's terminal,
    chunk by chunk (`logs -f`): a sequence or a UTF-8 character split across chunks is
    handled whole. `logs` wrote a hostile log's escapes as they were: the window
    title (OSC 0/2), the clipboard (OSC 52), a cleared screen (CSI 2J).

    Kept: text, newline, carriage return, tab, and SGR colour sequences (`ESC [ params m`).
    Dropped: every other CSI sequence, OSC, DCS, APC, PM and SOS strings (up to their BEL or
    ST terminator, or to the end of the line, whichever comes first), other escape sequences,
    C0 controls and DEL, and C1 controls (their CSI and string introducers as the ESC forms).
    Bytes that are not UTF-8 come out as U+FFFD. For the bytes as they are: `logs --raw`."""

    GROUND, ESC, ESC_INTER, CSI, STRING, STRING_ESC = range(6)
    MAX_CSI = 64  # parameter characters; longer is not a colour
    C1_STRINGS = "\x90\x98\x9d\x9e\x9f"  # DCS, SOS, OSC, PM, APC

    def __init__(self):
        import codecs

        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._state, self._csi = self.GROUND, ""

    def feed(self, data: bytes) -> bytes:
        return self._filter(self._decoder.decode(data)).encode("utf-8")

    def flush(self) -> bytes:
        """What is left at the end (a UTF-8 character cut short); an open sequence is dropped."""
        out = self._filter(self._decoder.decode(b"", final=True))
        self._state, self._csi = self.GROUND, ""
        return out.encode("utf-8")

    def _filter(self, text: str) -> str:
        out, i, n = [], 0, len(text)
        while i < n:
            if self._state == self.GROUND:  # plain text goes through in runs
                found = _CONTROL.search(text, i)
                end = found.start() if found else n
                out.append(text[i:end])
                if end == n:
                    break
                colour = _SGR.match(text, end)  # whole in this chunk: kept as it is
                if colour:
                    out.append(colour.group())
                    i = colour.end()
                    continue
                i = end
            c: str | None = text[i]
            while c is not None:
                c = self._step(c, out)
            i += 1
        return "".join(out)

    def _step(self, c: str, out: list) -> str | None:
        """Consume `c`; returns it back when a sequence ended on it and it is to be read
        again in the ground state."""
        state, o = self._state, ord(c)
        if state == self.GROUND:
            if c == "\x1b":
                self._state = self.ESC
            elif c in "\n\r\t":
                out.append(c)
            elif c == "\x9b":
                self._state, self._csi = self.CSI, ""
            elif c in self.C1_STRINGS:
                self._state = self.STRING
            elif unicodedata.category(c) != "Cc":  # C0, DEL and C1 are Cc
                out.append(c)
        elif state == self.ESC:
            if c == "[":
                self._state, self._csi = self.CSI, ""
            elif c in "]P_^X":
                self._state = self.STRING
            elif 0x20 <= o <= 0x2F:
                self._state = self.ESC_INTER
            elif c != "\x1b":
                self._state = self.GROUND
                return None if 0x30 <= o <= 0x7E else c
        elif state == self.ESC_INTER:
            if not 0x20 <= o <= 0x2F:
                self._state = self.GROUND
                return None if 0x30 <= o <= 0x7E else c
        elif state == self.CSI:
            if 0x20 <= o <= 0x3F and len(self._csi) < self.MAX_CSI:
                self._csi += c
            else:
                self._state = self.GROUND
                if c == "m" and all(p in "0123456789;:" for p in self._csi):
                    out.append("\x1b[" + self._csi + "m")
                elif not 0x40 <= o <= 0x7E:
                    return c  # not a final byte: the sequence is cut off here
        elif state == self.STRING:
            if c == "\x1b":
                self._state = self.STRING_ESC
            elif c in "\x07\x9c":
                self._state = self.GROUND
            elif c == "\n":
                self._state = self.GROUND
                return c
        elif state == self.STRING_ESC:
            self._state = self.GROUND if c == "\\" else self.STRING
            if c == "\n":
                self._state = self.GROUND
                return c
        return None


def _count(value: object) -> int | None:
    return value if _is_int(value) and 0 <= value < INT64 else None


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
