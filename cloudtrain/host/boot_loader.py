"""The first thing an Auto Scaling instance of a job runs: fetch the boot files, then bootstrap.

Standard library only, Python 3.8+. It travels inside the instance's user-data (with
stage_sigv4.py and stage_errors.py, the only modules it imports, by name, from its own folder),
so it is small: it fetches one object, `<job prefix>boot.tar` (bootstrap.py and every host
module beside it, uploaded by the launch before the group was made), with a GET signed by the
instance role's credentials (IMDSv2), checks its sha256 against the one the user-data names
(the launch computed it; nothing of the bucket is trusted), unpacks its plain files into its
folder and runs bootstrap.py there, in place of itself, with the arguments after `--`:

    python3 boot_loader.py --bucket B --key jobs/<owner>/<job>/boot.tar --sha256 HEX
                           --region R [--endpoint URL] [--imds URL] --dir DIR -- ARGS...

Every failure prints one line and exits with EXIT_BOOT; nothing is run from a tar whose sha256
does not match. A 403/404 (an upload not yet visible) or no answer is tried again for up to
FETCH_WAIT_S.
"""

import argparse
import datetime
import hashlib
import io
import os
import sys
import tarfile
import time
import urllib.error
import urllib.request

try:  # in the package (tests), or beside it on the instance
    from .stage_errors import StageError
    from .stage_sigv4 import RoleCredentials, object_url, sign_get
except ImportError:
    from stage_errors import StageError
    from stage_sigv4 import RoleCredentials, object_url, sign_get

EXIT_BOOT = 11
FETCH_WAIT_S = 300.0
RETRY_S = 3.0
TAR_MAX_BYTES = 8 << 20  # the host modules: about 0.5 MB
NAME_OK = set("abcdefghijklmnopqrstuvwxyz0123456789_.")


class BootError(Exception):
    """One line: why the boot files could not be had."""


def fetch(url, region, creds, wait_s=None):
    """The object's bytes (at most TAR_MAX_BYTES), tried again on 403, 404, 5xx or no answer
    until `wait_s` (None: FETCH_WAIT_S, read at the call) has passed."""
    wait_s = FETCH_WAIT_S if wait_s is None else wait_s
    deadline = time.time() + wait_s
    while True:
        try:
            now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
            req = urllib.request.Request(url, headers=sign_get(url, region, creds.get(), now))
            with urllib.request.urlopen(req, timeout=60) as resp:
                data = resp.read(TAR_MAX_BYTES + 1)
            if len(data) > TAR_MAX_BYTES:
                raise BootError("the boot files are larger than %d bytes" % TAR_MAX_BYTES)
            return data
        except urllib.error.HTTPError as exc:
            exc.close()
            why = "HTTP %d" % exc.code
            if exc.code not in (403, 404) and exc.code < 500:
                raise BootError("reading %s was refused (%s)" % (url, why)) from None
        except (OSError, StageError) as exc:
            why = str(exc) or type(exc).__name__
        if time.time() >= deadline:
            raise BootError("no boot files at %s after %.0f s (%s)" % (url, wait_s, why))
        time.sleep(RETRY_S)


def unpack(data, digest, folder):
    """Check the sha256, then write each member (a plain file with a plain name) into
    `folder`; the names written."""
    if hashlib.sha256(data).hexdigest() != digest:
        raise BootError("the boot files do not have the sha256 the user-data names: refused")
    names = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar.getmembers():
            if not member.isreg() or not member.name or not set(member.name) <= NAME_OK \
                    or member.name.startswith("."):
                raise BootError("the boot files hold %r: not a plain file" % member.name[:80])
            body = tar.extractfile(member).read()
            path = os.path.join(folder, member.name)
            tmp = path + ".tmp"
            with open(tmp, "wb") as f:
                f.write(body)
            os.replace(tmp, path)
            names.append(member.name)
    if "bootstrap.py" not in names:
        raise BootError("the boot files hold no bootstrap.py")
    return names


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="boot_loader.py", description=__doc__.split("\n")[0])
    for name in ("--bucket", "--key", "--sha256", "--region", "--dir"):
        parser.add_argument(name, required=True)
    parser.add_argument("--endpoint", default=None)
    parser.add_argument("--imds", default="http://169.254.169.254")
    args = parser.parse_args(argv)
    try:
        os.makedirs(args.dir, mode=0o700, exist_ok=True)
        creds = RoleCredentials(args.imds)
        data = fetch(object_url(args.bucket, args.key, args.region, args.endpoint),
                     args.region, creds)
        unpack(data, args.sha256, args.dir)
    except (BootError, StageError, OSError, tarfile.TarError) as exc:
        sys.stderr.write("boot_loader: %s\n" % " ".join(str(exc).split())[:500])
        return EXIT_BOOT
    script = os.path.join(args.dir, "bootstrap.py")
    os.execv(sys.executable, [sys.executable, script] + rest)
    return EXIT_BOOT  # not reached


if __name__ == "__main__":
    sys.exit(main())
