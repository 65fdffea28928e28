"""The job lifecycle, the same for every backend, one module per stage of a job's life:

    plan ─► launch (provision ─► sync ─► set up ─► start) ─► watch ─► collect ─► (stop)
                  ▲                                            │
                  └──────────── recovery (relaunch) ◄──────────┘ spot interruption

Every transition is an event row in the state store; that timeline is what `status` shows.
The lifecycle talks to hosts only through `Host` and to clouds only through a provider; it
never imports boto3 or paramiko. A job runs on a group.NodeGroup of 1..N hosts: a job on one
machine is a group of one, and each launch step is written once (launch.py).

Imports go one way only, down this list (inside functions too), with no cycle:

    recovery     relaunch decisions, the supervisor's round          (top)
    inspect      timeline, detail, logs, follow, attach/ssh lines
    stop         down, the orphans sweep, the clouds' cleanup
    launch       launch() and start_attempt(): the steps once over a NodeGroup
    plan         dry run, question, estimate, name and workdir checks
    sources      --on (a kept instance) and --resume-from
    abort        a launch that cannot finish, undone
    watch        refresh, probes, host lost, interrupted, launcher died
    kept         kept instances: what they bill, their power-off, the jobs queued there
    autoscaled   a job AWS Auto Scaling relaunches: its attempts from the job store
    collect      files home, finish, cost settled, nodes stopped
    scripts      the host's files: run.sh, setup, job.json, environment
    group        NodeGroup, and the hosts this process keeps open
    supervisor   the recovery supervisor process (its round is recovery's)
    attempts     the attempts ledger of a recovering job
    lease        the launch lease and the signals that end a launch
    secrets      a job's secret values                                (bottom)

Below the package: spec, recipes, estimate, the views, ledger, datasets, providers, hosts,
nodes, state, config and the host side. This file imports nothing, so that `cloudtrain
--help` and `status` import only the stages they use.
"""
