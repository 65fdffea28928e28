"""The tags every cloudtrain resource carries, and the shared security group's name."""

TAG_JOB, TAG_OWNER, TAG_RECIPE = "cloudtrain:job", "cloudtrain:owner", "cloudtrain:recipe"
GROUP_NAME = "cloudtrain"
# Instance states that bill, or may again (a stopped instance keeps its volumes).
LIVE_STATES = ("pending", "running", "stopping", "stopped")
