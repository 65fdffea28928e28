"""What the instance's Python carries (providers/aws/host_setup.py): the probe's answer is
untrusted (it comes back from the instance), and the line says what the job will meet."""

from __future__ import annotations

import json
import subprocess
import sys

from hypothesis import given, strategies as st

from cloudtrain.providers.aws import host_setup
from cloudtrain.providers.aws.host_setup import SOFTWARE_PROBE, software_line


def test_RA4_the_line_says_torch_its_cuda_the_driver_and_a_torch_that_differs_from_here(
        monkeypatch):
    """RA4: the instance runs the image's torch, not the one tested here: the timeline says
    which (torch, the CUDA it was built for, the driver), and that it differs."""
    monkeypatch.setattr(host_setup, "local_torch", lambda: "2.14.1")
    line = software_line("/opt/pytorch/bin/python", json.dumps(
        {"torch": "2.9.1+cu130", "cuda": "13.0", "driver": "580.126.09"}))
    assert line == ("/opt/pytorch/bin/python: torch 2.9.1+cu130 built for CUDA 13.0; NVIDIA "
                    "driver 580.126.09 (this machine has torch 2.14.1: the recipes are tested "
                    "here on it)")
    same = software_line("python3", json.dumps({"torch": "2.14.0", "cuda": "12.6"}))
    assert same == "python3: torch 2.14.0 built for CUDA 12.6; no NVIDIA driver loaded"
    assert software_line("python3", json.dumps({"torch": "2.14.0", "cuda": None})) == \
        "python3: torch 2.14.0, a CPU build; no NVIDIA driver loaded"
    assert software_line("python3", "") == "python3: no torch; no NVIDIA driver loaded"


@given(st.one_of(st.text(max_size=300), st.dictionaries(
    st.sampled_from(["torch", "cuda", "driver", "x"]),
    st.one_of(st.text(max_size=60), st.integers(), st.none(), st.lists(st.text()))).map(
        json.dumps)))
def test_RA4_a_hostile_answer_never_reaches_the_line_unchecked(answer):
    """Whatever the instance prints, the line holds only fields of [0-9A-Za-z.+_-], one line,
    bounded; nothing raises."""
    line = software_line("python3", answer)
    assert "\n" not in line and len(line) < 400
    for part in ("torch ", "CUDA ", "driver "):
        if part in line:
            word = line.split(part, 1)[1].split()[0].rstrip(";,")
            assert host_setup.SOFTWARE_FIELD.fullmatch(word), line


def test_RA4_the_probe_reads_this_machines_torch_without_importing_it():
    """The probe runs on the standard library: torch's version and CUDA build from its files
    (an import would read the CUDA libraries off a lazily restored root volume)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", SOFTWARE_PROBE],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    found = json.loads(done.stdout)
    import importlib.metadata

    assert found["torch"] == importlib.metadata.version("torch")
    assert "| torch" not in done.stderr  # torch itself was never imported
