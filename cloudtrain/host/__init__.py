"""The host side: what is shipped to the machine that runs a job and runs there (the modules:
ARCHITECTURE.md). Standard library only, Python 3.8+.

A host gets this folder as the package `<folder>/cloudtrain_host/` with a launcher per command
beside it (hosts.host_files): `python3 <folder>/agent.py ARGS` runs cloudtrain_host.agent as
its main module. So the modules import each other relatively, the same here and there, and
nothing else of cloudtrain (tests/unit/test_host_package.py checks). This file imports nothing.
"""

SHIPPED_AS = "cloudtrain_host"  # this package's name on a host (its folder there)
