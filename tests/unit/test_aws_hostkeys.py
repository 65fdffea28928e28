"""Host key fingerprints as cloud-init prints them and as OpenSSH computes them (F5)."""

from __future__ import annotations

import subprocess

from cloudtrain.providers.aws.hostkeys import console_fingerprints, fingerprint, \
    fingerprint_window


def test_F5_fingerprint_is_what_ssh_keygen_prints(tmp_path):
    for kind in ("ed25519", "ecdsa", "rsa"):
        key = tmp_path / kind
        subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(key)], check=True)
        listed = subprocess.run(["ssh-keygen", "-l", "-f", f"{key}.pub"], capture_output=True,
                                text=True, check=True).stdout.split()[1]
        kind_and_blob = " ".join((tmp_path / f"{kind}.pub").read_text().split()[:2])
        assert fingerprint(kind_and_blob) == listed


A = "SHA256:" + "A" * 43
B = "SHA256:" + "b" * 42 + "+"
C = "SHA256:" + "c" * 42 + "/"


def test_F5_console_block_with_ec2_prefix_and_crlf():
    text = ("[  9.1] random line SHA256:" + "z" * 43 + "\r\n"
            "ec2: -----BEGIN SSH HOST KEY FINGERPRINTS-----\r\n"
            f"ec2: 256 {A} root@ip-172-31-7-9 (ECDSA)\r\n"
            f"ec2: 256 {B} root@ip-172-31-7-9 (ED25519)\r\n"
            "ec2: -----END SSH HOST KEY FINGERPRINTS-----\r\n"
            f"after the block {C}\r\n")
    assert console_fingerprints(text) == {A, B}  # only what is inside the block


def test_F5_bare_lines_and_a_second_boot_are_both_read():
    text = ("-----BEGIN SSH HOST KEY FINGERPRINTS-----\n"
            f"3072 {C} root@host (RSA)\n"
            "-----END SSH HOST KEY FINGERPRINTS-----\n"
            "-----BEGIN SSH HOST KEY FINGERPRINTS-----\n"
            f"256 {A} root@host (ED25519)\n"
            "-----END SSH HOST KEY FINGERPRINTS-----\n")
    assert console_fingerprints(text) == {A, C}


def test_F5_no_block_or_truncated_fingerprint_lists_nothing():
    assert console_fingerprints("Linux version 6.8\nkernel: ...\n") == set()
    text = ("-----BEGIN SSH HOST KEY FINGERPRINTS-----\n"
            f"256 {A[:-3]} root@host (ED25519)\n")  # the console was cut mid-line
    assert console_fingerprints(text) == set()


def test_F37_xen_types_wait_at_least_three_minutes_for_their_console():
    """Xen instances (p3, p2, g3, ...) have no `Latest` console: EC2 serves a snapshot that
    lags by minutes. Nitro ones wait at most 120 s (never longer than the SSH wait)."""
    assert fingerprint_window("g5.xlarge", 300.0, latest=True) == 120.0
    assert fingerprint_window("g5.xlarge", 5.0, latest=True) == 5.0
    for xen in ("p3.2xlarge", "p3.16xlarge", "p2.xlarge", "g3.4xlarge", "g3s.xlarge"):
        assert fingerprint_window(xen, 5.0, latest=True) >= 180.0, xen
    assert fingerprint_window("p3dn.24xlarge", 5.0, latest=True) == 5.0  # Nitro
    # a type not known as Xen whose console turns out to have no live buffer
    assert fingerprint_window("x9.large", 5.0, latest=False) >= 180.0
