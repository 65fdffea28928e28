"""Launch template versions as EC2 keeps them, where moto does not:

    CreateLaunchTemplateVersion   moto stores the new version's UserData as the plain string
                                  it was sent, where CreateLaunchTemplate stores moto's own
                                  Base64EncodedString; reading it back (an Auto Scaling
                                  group's launch, DescribeLaunchTemplateVersions' decoding)
                                  then fails on moto's assertion. The version keeps it as the
                                  first version does, so a group launches from a version as
                                  AWS's does.

Installed with monkeypatch on moto's class (labs.aws.use_moto and the ec2_provider fixture
install it for every test), so it serves in-process `mock_aws()` and a ThreadedMotoServer
alike, and goes away at the test's end.
"""

from __future__ import annotations


class TemplateVersions:
    def install(self, monkeypatch) -> "TemplateVersions":
        from moto.core.types import Base64EncodedString
        from moto.ec2.models.launch_templates import LaunchTemplate

        own = LaunchTemplate.create_version

        def create_version(template, data, description):
            data = dict(data)
            if isinstance(data.get("UserData"), str):
                data["UserData"] = Base64EncodedString(data["UserData"])
            return own(template, data, description)

        monkeypatch.setattr(LaunchTemplate, "create_version", create_version)
        return self
