"""The tags every cloudtrain resource carries, and the shared security group's name."""

TAG_JOB, TAG_OWNER, TAG_RECIPE = "cloudtrain:job", "cloudtrain:owner", "cloudtrain:recipe"
# Which attempt of a recovering job an instance runs (1 for the launch): a supervisor that
# was killed mid-relaunch finds the instance it had started instead of starting another.
TAG_ATTEMPT = "cloudtrain:attempt"
# The tag AWS Auto Scaling puts on each instance of a group: the aws: prefix is reserved, so
# no principal can write it (a record naming an instance is checked against it).
TAG_GROUP = "aws:autoscaling:groupName"
GROUP_NAME = "cloudtrain"
EFA_GROUP_NAME = "cloudtrain-efa"  # all traffic between its members: EFA's OS bypass needs it
# Instance states that bill, or may again (a stopped instance keeps its volumes).
LIVE_STATES = ("pending", "running", "stopping", "stopped")
