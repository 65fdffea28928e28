"""The labs the tests (and some benchmarks) build on: stand-ins for what cloudtrain talks to,
each real where it can be (a real sshd, real tmux, real network namespaces) and faked only at
the edges (moto for AWS). Imported as `labs.<module>` (tests/ is on sys.path: pytest's
rootdir-relative conftest, and the benchmarks put it there).

    credentials     the one fake AWS account: region, keys as environment and as boto3 kwargs
    loopback        free_port, and `serve`: a small HTTP server on loopback, in a thread
    polling         wait_for: poll a predicate until it holds or time runs out
    sshd            a throwaway real sshd (its own host key, one authorised client key)
    aws             moto's server + a VPC of loopback subnets + one sshd at every address they
                    hand out (`AWSLab`, fixtures `moto_endpoint`, `aws`, `ec2_provider`, ...);
                    `moto_server` and `AWSLab.serve_hosts`: moto on any address (the bridge)
                    and the sshd hosts its instances are
    netns           network namespaces as instances (root only; the e2e tests)
    cloud           a cloud of namespace instances: moto on the bridge, one sshd per host,
                    a fake IMDS, EC2's part in a spot reclaim (the e2e tests, benchmarks)
    imds            a fake instance metadata service (IMDSv2)
    pricing         a stand-in for the Price List Query API (fixture `price_list`)
    asg             moto's Auto Scaling groups made to behave as AWS's (instances boot as
                    namespace hosts and run their user-data, lost ones are replaced)
    group_nodes     a job on several nodes of a group as processes here (no root): the real
                    agents, regroup and bootstrap against moto, AWS's part and its faults
    moto_placement  placement groups, which moto lacks
    moto_quotas     EC2's Service Quotas, which moto lacks
    moto_spot_scores EC2's spot placement scores (GetSpotPlacementScores), which moto lacks
    moto_activities Auto Scaling's scaling activities, which moto does not keep
    moto_images     an image's root snapshot size, and EC2's refusal of a smaller root volume;
                    an image's architecture, boot mode and ENA, and EC2's refusal of an image
                    on a type it does not boot on
    moto_types      the Volta types moto lacks (p3.2xlarge, p3.8xlarge, p3.16xlarge)
    ubuntu_image    what a Volta instance's boot-time install reaches: Ubuntu's archive, the
                    kernel's modules, nvidia-smi, PyTorch's index (stand-ins)
    moto_templates  launch template versions kept as moto keeps a template's first one
    moto_regions    DescribeRegions: the enabled regions of the endpoint's partition
    terminal        the real `cloudtrain` on a pseudo-terminal
    iam             IAM's evaluation of identity policies and permissions boundaries (explicit
                    deny, default deny, conditions, policy variables), written from AWS's
                    documentation: what moto does not evaluate
"""
