"""What bootstrap found per (profile, region), kept between launches."""

from __future__ import annotations

import json

from ... import config

CACHE_TTL_S = 24 * 3600  # how long a resolved AMI and the subnet list are reused


class RegionCache:
    """What bootstrap found per (profile, region), in $CLOUDTRAIN_HOME/aws-cache.json."""

    def __init__(self, profile: str, region: str):
        self.path = config.home() / "aws-cache.json"
        self.key = f"{profile or 'default'}|{region}"

    def _all(self) -> dict:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    def load(self) -> dict:
        return self._all().get(self.key, {})

    def save(self, entry: dict) -> None:
        data = self._all()
        data[self.key] = entry
        self._write(data)

    def clear(self) -> None:
        data = self._all()
        if data.pop(self.key, None) is not None:
            self._write(data)

    def _write(self, data: dict) -> None:
        # It holds the access key id: the user's alone (0600 under any umask).
        self.path.parent.mkdir(parents=True, exist_ok=True)
        config.write_private(self.path, json.dumps(data, indent=1))
